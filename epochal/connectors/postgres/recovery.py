"""The PostgreSQL sink's recovery decisions, as pure functions (no server, no clock).

Every epoch transaction of a sink subtask inserts one row ``(job, sink, target, lineage,
subtask, epoch)`` into the progress table, so the database itself says which epochs it
holds: an epoch is committed iff its row is visible (seed 004 §4.1.3.1: recovery asks the
external system). Rows name the run's lineage (:mod:`epochal.epochs.lineage`): a restored
epoch is looked up among the rows of the lineage that wrote it, so a rerun or a rollback
never takes another run's epoch 7 for its own. A pre-committed epoch is a *prepared
transaction* whose global id (:func:`gid`) names the sink, lineage, subtask, epoch and the
generation that prepared it; ``pg_prepared_xacts`` lists them.

* :func:`resolve` — what to do with a restored pending epoch: commit its prepared
  transaction, skip it (committed already), or report it lost (neither prepared nor
  committed: someone rolled it back by hand).
* :func:`orphans` — prepared transactions of this subtask (and of the subtasks it absorbed
  after a rescale) that no restored pending epoch owns: prepared by an attempt that was
  rolled back, or by a zombie of an older generation. They are rolled back; left alone
  they would hold their row locks and block VACUUM forever.
"""
from __future__ import annotations

import enum
import hashlib
import re
from dataclasses import dataclass

_GID = re.compile(r"^ep-([0-9a-f]{16})(?:-([0-9a-f]{12}))?-s(\d+)-e(\d+)-g(\d+)$")


class Action(enum.Enum):
    COMMIT = "commit"  # COMMIT PREPARED its gid
    SKIP = "skip"  # the database holds the epoch already
    LOST = "lost"  # neither prepared nor committed


def sink_hash(job: str, sink: str, table: str) -> str:
    """16 hex digits naming (job, sink, target table) inside gids (limited to 200 bytes)."""
    return hashlib.sha256(f"{job}\0{sink}\0{table}".encode()).hexdigest()[:16]


def gid(sink_id: str, subtask: int, epoch: int, generation: int, lineage: str = "") -> str:
    """The prepared transaction id of an epoch: unique per lineage and generation, so a
    zombie's transaction — or another run's — never has the id of this writer's."""
    return (f"ep-{sink_id}-{lineage}-s{subtask}-e{epoch}-g{generation}" if lineage
            else f"ep-{sink_id}-s{subtask}-e{epoch}-g{generation}")


@dataclass(frozen=True)
class Gid:
    sink_id: str
    subtask: int
    epoch: int
    generation: int
    lineage: str = ""


def parse_gid(text: str) -> Gid | None:
    """The parts of an epochal gid; None for any other prepared transaction (so only a
    parsed gid is ever interpolated into ``COMMIT/ROLLBACK PREPARED``)."""
    m = _GID.match(text)
    return None if m is None else Gid(m.group(1), int(m.group(3)), int(m.group(4)), int(m.group(5)), m.group(2) or "")


def resolve(epoch: int, subtask: int, txn_gid: str, committed: dict[int, int], prepared: set[str]) -> Action:
    """What to do with a restored pending epoch (prepared as ``txn_gid`` by ``subtask``).

    ``committed``: subtask → the highest epoch whose progress row is visible *in the lineage
    that wrote the epoch*; ``prepared``: the gids in ``pg_prepared_xacts``. A prepared gid wins over the progress row: a
    transaction is either prepared or ended, and if it ended committed its row is visible.
    """
    if txn_gid in prepared:
        return Action.COMMIT
    if epoch <= committed.get(subtask, 0):
        return Action.SKIP
    return Action.LOST


def mine(sink_id: str, subtask: int, parallelism: int, g: Gid) -> bool:
    """Is ``g`` of this sink and owned by new subtask ``subtask`` (its own, or an absorbed
    old subtask ``j >= parallelism`` with ``j % parallelism == subtask``)?"""
    return g.sink_id == sink_id and (g.subtask == subtask or (g.subtask >= parallelism
                                                              and g.subtask % parallelism == subtask))


def orphans(sink_id: str, subtask: int, parallelism: int, prepared: set[str], keep: set[str],
            generation_below: int | None = None) -> list[str]:
    """The prepared gids of this subtask to roll back: every one of :func:`mine` not in
    ``keep`` (the pending epochs the writer still owns), oldest epoch first; with
    ``generation_below``, only those older generations prepared (a writer's periodic sweep
    for zombies, which must never touch what its own uploader is preparing)."""
    found = []
    for text in prepared:
        g = parse_gid(text)
        if g is None or text in keep or not mine(sink_id, subtask, parallelism, g):
            continue
        if generation_below is None or g.generation < generation_below:
            found.append((g.epoch, g.generation, text))
    return [text for _, _, text in sorted(found)]
