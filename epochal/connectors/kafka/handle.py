"""The picklable handle of one epoch of a :class:`~epochal.connectors.kafka.sink.KafkaSink`
writer: part of every checkpoint that covers the epoch, until Kafka holds it."""
from __future__ import annotations

from dataclasses import dataclass, field

from epochal.connectors.kafka import wal


@dataclass
class KafkaTransaction:
    """Picklable handle of one epoch: its records (the write-ahead log) and who wrote it.

    ``wal`` holds ``(key, value, headers, timestamp_ms)`` as produced
    (:class:`~epochal.connectors.kafka.wal.WalSegment`); None in at-least-once mode, where
    nothing is replayed from a handle. ``records`` is where handles pickled before the
    segment kept them. ``subtask`` names the marker group the epoch commits to — the
    writing subtask's, kept through a rescale.
    """

    epoch: int
    subtask: int
    generation: int
    records: list = field(default_factory=list)
    slot: int | None = None  # the streaming producer, None: produced at commit (or not begun)
    count: int = 0
    lineage: str = ""  # the run that wrote it (epochal.epochs.lineage); "" before lineages
    wal: wal.WalSegment | None = None
    carried: tuple = ()  # handles of earlier epochs whose commit was in flight at this one's seal

    def rows(self):
        """Every record of the epoch, in the order produced (memory, then the spill file)."""
        segment = getattr(self, "wal", None)
        return iter(segment) if segment is not None else iter(self.records)

    @property
    def first_ts(self) -> int | None:
        segment = getattr(self, "wal", None)
        if segment is not None:
            return segment.first_ts
        return min((r[3] for r in self.records), default=None)

    @property
    def group(self) -> tuple[str, int]:
        """The marker group this epoch commits to: ``(lineage, subtask)`` of its writer."""
        return (getattr(self, "lineage", ""), self.subtask)  # handles pickled before lineages have none
