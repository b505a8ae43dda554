"""Is a checkpoint restorable into a (possibly changed) dataflow? Checked, not trusted.

Operator names are the identity of state (DESIGN.md "Restores are checked, not trusted";
Flink's model). Every operator of the checkpoint that can hold state — sources (offsets),
keyed operators (keyed state), sinks (pending two-phase-commit transactions), loop heads
(in-transit logs) — must map to an operator of the new plan with the same name and kind,
and a checkpoint with keyed state must have as many key groups (``max_parallelism``) as
the new plan: keys are hashed into key groups, so another count scatters every key's
state. Changed parallelism is fine (key groups, sources, sinks and loops rescale).

:func:`check_restore` is pure (a plan and a checkpoint's ``_metadata`` in, the problems
out) and used before every restore that the driver makes: ``resume=True``, every restart,
a ``restore_from`` savepoint. Without ``allow_non_restored_state`` any problem fails the
job before a task starts — before anything (a sink's orphan clean-up, say) could touch the
checkpoint's data. With it, state of operators that are gone is dropped deliberately (and
logged); a changed kind or key-group count is never allowed: the state would be misread.
"""
from __future__ import annotations

from dataclasses import dataclass

from epochal.errors import ConfigError
from epochal import graph
from epochal.graph import NodeKind

#: operator kinds whose instances may hold state in a checkpoint
STATEFUL_KINDS = frozenset({NodeKind.SOURCE.value, NodeKind.REDUCE.value, NodeKind.PROCESS.value,
                            NodeKind.SINK.value, NodeKind.LOOP_HEAD.value, NodeKind.WINDOW.value,
                            NodeKind.WATERMARKS.value, NodeKind.AGGREGATE.value,
                            NodeKind.BROADCAST_PROCESS.value, NodeKind.KEYED_BROADCAST_PROCESS.value,
                            NodeKind.KEYED_CO_PROCESS.value})
#: kinds whose state is keyed (needs the same key-group count)
KEYED_KINDS = frozenset(k.value for k in graph.KEYED_KINDS)

_WHAT = {"source": "source offsets", "reduce": "keyed state", "process": "keyed state and timers",
         "window": "window contents and timers", "watermarks": "a watermark position",
         "aggregate": "keyed aggregates", "broadcast_process": "broadcast state",
         "keyed_broadcast_process": "keyed and broadcast state",
         "keyed_co_process": "keyed state and timers (two inputs, joins)",
         "sink": "sink transactions", "loop_head": "a loop's in-transit log"}


@dataclass(frozen=True)
class Problem:
    """One piece of checkpointed state the new plan cannot take. ``droppable``: it may be
    left behind with ``allow_non_restored_state=True`` (its operator is gone)."""

    operator: str
    message: str
    droppable: bool


def check_restore(plan, meta: dict) -> list[Problem]:
    """The problems of restoring checkpoint ``meta`` (its ``_metadata``) into ``plan``."""
    epoch = meta.get("epoch")
    old = meta.get("plan") or {}
    problems = []
    keyed = [n for n, info in old.items() if info.get("kind") in KEYED_KINDS]
    old_maxp = meta.get("max_parallelism")
    if keyed and old_maxp is not None and old_maxp != plan.max_parallelism:
        problems.append(Problem(
            "", f"the checkpoint's keyed state ({', '.join(map(repr, sorted(keyed)))}) is split into {old_maxp} key "
                f"groups but the dataflow has max_parallelism={plan.max_parallelism}: every key would land in "
                f"another key group; keep max_parallelism={old_maxp}", droppable=False))
    for name in sorted(old):
        kind = old[name].get("kind")
        if kind not in STATEFUL_KINDS:
            continue
        node = plan.nodes.get(name)
        if node is None:
            problems.append(Problem(name, f"operator {name!r} ({kind}) has {_WHAT.get(kind, 'state')} in checkpoint "
                                          f"{epoch} but the dataflow has no operator of that name", droppable=True))
        elif node.kind.value != kind:
            problems.append(Problem(name, f"operator {name!r} was a {kind} in checkpoint {epoch} but is a "
                                          f"{node.kind.value} now: its state cannot be read as the new kind's",
                                    droppable=False))
    return problems


def enforce(plan, meta: dict, allow_non_restored_state: bool, log) -> set[str]:
    """Raise :class:`~epochal.errors.ConfigError` listing every problem of restoring
    ``meta`` into ``plan`` (only the undroppable ones with ``allow_non_restored_state``);
    return the operators whose state is dropped (logged as a warning)."""
    problems = check_restore(plan, meta)
    blocking = [p for p in problems if not (allow_non_restored_state and p.droppable)]
    if blocking:
        hint = ("; to drop the state of operators that no longer exist, pass allow_non_restored_state=True"
                if any(p.droppable for p in blocking) else "")
        raise ConfigError(f"checkpoint {meta.get('epoch')} of job {meta.get('job')!r} cannot be restored into this "
                          "dataflow (operator names identify state):\n  - "
                          + "\n  - ".join(p.message for p in blocking) + hint)
    dropped = {p.operator for p in problems if p.droppable}
    if dropped:
        log.warning("restoring checkpoint %s without the state of %s (allow_non_restored_state=True)",
                    meta.get("epoch"), ", ".join(map(repr, sorted(dropped))))
    return dropped


#: a storage document saying every sink transaction up to its ``epoch`` is committed: written
#: when a job stopped with a savepoint (and into the savepoint itself)
SINKS_COMMITTED = "_sinks_committed"


def check_sink_mode(meta: dict, epoch: int, sink_mode: str, committed: dict | None) -> None:
    """Refuse a restore whose sinks would drop what the checkpoint promised (issue 36).

    A checkpoint taken with transactional sinks (exactly-once) may hold pre-committed epochs
    whose commit never ran; only a transactional writer re-commits them (seed 004
    §4.1.3.1). A run with another sink mode (at-least-once) would drop them. Such a switch
    is allowed only from a checkpoint whose transactions are known to be committed:
    ``committed`` (the :data:`SINKS_COMMITTED` document) names its epoch.

    Raises:
        ConfigError: naming the setting and the way to switch safely.
    """
    then = meta.get("sink_mode")
    if then != "transactional" or then == sink_mode:
        return
    if committed is not None and committed.get("epoch") == epoch:
        return
    raise ConfigError(
        f"guarantee: checkpoint {epoch} was taken exactly-once and its sinks may hold pre-committed epochs that only "
        f"an exactly-once run commits; a {sink_mode!r} run would lose them. Switch safely: run it exactly-once and "
        "stop it with a savepoint (handle.stop_with_savepoint(), which commits every transaction up to its epoch), "
        "then start the new guarantee from that savepoint or with resume=True")
