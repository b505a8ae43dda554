"""epochal: Flink-style exactly-once stream processing on Apache Spark.

Stateful streaming dataflows written in Python run as long-running Spark tasks and are
made fault tolerant by asynchronous epoch snapshots (Carbone et al.; see README).
"""
from epochal import columnar, coprocess, joins, sinks, sources, testing, time, windows
from epochal.config import ChannelConfig, CheckpointConfig, ClusterConfig, Guarantee, MetricsConfig, RestartStrategy
from epochal.dataflow import Dataflow, KeyedStream, Stream
from epochal.eventual.pipeline import Eventual
from epochal.errors import (CheckpointStorageError, ConfigError, EpochalError, JobFailedError, OperatorError,
                            PipelineDefinitionError, SavepointError)
from epochal.operators.base import DeadLetter
from epochal.coprocess import CoProcessFunction, KeyedCoProcessFunction
from epochal.operators.keyed import KeyedProcessFunction
from epochal.regions import Autonomous, Region
from epochal.ttl import StateTtl

__version__ = "0.2.0.dev0"

__all__ = [
    "ChannelConfig", "CheckpointConfig", "CoProcessFunction", "KeyedCoProcessFunction", "coprocess", "joins", "ClusterConfig", "CheckpointStorageError", "ConfigError", "Dataflow", "DeadLetter",
    "EpochalError", "Eventual",
    "Guarantee", "JobFailedError", "MetricsConfig", "KeyedProcessFunction", "KeyedStream", "OperatorError",
    "PipelineDefinitionError", "Autonomous", "Region", "RestartStrategy", "SavepointError", "StateTtl", "Stream", "columnar", "sinks", "sources", "state",
    "testing", "time", "windows", "warm_up",
]


def warm_up(runtime: str = "spark", *, timeout: float = 120.0) -> None:
    """Start the embedded Spark session and its Python workers now (``runtime="local"``: a
    spare task process), so that the first job's clock does not include them.

    Example:
        >>> import epochal as ep
        >>> ep.warm_up()          # doctest: +SKIP
    """
    from epochal.runtime.launch.warmup import warm_up as start

    start(runtime, timeout=timeout)


def __getattr__(name: str):
    """``epochal.state`` (offline state access, needs pyarrow) is imported on first use."""
    if name == "state":
        import importlib

        return importlib.import_module("epochal.state")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
