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
