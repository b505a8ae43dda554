"""Restoring a task from a completed checkpoint (seed 004 §4.1.3.1, "stop, reschedule and restore").

The checkpoint's ``_metadata`` lists every old task's state file with its chain and
subtask. A new task takes:

* each operator's own (non-keyed) state from the old task with the same subtask; after a
  rescale, the state's class redistributes it if it can (a ``rescale(states, subtask,
  parallelism)`` classmethod: two-phase-commit sinks hand old subtask ``j``'s pending
  transactions to new subtask ``j % parallelism``), else a clear error is raised;
* the keyed state blobs of every old task that ran one of its keyed operators (the
  backend keeps only its own key groups, seed 004 §4.2 — so keyed operators rescale);
* for a source, the offsets of every old subtask merged (they are keyed by split, and
  the reader keeps the entries of its own splits — so sources rescale too);
* for a loop head, the in-transit logs to replay before anything else (seed 004
  §4.1.3.1): its own subtask's log, or, after a rescale, old subtask ``k``'s log goes to
  new subtask ``k % parallelism`` (the head routes replayed records like any other, so
  any head subtask may replay any logged record).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from epochal.backends.storage import StateHandle
from epochal.errors import ConfigError
from epochal.graph import NodeKind
from epochal.runtime.snapshots import decode_task_state


@dataclass
class RestoredState:
    operators: dict = field(default_factory=dict)
    source: dict | None = None
    keyed: list = field(default_factory=list)
    loop_logs: list = field(default_factory=list)  # InTransitLog descriptors, replay order


def merge_offsets(states: list[dict]) -> dict | None:
    """Merge per-split source states of several old subtasks (dicts union, lists union)."""
    merged: dict = {}
    for state in states:
        if not state:
            continue
        for key, value in state.items():
            if isinstance(value, dict):
                merged[key] = {**merged.get(key, {}), **value}
            elif isinstance(value, list):
                seen = list(merged.get(key, []))
                seen.extend(v for v in value if v not in seen)
                merged[key] = seen
            else:
                merged[key] = value
    return merged or None


def load_restored_state(plan, spec, restore: dict | None, storage) -> RestoredState:
    """Read and assemble this task's share of the checkpoint ``restore`` (``None``: fresh)."""
    if restore is None:
        return RestoredState()
    old_tasks: dict = restore["tasks"]
    mine = set(spec.chain)
    relevant = {tid: t for tid, t in old_tasks.items() if mine & set(t["chain"])}
    blobs = {}
    for tid, info in relevant.items():
        blobs[tid] = decode_task_state(storage.read_state(StateHandle(**info["handle"])), f"state of {tid}")

    result = RestoredState()
    nodes = plan.nodes
    for name in spec.chain:
        holders = [tid for tid, t in relevant.items() if name in t["chain"]]
        if not holders:
            continue  # a new operator: starts empty
        old_p = relevant[holders[0]]["parallelism"]
        if nodes[name].kind is NodeKind.LOOP_HEAD:
            for t in sorted(holders, key=lambda t: relevant[t]["subtask"]):
                log = blobs[t].get("loop")
                if log and relevant[t]["subtask"] % spec.parallelism == spec.subtask:
                    result.loop_logs.append(log)
            continue
        if nodes[name].is_keyed:
            result.keyed.extend(blobs[t]["keyed"] for t in holders if blobs[t]["keyed"] is not None)
            continue
        if name == spec.chain[0] and spec.is_source:
            if old_p == spec.parallelism:
                own = [t for t in holders if relevant[t]["subtask"] == spec.subtask]
                result.source = blobs[own[0]]["source"] if own else None
            else:
                result.source = merge_offsets([blobs[t]["source"] for t in holders])
            continue
        states = {relevant[t]["subtask"]: blobs[t]["operators"].get(name) for t in holders}
        if old_p == spec.parallelism:
            if states.get(spec.subtask) is not None:
                result.operators[name] = states[spec.subtask]
        elif any(s is not None for s in states.values()):
            kinds = {type(s) for s in states.values() if s is not None}
            rescale = getattr(next(iter(kinds)), "rescale", None) if len(kinds) == 1 else None
            if rescale is None:
                raise ConfigError(
                    f"operator {name!r}: restoring epoch {restore['epoch']} with parallelism {spec.parallelism} "
                    f"but it was snapshotted with parallelism {old_p}, and its non-keyed state "
                    f"({', '.join(sorted(k.__name__ for k in kinds))}) cannot be redistributed; keep its "
                    "parallelism unchanged"
                )
            result.operators[name] = rescale(states, spec.subtask, spec.parallelism)
    # keyed blobs may appear twice if two keyed operators share a task: deduplicate by identity
    unique, seen = [], set()
    for b in result.keyed:
        if id(b) not in seen:
            seen.add(id(b))
            unique.append(b)
    result.keyed = unique
    return result
