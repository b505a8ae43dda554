"""What a job left open in external systems, and ending it safely (issue 36).

A job that crashed, was cancelled, or was abandoned without a resume can leave two-phase-commit
sinks' transactions open: a PostgreSQL prepared transaction holds its row locks and VACUUM's
horizon forever; a Kafka producer's open transaction holds ``read_committed`` readers at the
last stable offset until ``transaction.timeout.ms`` (15 minutes by default); a Delta or
Iceberg sink leaves parquet files staged for epochs that no table version references
(:mod:`epochal.connectors.leftovers`). Flink users know this as the lingering-transaction
problem, and Flink grew a separate tool for Kafka alone.

Here each sink answers two questions (:meth:`epochal.sinks.base.Sink.lingering` and
:meth:`~epochal.sinks.base.Sink.end_lingering`), given :class:`Promised`: what the job's
latest completed checkpoint still promises for that sink. A transaction the checkpoint
promises is **never** ended: a resume commits it (seed 004 §4.1.3.1). Everything else a
job's runs left open belongs to epochs no completed checkpoint holds, and may be ended.

:func:`find` and :func:`end` run the questions over every sink of a dataflow; the command
line is ``epochal sinks lingering <storage> <job> --dataflow path.py:flow [--abort]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Lingering:
    """One thing a sink's runs left open: ``what`` names it in the external ``system`` (a
    gid, a transactional id); ``promised``: the latest completed checkpoint still needs it
    (a resume commits it; never ended)."""

    sink: str
    system: str
    what: str
    promised: bool = False
    detail: str = ""


@dataclass(frozen=True)
class Promised:
    """What the job's latest completed checkpoint says about one sink: its ``epoch`` and
    ``lineage`` (None, "": no checkpoint), the sink's ``parallelism`` then, and every pending
    (pre-committed, maybe uncommitted) transaction handle it holds. ``lineages``: every
    lineage a completed checkpoint still in the storage names, the latest's included (runs
    whose leftovers a sink may look for)."""

    epoch: int | None = None
    lineage: str = ""
    parallelism: int = 1
    handles: tuple = field(default_factory=tuple)
    lineages: tuple = field(default_factory=tuple)


def promised_by(storage_url: str, job: str, sink: str, parallelism: int) -> Promised:
    """:class:`Promised` for ``sink`` from the newest completed checkpoint of ``job`` in
    ``storage_url`` (an empty one when there is none)."""
    from epochal.backends.storage import CheckpointStorage
    from epochal.epochs.lineage import lineage_of
    from epochal.state.location import open_checkpoint

    storage = CheckpointStorage(storage_url, job)
    if storage.latest_completed() is None:
        return Promised(parallelism=parallelism)
    lineages = set()
    for epoch in storage.completed_checkpoints():
        doc = storage.load_metadata(epoch)
        if doc is not None:
            lineages.add(lineage_of(doc["meta"]))
    point = open_checkpoint(storage.root_url)
    handles, width = [], 0
    for task, info in point.tasks.items():
        if sink not in info.get("chain", ()):
            continue
        width = max(width, int(info.get("parallelism", 1)))
        state = point.task_state(task).get("operators", {}).get(sink)
        for _, handle in getattr(state, "pending", ()) or ():
            handles.append(handle)
    lineages.add(lineage_of(point.meta))
    return Promised(point.epoch, lineage_of(point.meta), width or parallelism, tuple(handles), tuple(sorted(lineages)))


def find(flow, storage_url: str) -> list[Lingering]:
    """Everything the sinks of ``flow`` (its runs with checkpoints in ``storage_url``) left
    open, promised or not."""
    found: list[Lingering] = []
    for name, sink, parallelism in _sinks(flow):
        found += sink.lingering(flow.name, name, promised_by(_region_url(flow, name, storage_url), flow.name, name,
                                                             parallelism))
    return found


def end(flow, storage_url: str) -> list[Lingering]:
    """End what :func:`find` reports and no checkpoint promises; return what was ended."""
    ended: list[Lingering] = []
    for name, sink, parallelism in _sinks(flow):
        promised = promised_by(_region_url(flow, name, storage_url), flow.name, name, parallelism)
        items = [i for i in sink.lingering(flow.name, name, promised) if not i.promised]
        if items:
            sink.end_lingering(flow.name, name, items, promised)
            ended += items
    return ended


def _region_url(flow, sink: str, storage_url: str) -> str:
    """The checkpoint storage of the sink's region (a job of several regions keeps each
    region's checkpoints apart: :mod:`epochal.regions`)."""
    from epochal.regions.layout import storage_url_of

    return storage_url_of(flow, sink, storage_url)


def _sinks(flow):
    from epochal.graph import NodeKind

    plan = flow.plan()
    for node in plan.nodes.values():
        if node.kind is NodeKind.SINK:
            yield node.name, node.payload, node.parallelism
