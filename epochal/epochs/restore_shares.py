"""Which old tasks of a checkpoint a new task restores from (issue 50): a pure function of
the physical plan and the checkpoint's ``_metadata``, used on both sides — by the driver,
which sends each task its share of the metadata, and by the task, which reads the state
files of exactly that share (:mod:`epochal.runtime.task.restore` says what it takes from
each)."""
from __future__ import annotations

from epochal.graph import NodeKind

#: node kinds whose operator state is shared by all subtasks and stored by one of them
#: (broadcast state, :class:`~epochal.broadcast.state.BroadcastSnapshot`)
SHARED_STATE_KINDS = frozenset({NodeKind.BROADCAST_PROCESS, NodeKind.KEYED_BROADCAST_PROCESS})


class OldTasks:
    """A checkpoint's old tasks (its ``_metadata``'s ``tasks``), indexed by operator: which
    of them a new task needs (:meth:`needed_by`). The one place that decides it — the task
    restores from what it returns (:func:`epochal.runtime.task.restore.load_restored_state`),
    and the driver sends each task only that share of the metadata in its ``start`` (not the
    whole of it to every task: quadratic bytes in the number of tasks)."""

    def __init__(self, old_tasks: dict):
        self.tasks = old_tasks
        self._holders: dict[str, dict[int, str]] = {}  # operator → old subtask → old task id
        self._parallelism: dict[str, int] = {}
        for tid, info in old_tasks.items():
            for name in info["chain"]:
                self._holders.setdefault(name, {})[info["subtask"]] = tid
                self._parallelism[name] = info["parallelism"]

    def needed_by(self, plan, spec) -> dict:
        """Old task id → its entry, for the old tasks whose state task ``spec`` may read
        (the rules of :mod:`epochal.runtime.task.restore`): per operator of its chain, at the same parallelism
        its own old subtask — every one for a source (offsets of moved splits) and for
        broadcast state (:data:`SHARED_STATE_KINDS`) —, a loop head's old subtasks ``k`` with
        ``k % parallelism == subtask``, and after a rescale every holder."""
        out: dict = {}
        for name in spec.chain:
            holders = self._holders.get(name)
            if not holders:
                continue  # a new operator: starts empty
            kind = plan.nodes[name].kind
            if kind is NodeKind.LOOP_HEAD:
                picked = [t for j, t in holders.items() if j % spec.parallelism == spec.subtask]
            elif (self._parallelism[name] == spec.parallelism and kind not in SHARED_STATE_KINDS
                  and not (spec.is_source and name == spec.chain[0])):
                picked = [holders[spec.subtask]] if spec.subtask in holders else []
            else:
                picked = list(holders.values())
            for t in picked:
                out[t] = self.tasks[t]
        return out

    def share(self, restore: dict, plan, spec) -> dict:
        """``restore`` with only the old tasks ``spec`` needs: what the driver sends it."""
        return {**restore, "tasks": self.needed_by(plan, spec)}
