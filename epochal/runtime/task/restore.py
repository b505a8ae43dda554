"""Restoring a task from a completed checkpoint (seed 004 §4.1.3.1, "stop, reschedule and restore").

The checkpoint's ``_metadata`` lists every old task's state file with its chain and
subtask. A task reads only the old state files it needs, each at most once: at the same
parallelism its own old subtask's (a source's offsets and broadcast state excepted: they
need every old subtask's); after a rescale every holder's, since their operator state is
redistributed. Reading every holder's file in every task at the same parallelism was
quadratic in the parallelism (a keyed operator at parallelism 1,000: a million reads at
each restart, which only a rescale still costs). A new task takes:

* state shared by all subtasks (broadcast state, stored by one subtask) from whichever old
  subtask stored it, at any parallelism (its class's ``rescale``);
* each operator's own (non-keyed) state from the old task with the same subtask; after a
  rescale, the state's class redistributes it if it can (a ``rescale(states, subtask,
  parallelism)`` classmethod: two-phase-commit sinks hand old subtask ``j``'s pending
  transactions to new subtask ``j % parallelism``), else a clear error is raised;
* the keyed state blobs of the old tasks that ran one of its keyed operators on key groups
  that meet its own (the backend keeps only its own key groups, seed 004 §4.2 — so keyed
  operators rescale);
* for a source, the offsets of every old subtask merged (they are keyed by split, and
  the reader keeps the entries of its own splits — so sources rescale too);
* for a loop head, the in-transit logs to replay before anything else (seed 004
  §4.1.3.1): its own subtask's log, or, after a rescale, old subtask ``k``'s log goes to
  new subtask ``k % parallelism`` (the head routes replayed records like any other, so
  any head subtask may replay any logged record);
* the channel state of an unaligned checkpoint — the records in flight on the task's
  input channels at the cut, replayed before new input: with the task's parallelism
  unchanged, its own subtask's; after a rescale, re-routed the way the channel's edge
  partitions records — by key group for a keyed (hash) edge (every new subtask reads
  every old subtask's state of that edge and keeps its key groups), old subtask ``j`` →
  new ``j % parallelism`` for forward and round-robin edges. In-flight records of a
  broadcast edge cannot be split between subtasks: such a rescale is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from epochal.backends.keygroups import key_group_for, key_group_range
from epochal.backends.storage import StateHandle
from epochal.errors import ConfigError
from epochal.graph import NodeKind, PartitionKind
from epochal.epochs.restore_shares import OldTasks
from epochal.runtime.task.snapshots import decode_task_state


@dataclass
class RestoredState:
    operators: dict = field(default_factory=dict)
    source: dict | None = None
    keyed: list = field(default_factory=list)
    loop_logs: list = field(default_factory=list)  # InTransitLog descriptors, replay order
    #: (log descriptor, keep) of unaligned channel state: ``keep(record)`` narrows a rescaled
    #: keyed edge's record to this task's key groups — the record, the rows of an Arrow
    #: batch that belong here, or None (``keep`` None: everything)
    channel_state: list = field(default_factory=list)


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
    # which old tasks (OldTasks decides: at the same parallelism its own old subtask, a
    # source's and broadcast state's every one); their files read when first needed
    relevant = OldTasks(restore["tasks"]).needed_by(plan, spec)
    blobs = _StateFiles(relevant, storage)

    result = RestoredState()
    nodes = plan.nodes
    for name in spec.chain:
        holders = [tid for tid, t in relevant.items() if name in t["chain"]]
        if not holders:
            continue  # a new operator: starts empty
        old_p = relevant[holders[0]]["parallelism"]
        if nodes[name].kind is NodeKind.LOOP_HEAD:
            for t in sorted(holders, key=lambda t: relevant[t]["subtask"]):
                if relevant[t]["subtask"] % spec.parallelism == spec.subtask and blobs[t].get("loop"):
                    result.loop_logs.append(blobs[t]["loop"])
            continue
        if nodes[name].is_keyed:
            result.keyed.extend(blobs[t]["keyed"] for t in holders
                                if _holds_key_groups(relevant[t], spec, plan.max_parallelism)
                                and blobs[t]["keyed"] is not None)
            if all(blobs[t]["operators"].get(name) is None for t in holders):
                continue  # keyed state only (a keyed broadcast operator also has operator state)
        if name == spec.chain[0] and spec.is_source:
            # every old subtask's offsets, also at the same parallelism: the reader takes the
            # entries of the splits it owns now, which may have moved (a topic that gained
            # partitions reorders the plan-time split list)
            result.source = merge_offsets([blobs[t]["source"] for t in holders])
            continue
        states = {relevant[t]["subtask"]: blobs[t]["operators"].get(name) for t in holders}
        shared = next((s for s in states.values() if getattr(s, "shared_by_all_subtasks", False)), None)
        if shared is not None:  # the same for every subtask, stored once (broadcast state)
            result.operators[name] = type(shared).rescale(states, spec.subtask, spec.parallelism)
        elif old_p == spec.parallelism:
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
    result.channel_state = _channel_state(plan, spec, relevant, blobs, restore["epoch"])
    # keyed blobs may appear twice if two keyed operators share a task: deduplicate by identity
    unique, seen = [], set()
    for b in result.keyed:
        if id(b) not in seen:
            seen.add(id(b))
            unique.append(b)
    result.keyed = unique
    return result


class _StateFiles(dict):
    """Old task id → its decoded state file, read from storage on first access (each at most once)."""

    def __init__(self, relevant: dict, storage):
        super().__init__()
        self.relevant, self.storage = relevant, storage

    def __missing__(self, tid: str) -> dict:
        info = self.relevant[tid]
        blob = decode_task_state(self.storage.read_state(StateHandle(**info["handle"])), f"state of {tid}")
        self[tid] = blob
        return blob


def _holds_key_groups(info: dict, spec, max_parallelism: int) -> bool:
    """Whether old task ``info``'s key groups (its subtask's range at its parallelism) meet
    this task's: only those keyed blobs hold keys the new backend keeps."""
    old = key_group_range(info["subtask"], info["parallelism"], max_parallelism)
    return old.start < spec.key_groups.stop and spec.key_groups.start < old.stop


def edge_of(channel_id: str) -> tuple[str, str, int]:
    """``(producer, consumer, input index)`` of a channel id ``"<producer>><consumer>.<i>:<up>><down>"``
    (see :func:`epochal.plan.compile_plan`; operator names contain no ``>`` or ``:``)."""
    producer, rest = channel_id.split(">", 1)
    consumer_input = rest.split(":", 1)[0]
    consumer, index = consumer_input.rsplit(".", 1)
    return producer, consumer, int(index)


def _channel_state(plan, spec, relevant: dict, blobs: dict, epoch: int) -> list:
    """This task's share of the unaligned channel state of the old tasks (see the module
    docstring): ``[(descriptor, keep or None)]`` in replay order."""
    head = spec.chain[0]
    old = [(tid, d) for tid, info in relevant.items() if info["chain"][0] == head
           and (info["parallelism"] != spec.parallelism or info["subtask"] == spec.subtask)  # else not ours
           for d in blobs[tid].get("channels") or () if d.get("count")]
    if not old:
        return []
    out = []
    for tid, desc in sorted(old, key=lambda item: (relevant[item[0]]["subtask"], item[1]["channel"])):
        info = relevant[tid]
        j, old_p = info["subtask"], info["parallelism"]
        producer, consumer, index = edge_of(desc["channel"])
        if consumer != head:
            raise ConfigError(f"operator {consumer!r}: checkpoint {epoch} holds records in flight into it, but it now "
                              f"runs chained behind another operator; restore with the chain of the checkpoint")
        if old_p == spec.parallelism:
            if j == spec.subtask:
                out.append((desc, None))
            continue
        kind = plan.nodes[consumer].inputs[index].partitioning
        if kind.kind is PartitionKind.HASH:
            mine = key_group_range(spec.subtask, spec.parallelism, plan.max_parallelism)
            out.append((desc, _key_filter(kind.key_fn, mine, plan.max_parallelism)))
        elif kind.kind is PartitionKind.BROADCAST:
            raise ConfigError(
                f"operator {consumer!r}: checkpoint {epoch} (unaligned) holds {desc['count']} broadcast records in "
                f"flight into parallelism {old_p}, which cannot be redistributed to parallelism {spec.parallelism}; "
                "restore it with the same parallelism, or take an aligned checkpoint first")
        elif j % spec.parallelism == spec.subtask:
            out.append((desc, None))
    return out


def _key_filter(key_fn, key_groups: range, max_parallelism: int):
    from epochal.columnar.keys import ColumnKey, KeyGroups

    if isinstance(key_fn, ColumnKey):  # a channel of Arrow batches: keep the rows of my key groups
        import pyarrow.compute as pc

        groups = KeyGroups(key_fn.column, max_parallelism)

        def keep_rows(batch):
            kgs = groups.of(batch)
            mask = pc.and_(pc.greater_equal(kgs, key_groups.start), pc.less(kgs, key_groups.stop))
            part = batch.filter(mask)
            return part if part.num_rows else None
        return keep_rows

    def keep(record):
        return record if key_group_for(key_fn(record), max_parallelism) in key_groups else None
    return keep
