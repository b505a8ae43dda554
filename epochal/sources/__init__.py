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

from epochal.connectors import lazy_exports  # noqa: E402

# Connectors (epochal/connectors/) build on the names above, so they are loaded on first use:
# ``from epochal.sources import KafkaSource`` works without importing a client library.
_CONNECTORS = {
    "KafkaSource": "epochal.connectors.kafka.source",
    "KafkaRecord": "epochal.connectors.kafka.records",
    "DeltaSource": "epochal.connectors.delta.source",
}
__all__ += sorted(_CONNECTORS)

__getattr__ = lazy_exports(__name__, _CONNECTORS)
