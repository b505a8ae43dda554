"""Apache Iceberg: an exactly-once sink (one snapshot per epoch and subtask, the epoch in the
snapshot summary, pyiceberg's commit retries disabled).

Re-exported as :class:`epochal.sinks.IcebergSink`. The client, pyiceberg with its SQL
catalog (``pyiceberg[sql-sqlite]``), is the ``iceberg`` extra
(``pip install 'epochal[iceberg]'``); it is imported only when a job starts or a writer
opens the table.
"""
from epochal.connectors.iceberg.sink import IcebergSink, IcebergSinkWriter, IcebergTransaction

__all__ = ["IcebergSink", "IcebergSinkWriter", "IcebergTransaction"]
