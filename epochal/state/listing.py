"""List what a checkpoint or savepoint holds besides keyed state: pending sink
transactions, loop logs, unaligned channel state and source offsets — and a summary of
all of it (:func:`describe`, what ``epochal checkpoints show`` prints).

Every function takes a URL (see :func:`epochal.state.open_checkpoint`) or an opened
:class:`~epochal.state.location.Checkpoint`, and returns plain lists of dicts, one per
task (or per transaction), ordered by operator and subtask.
"""
from __future__ import annotations

import hashlib
import json

from epochal.backends.storage import StateHandle
from epochal.loops.log import replay
from epochal.state.location import Checkpoint, open_checkpoint

__all__ = ["describe", "list_channel_state", "list_loop_logs", "list_sink_transactions", "list_source_offsets"]

_REPR = 200


def _open(url_or_checkpoint) -> Checkpoint:
    return url_or_checkpoint if isinstance(url_or_checkpoint, Checkpoint) else open_checkpoint(url_or_checkpoint)


def _by_subtask(ckpt: Checkpoint) -> list[str]:
    return sorted(ckpt.tasks, key=lambda t: (ckpt.tasks[t]["chain"][0], ckpt.tasks[t]["subtask"]))


def list_sink_transactions(url, operator: str | None = None) -> list[dict]:
    """Pre-committed transactions each two-phase-commit sink subtask recorded: ``operator``,
    ``task``, ``subtask``, ``epoch`` (the transaction's), ``handle`` (its repr, cut at 200
    characters). A restore re-commits them (idempotently): they are the epochs whose commit
    the checkpoint cannot know happened."""
    ckpt = _open(url)
    out = []
    for task in _by_subtask(ckpt):
        for name, st in sorted(ckpt.task_state(task)["operators"].items()):
            pending = getattr(st, "pending", None)
            if (operator is None or name == operator) and isinstance(pending, tuple):
                out += [{"operator": name, "task": task, "subtask": ckpt.tasks[task]["subtask"], "epoch": epoch,
                         "handle": repr(handle)[:_REPR]} for epoch, handle in pending]
    return out


def _log_row(ckpt: Checkpoint, desc: dict, records: bool) -> dict:
    row = {"records": desc.get("count", 0), "segments": len(desc.get("segments", ())),
           "bytes": desc.get("bytes", 0)}
    if records:
        row["items"] = [r for batch in replay([desc], ckpt.storage) for r in batch]
    return row


def list_loop_logs(url, operator: str | None = None, records: bool = False) -> list[dict]:
    """Each loop head subtask's in-transit log (the records that crossed the loop's
    feedback edge while the epoch's barrier went round; replayed first on restore):
    ``operator``, ``task``, ``subtask``, ``records``, ``segments`` (spilled files),
    ``bytes``, and with ``records=True`` the records as ``items``."""
    ckpt = _open(url)
    heads = {n for n, i in ckpt.operators.items() if i.get("kind") == "loop_head"}
    out = []
    for task in _by_subtask(ckpt):
        names = [n for n in ckpt.tasks[task]["chain"] if n in heads and (operator is None or n == operator)]
        desc = ckpt.task_state(task).get("loop") if names else None
        if desc is not None:
            out.append({"operator": names[0], "task": task, "subtask": ckpt.tasks[task]["subtask"],
                        **_log_row(ckpt, desc, records)})
    return out


def list_channel_state(url, records: bool = False) -> list[dict]:
    """The records in flight on each input channel at an unaligned cut (replayed before
    new input on restore): ``task``, ``channel``, ``producer``, ``consumer``, ``records``,
    ``segments``, ``bytes``, and with ``records=True`` the records as ``items``. Empty for
    aligned checkpoints."""
    from epochal.runtime.task.restore import edge_of

    ckpt = _open(url)
    out = []
    for task in _by_subtask(ckpt):
        for desc in ckpt.task_state(task).get("channels") or ():
            producer, consumer, _ = edge_of(desc["channel"])
            out.append({"task": task, "channel": desc["channel"], "producer": producer, "consumer": consumer,
                        **_log_row(ckpt, desc, records)})
    return out


def list_source_offsets(url, operator: str | None = None) -> list[dict]:
    """Each source subtask's read position (``offsets``: the source's own state, e.g.
    ``{split: offset}``): ``operator``, ``task``, ``subtask``, ``offsets``."""
    ckpt = _open(url)
    sources = {n for n, i in ckpt.operators.items() if i.get("kind") == "source"}
    out = []
    for task in _by_subtask(ckpt):
        head = ckpt.tasks[task]["chain"][0]
        if head in sources and (operator is None or head == operator):
            out.append({"operator": head, "task": task, "subtask": ckpt.tasks[task]["subtask"],
                        "offsets": ckpt.task_state(task).get("source")})
    return out


def plan_fingerprint(meta: dict) -> str:
    """A short hash of the plan's operators, kinds and parallelism (equal plans, equal hash)."""
    text = json.dumps([meta.get("plan") or {}, meta.get("max_parallelism")], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def describe(url) -> dict:
    """Everything ``epochal checkpoints show`` prints: what it is (kind, job, epoch,
    reason, time, generation, location), the plan fingerprint and ``max_parallelism``,
    per operator its kind, parallelism, tasks and the bytes of their state files
    (operators chained into one task share that task's files), the total bytes, pending
    sink transactions, loop logs and channel state."""
    ckpt = _open(url)
    sizes: dict[str, int] = {}
    for task, info in ckpt.tasks.items():
        own = {StateHandle.from_dict(info["handle"])} | {StateHandle.from_dict(h) for h in info.get("shared", ())}
        sizes[task] = sum(h.size for h in own)
    operators = []
    for name, op in ckpt.operators.items():
        tasks = ckpt.tasks_of(name)
        operators.append({"operator": name, "kind": op.get("kind"), "parallelism": op.get("parallelism"),
                          "tasks": len(tasks), "state_bytes": sum(sizes[t] for t in tasks),
                          "chained_with": sorted({n for t in tasks for n in ckpt.tasks[t]["chain"]} - {name})})
    files = ckpt.handles()
    return {
        "kind": ckpt.kind, "url": ckpt.url, "location": ckpt.location, "job": ckpt.meta.get("job"),
        "epoch": ckpt.epoch, "reason": ckpt.meta.get("reason"), "wall_time": ckpt.meta.get("wall_time"),
        "generation": ckpt.meta.get("generation"), "max_parallelism": ckpt.meta.get("max_parallelism"),
        "plan_fingerprint": plan_fingerprint(ckpt.meta), "files": len(files), "bytes": sum(h.size for h in files),
        "savepoint": {k: v for k, v in (ckpt.savepoint or {}).items() if k != "files"} or None,
        "operators": operators, "sink_transactions": list_sink_transactions(ckpt),
        "loop_logs": list_loop_logs(ckpt), "channel_state": list_channel_state(ckpt),
    }
