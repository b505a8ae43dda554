"""Replayable sources: offsets snapshotted at every epoch barrier (seed 004 Alg. 5, §4.1.3.1)."""
from epochal.sources.base import Poll, Source, SourceReader
from epochal.sources.collection import CollectionSource, GeneratorSource
from epochal.sources.files import DirectorySource

__all__ = [
    "CollectionSource",
    "DirectorySource",
    "GeneratorSource",
    "Poll",
    "Source",
    "SourceReader",
]

from epochal.sources.log import (
    CommittedBatch,
    LogReader,
    LogSource,
    TransactionalLog,
    UnknownTopicError,
    read_committed_log,
)

__all__ += ["CommittedBatch", "LogReader", "LogSource", "TransactionalLog", "UnknownTopicError", "read_committed_log"]

# Connectors (epochal/connectors/) build on the names above, so they are loaded on first use:
# ``from epochal.sources import DeltaSource`` works without importing a client library.
_CONNECTORS = {
    "DeltaSource": "epochal.connectors.delta.source",
}
__all__ += sorted(_CONNECTORS)


def __getattr__(name: str):
    module = _CONNECTORS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = globals()[name] = getattr(importlib.import_module(module), name)
    return value
