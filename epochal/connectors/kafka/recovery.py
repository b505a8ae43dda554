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
* :func:`unregistered_ids` — the ids of later generations that may have died while
  registering (their open registration would hold a stable marker read back).
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

#: the header the first record of every epoch transaction carries (:func:`epoch_tag`)
TAG_HEADER = "epochal-epoch"


def epoch_tag(group: tuple[str, int], epoch: int) -> bytes:
    """Names an epoch transaction in the topic itself — the lineage and subtask that wrote
    it, and its epoch — so that recovery can still tell whether it was committed when its
    marker group is gone (expired while the job was down): the tag's record is visible to
    read_committed readers iff the epoch committed (transactions are atomic)."""
    lineage, subtask = group
    return f"{lineage}:{subtask}:{epoch}".encode()


@dataclass(frozen=True)
class MarkerMeta:
    """Who wrote a marker: the writer's generation, sink parallelism, streaming producer
    slots, lineage and subtask — everything its transactional ids are named by."""

    generation: int
    parallelism: int
    slots: int
    lineage: str = ""
    subtask: int | None = None  # None: the subtask of the group it was read from (older markers)

    def encode(self) -> str:
        d = {"g": self.generation, "p": self.parallelism, "n": self.slots}
        if self.lineage:
            d["l"] = self.lineage
        if self.subtask is not None:
            d["s"] = self.subtask
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None, subtask: int | None = None) -> MarkerMeta | None:
        """The metadata of a marker offset read from subtask ``subtask``'s group; None for an
        empty or foreign string."""
        if not text:
            return None
        try:
            d = json.loads(text)
            lineage = d.get("l", "")
            if not isinstance(lineage, str):
                return None
            return cls(int(d["g"]), int(d["p"]), int(d["n"]), lineage, int(d.get("s", subtask))
                       if d.get("s", subtask) is not None else None)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class Marker:
    """What Kafka holds for one marker group: the highest committed epoch and its writer."""

    epoch: int
    meta: MarkerMeta | None


def marker_group(prefix: str, subtask: int, lineage: str = "") -> str:
    """The consumer group whose committed offset is sink subtask ``subtask``'s marker in
    ``lineage`` (:mod:`epochal.epochs.lineage`; "" names the groups of older versions)."""
    return f"{prefix}-{lineage}-{subtask}-epochs" if lineage else f"{prefix}-{subtask}-epochs"


def transactional_id(prefix: str, subtask: int, generation: int, slot: int | str, lineage: str = "") -> str:
    """The transactional id of producer ``slot`` of ``subtask`` in ``generation`` of ``lineage``:
    never the same for two runs of a job (fresh checkpoint storage restarts generations at 0)."""
    return (f"{prefix}-{lineage}-{subtask}-g{generation}-{slot}" if lineage
            else f"{prefix}-{subtask}-g{generation}-{slot}")


def slots_of(meta: MarkerMeta) -> list:
    """Every producer slot a generation with this metadata may have used."""
    return list(range(meta.slots)) + [REPLAY_SLOT]


def absorbed_subtasks(subtask: int, parallelism: int, old_parallelism: int) -> list[int]:
    """Old subtasks whose transactions new subtask ``subtask`` takes over after a rescale
    from ``old_parallelism`` (``j % parallelism == subtask``, as
    :meth:`~epochal.sinks.transactions.TwoPhaseCommitState.rescale` hands them over)."""
    return [j for j in range(parallelism, old_parallelism) if j % parallelism == subtask]


def fence_ids(prefix: str, markers: dict, lineage: str, generation: int) -> list[str]:
    """Transactional ids to fence before the writer of ``generation`` in ``lineage`` reads a
    marker as final or touches Kafka.

    ``markers``: marker group → its marker (None: nobody ever registered there, so nobody
    produced for it). A marker's metadata names the last writer that registered there;
    earlier writers were fenced by that one before it registered, and writers after it that
    did not register never produced. The ids of this writer itself (its lineage, its
    generation or later) are never fenced.
    """
    ids: list[str] = []
    for group in sorted(markers, key=str):
        m = markers[group]
        if m is None or m.meta is None or m.meta.subtask is None:
            continue
        meta = m.meta
        if meta.lineage == lineage and meta.generation >= generation:
            continue
        for slot in slots_of(meta):
            txid = transactional_id(prefix, meta.subtask, meta.generation, slot, meta.lineage)
            if txid not in ids:
                ids.append(txid)
    return ids


def unregistered_ids(prefix: str, group: tuple[str, int], marker: Marker | None, lineage: str,
                     generation: int) -> list[str]:
    """Replay-slot ids of the generations of ``lineage`` between the writer ``marker`` names
    in ``group`` (or none) and ``generation``: writers that never registered there — named
    without reading them, because what they may hold cannot be read yet.

    A writer registers (a transaction of its replay slot that commits only the marker)
    before any other producer of it writes; one killed *while* registering leaves that
    transaction open, with the group's offsets in it, until ``transaction.timeout.ms``. A
    stable marker read waits for it all that time, and no marker names it, so it is fenced
    by name. Only ``group``s of ``lineage`` itself: another lineage's generations are not
    this run's to count.
    """
    if group[0] != lineage:
        return []
    meta = marker.meta if marker else None
    first = meta.generation + 1 if meta is not None and meta.lineage == lineage else 0
    return [transactional_id(prefix, group[1], g, REPLAY_SLOT, lineage) for g in range(first, generation)]


def epochs_to_produce(pending: list[tuple[int, object]], markers: dict) -> list[tuple[int, object]]:
    """The ``(epoch, group)`` pairs of ``pending`` that Kafka does not hold yet, in epoch order.

    ``pending``: restored pre-committed transactions as ``(epoch, marker group)``, the group
    being the ``(lineage, subtask)`` that wrote the epoch; ``markers``: group → highest epoch
    committed to Kafka (absent: none). An epoch at or below its group's marker was committed
    (markers commit atomically with their epoch's records, in epoch order), so producing it
    again would duplicate it. Markers of other lineages never answer for an epoch: another
    run's epoch 7 is not this one's.
    """
    return sorted(((e, g) for e, g in pending if e > markers.get(g, 0)), key=lambda p: (p[0], str(p[1])))
