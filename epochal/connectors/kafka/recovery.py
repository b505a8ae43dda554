"""The Kafka sink's recovery decisions, as pure functions (no broker, no clock).

Kafka tells a restarted sink which epochs it already holds through a **marker**: every
epoch's Kafka transaction also commits, with ``send_offsets_to_transaction``, the offset
``epoch`` for the consumer group :func:`marker_group` of the sink subtask that wrote it —
atomically with the epoch's records. The offset's metadata string (:class:`MarkerMeta`)
records which transactional ids that subtask's generation used, so the next generation
can fence exactly those (seed 004 §4.1.3.1: recovery asks the external system, it never
trusts local memory).

The decisions:

* :func:`fence_ids` — every transactional id an earlier generation may still hold a
  transaction on: they are fenced (``init_transactions``) before anything else, which
  aborts their open transactions (so read_committed readers are not held at the last
  stable offset until ``transaction.timeout.ms``) and makes a zombie's late commit fail.
* :func:`epochs_to_produce` — which restored pre-committed epochs are missing from Kafka
  and must be produced again from the checkpoint (the sink keeps each epoch's records in
  its transaction handle: a write-ahead log, because librdkafka cannot resume another
  producer's transaction).

Transactional ids are never reused across generations (:func:`transactional_id` includes
the generation): a fenced id is never written again, so no committed record of a new
generation ever follows an aborted transaction of the same producer id.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

#: the extra slot of each generation that produces epochs from the write-ahead log
REPLAY_SLOT = "r"


@dataclass(frozen=True)
class MarkerMeta:
    """Who wrote a marker: generation, sink parallelism and streaming producer slots."""

    generation: int
    parallelism: int
    slots: int

    def encode(self) -> str:
        return json.dumps({"g": self.generation, "p": self.parallelism, "n": self.slots}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> MarkerMeta | None:
        """The metadata of a marker offset; None for an empty or foreign string."""
        if not text:
            return None
        try:
            d = json.loads(text)
            return cls(int(d["g"]), int(d["p"]), int(d["n"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Marker:
    """What Kafka holds for one marker group: the highest committed epoch and its writer."""

    epoch: int
    meta: MarkerMeta | None


def marker_group(prefix: str, subtask: int) -> str:
    """The consumer group whose committed offset is sink subtask ``subtask``'s marker."""
    return f"{prefix}-{subtask}-epochs"


def transactional_id(prefix: str, subtask: int, generation: int, slot: int | str) -> str:
    """The transactional id of producer ``slot`` of ``subtask`` in ``generation``."""
    return f"{prefix}-{subtask}-g{generation}-{slot}"


def slots_of(meta: MarkerMeta) -> list:
    """Every producer slot a generation with this metadata may have used."""
    return list(range(meta.slots)) + [REPLAY_SLOT]


def absorbed_subtasks(subtask: int, parallelism: int, old_parallelism: int) -> list[int]:
    """Old subtasks whose transactions new subtask ``subtask`` takes over after a rescale
    from ``old_parallelism`` (``j % parallelism == subtask``, as
    :meth:`~epochal.sinks.transactions.TwoPhaseCommitState.rescale` hands them over)."""
    return [j for j in range(parallelism, old_parallelism) if j % parallelism == subtask]


def fence_ids(prefix: str, markers: dict[int, Marker | None], current_generation: int) -> list[str]:
    """Transactional ids to fence before a writer of ``current_generation`` touches Kafka.

    ``markers``: subtask → its marker (None: that subtask never registered, so it never
    produced). A marker names the last generation that registered the subtask; earlier
    generations were fenced by that one before it registered, and generations after it
    that did not register never produced. Ids of ``current_generation`` itself are never
    fenced (they are this writer's own).
    """
    ids = []
    for subtask in sorted(markers):
        m = markers[subtask]
        if m is None or m.meta is None or m.meta.generation >= current_generation:
            continue
        ids += [transactional_id(prefix, subtask, m.meta.generation, s) for s in slots_of(m.meta)]
    return ids


def epochs_to_produce(pending: list[tuple[int, int]], markers: dict[int, int]) -> list[tuple[int, int]]:
    """The ``(epoch, subtask)`` pairs of ``pending`` that Kafka does not hold yet, in epoch order.

    ``pending``: restored pre-committed transactions as ``(epoch, marker subtask)``;
    ``markers``: marker subtask → highest epoch committed to Kafka (absent: none). An epoch
    at or below its subtask's marker was committed (markers commit atomically with their
    epoch's records, in epoch order), so producing it again would duplicate it.
    """
    return sorted((e, s) for e, s in pending if e > markers.get(s, 0))
