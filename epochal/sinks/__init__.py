"""Sinks: two-phase-commit writers published per epoch (seed 004 §4.1.3, Table 4.1)."""
from epochal.sinks.base import (
    Sink,
    SinkCommitError,
    SinkContext,
    SinkWriteError,
    SinkWriter,
    TransactionState,
    TransactionStateError,
    TwoPhaseCommitSink,
    TwoPhaseCommitState,
)
from epochal.sinks.files import FileSink, FileTransaction, read_committed

__all__ = [
    "FileSink",
    "FileTransaction",
    "Sink",
    "SinkCommitError",
    "SinkContext",
    "SinkWriteError",
    "SinkWriter",
    "TransactionState",
    "TransactionStateError",
    "TwoPhaseCommitSink",
    "TwoPhaseCommitState",
    "read_committed",
]

from epochal.sinks.log import LogSink, LogSinkWriter, LogTransaction, ProducerFencedError, TransactionalLog

__all__ += ["LogSink", "LogSinkWriter", "LogTransaction", "ProducerFencedError", "TransactionalLog"]

from epochal.connectors import lazy_exports  # noqa: E402

# Connectors (epochal/connectors/) build on the names above, so they are loaded on first use:
# ``from epochal.sinks import KafkaSink`` works without importing a client library.
_CONNECTORS = {
    "KafkaSink": "epochal.connectors.kafka.sink",
    "PostgresSink": "epochal.connectors.postgres.sink",
    "DeltaSink": "epochal.connectors.delta.sink",
    "IcebergSink": "epochal.connectors.iceberg.sink",
}
__all__ += sorted(_CONNECTORS)

__getattr__ = lazy_exports(__name__, _CONNECTORS)
