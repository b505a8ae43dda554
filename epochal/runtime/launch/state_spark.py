"""The Spark side of :func:`epochal.state.read_spark`: a checkpoint's keyed state as a
Spark DataFrame (pyspark is imported only under ``epochal/runtime/``).

The state is read on the driver (:func:`epochal.state.read`) and handed to Spark as one
Arrow table — fit for inspecting state, not for state larger than the driver's memory.
"""
from __future__ import annotations

__all__ = ["read_spark"]


def read_spark(spark, url, operator: str, **options):
    """``epochal.state.read(url, operator, **options)`` as a DataFrame of ``spark``."""
    from epochal.state.reader import read

    table = read(url, operator, **options)
    try:
        return spark.createDataFrame(table)  # Spark >= 4.0 takes a pyarrow.Table
    except TypeError:  # older Spark: through pandas
        return spark.createDataFrame(table.to_pandas())
