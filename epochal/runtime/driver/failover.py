"""Failover regions: the parts of one attempt that restart alone (Flink's region failover).

Seed 000 §3.1 lets a failure reset only the operators of its consistent region; Flink's
"pipelined regions" go one step further and compute, inside a job, the sets of tasks no
channel connects — a job whose parallel pipelines share no edge (forward-only chains:
``source(p=4) → map → sink``) restarts only the pipeline that failed. epochal does the
same inside each (consistent) region:

* :func:`failover_groups` — the connected components of the physical plan's task graph
  (every channel, feedback channels of loops included: a loop is never split). A plan of
  one component has no failover regions; it restarts as a whole, as before.
* :func:`restarts_alone` — whether the plan may use them: the strategy says so
  (``RestartStrategy(failover="region")``, the default) and every sink of the plan recovers
  one subtask without touching another's output (:attr:`~epochal.sinks.api.Sink.local_recovery`).

How a failover region restarts (the driver, :mod:`epochal.runtime.driver.attempts`, and
the coordinator, :mod:`epochal.runtime.driver.coordinator_server`): the other tasks keep
running and the epoch sequence goes on. The coordinator forgets the failed tasks'
acknowledgments of every pending epoch (:meth:`~epochal.epochs.coordinator.EpochCoordinator.retract`)
and every message of their old connections; the driver stops what is left of them,
launches them again with a new generation (their sinks fence the old one), and the
coordinator sends them the latest completed epoch to restore and then a trigger for every
epoch still pending. Their sources inject those barriers where they resume, which is a
consistent cut: no channel connects them to the tasks that kept running, so each
component's cut is independent of the others'. Epochs complete once the restarted tasks
acknowledged them; the restarted sinks pre-commit nothing for those epochs (their replay
lands in later ones), the others keep what they pre-committed.

A failure while the job ends (a FINAL epoch requested), stops with a savepoint, or before
every task started, restarts the whole attempt, as does a host that went silent (the next
attempt waits for Spark to drop its executors) and any failure of a plan with one
component. A user function failing again on the record a failover region already
restarted for fails the attempt with it, and the driver stops retrying (a poison record).
"""
from __future__ import annotations

import queue
import time

from epochal.epochs.pending import TriggerReason
from epochal.graph import NodeKind

#: how long a secondary failure (a broken channel, usually the echo of another task's
#: failure) waits for the primary cause before it fails its failover region or the attempt
SECONDARY_GRACE = 0.5

#: ``RestartStrategy.failover`` values
REGION, FULL = "region", "full"


def failover_groups(plan) -> list[tuple[str, ...]]:
    """The task ids of each failover region of ``plan`` (connected components over every
    channel), each in plan order, ordered by their first task. Deterministic."""
    order = {t.id: i for i, t in enumerate(plan.tasks)}
    parent = {t.id: t.id for t in plan.tasks}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for channel in plan.channels.values():
        a, b = find(channel.producer), find(channel.consumer)
        if a != b:
            if order[a] > order[b]:
                a, b = b, a
            parent[b] = a
    groups: dict[str, list[str]] = {}
    for task in plan.tasks:
        groups.setdefault(find(task.id), []).append(task.id)
    return sorted((tuple(g) for g in groups.values()), key=lambda g: order[g[0]])


def blocking_sinks(plan) -> list[str]:
    """The sinks of ``plan`` whose recovery touches other subtasks' output (e.g. subtask 0
    deleting every subtask's staged files): one of their subtasks cannot restart alone."""
    return [n.name for n in plan.nodes.values()
            if n.kind is NodeKind.SINK and not getattr(n.payload, "local_recovery", False)]


def restarts_alone(plan, strategy) -> list[tuple[str, ...]] | None:
    """The failover regions ``plan`` restarts one by one under ``strategy`` (a
    :class:`~epochal.config.RestartStrategy`), or ``None`` when it restarts as a whole:
    ``failover="full"``, a single component, or a sink without local recovery."""
    if getattr(strategy, "failover", FULL) != REGION:
        return None
    groups = failover_groups(plan)
    if len(groups) < 2 or blocking_sinks(plan):
        return None
    return groups


class FailoverRegions:
    """The coordinator's half of restarting a failover region alone (a mixin of
    :class:`~epochal.runtime.driver.coordinator_server.CoordinatorServer`, on its loop
    thread; the module docstring has the protocol).

    Attributes set by :meth:`_init_failover`: ``groups`` (task ids per failover region, or
    ``None``: the attempt restarts as a whole), ``group_of`` (task → region index),
    ``down`` (regions being restarted), ``incarnation`` (per region, +1 per restart),
    ``events`` (what the driver waits on: ``("outcome",)`` once the attempt ended, or
    ``("failover", region, incarnation, cause)``), ``latest_restore`` (the latest completed
    epoch's restore document: what a restarted region restores) and ``failover_log``.
    """

    def _init_failover(self, groups, restore, rejoin_timeout: float) -> None:
        self.groups = groups
        self.group_of = {t: i for i, g in enumerate(groups) for t in g} if groups else None
        self.down: dict[int, dict] = {}
        self.incarnation = [0] * len(groups or ())
        self.events: queue.Queue = queue.Queue()
        self.latest_restore = restore
        self.failover_log: list[dict] = []
        #: (operator, record, error type) of every user-function failure a failover region restarted for
        self.failover_poisons: list[tuple] = []
        self._group_secondary: dict[int, tuple[float, str]] = {}
        self._restoring: dict[int, tuple[dict, set, float]] = {}  # rejoined regions not yet all running
        self._rejoin_timeout = rejoin_timeout

    # ------------------------------------------------------------------ from the driver
    def fail_group(self, group: int, incarnation: int, cause: str, secondary: bool = False) -> None:
        """The launcher saw incarnation ``incarnation`` of failover region ``group`` end
        with a failure (thread-safe); an older incarnation's report is ignored. A relaunch
        that fails before its tasks joined is a failure too: the region restarts again
        (one more restart of the budget), it is not left waiting for the start-up timeout."""
        self.inbox.put(("group_failed", group, incarnation, cause, secondary))

    def relaunched(self, group: int, incarnation: int, generation: int) -> None:
        """The driver launched ``group`` again as ``generation`` (thread-safe): its tasks
        must say hello within the start-up timeout from now."""
        self.inbox.put(("relaunching", group, incarnation, generation))

    # ------------------------------------------------------------------ on the loop thread
    def _steady(self) -> bool:
        """Whether a failover region may restart alone now: every task started, and the
        job is not ending (no FINAL epoch requested), stopping with a savepoint, or
        releasing a loop's end of input — those restart the whole attempt."""
        c = self.coordinator
        return (self.started and self.outcome is None and not c.final_requested and not c.is_finished
                and not any(p.reason is TriggerReason.FINAL for p in c.pending)
                and self.savepoints.stop_epoch is None and not self._stopping
                and self._releasing is None and not self._finish_sent and not self.finished
                and not self._finish_held)

    def _fails_over(self, task: str, flags: dict) -> bool:
        """Whether ``task``'s failure restarts only its failover region — not for a failure
        no restart can help, a host that went silent (the next attempt waits until Spark
        dropped its executors), nor a user function failing on a record it failed on in an
        earlier failover (a poison record: the attempt fails, and the driver stops retrying)."""
        poison = flags.get("poison")
        return (self.group_of is not None and task in self.group_of and not flags.get("fatal")
                and not (poison and tuple(poison) in self.failover_poisons) and not flags.get("lost_host")
                and self._steady())

    def _task_failed_alone(self, task: str, cause: str, secondary: bool, now: float, poison=None) -> None:
        group = self.group_of[task]
        if secondary:  # usually the echo of another task's failure: wait for the primary cause
            self._group_secondary.setdefault(group, (now + SECONDARY_GRACE, cause))
            return
        self._group_secondary.pop(group, None)
        if poison:
            self.failover_poisons.append(tuple(poison))
        self._fail_over(group, cause, now)

    def _group_failed(self, group: int, incarnation: int, cause: str, secondary: bool, now: float) -> None:
        if incarnation != self.incarnation[group]:
            return  # the launch of an incarnation already restarted (or its cancellation)
        if not self._steady():
            self._finish_attempt(False, cause)
        elif group in self.down:  # its relaunch failed before every task of it said hello
            before = self.down[group]
            failed = before.get("failed_relaunches", []) + [
                f"failover region {group} was relaunched, but its launch failed before its tasks joined: {cause}"]
            self._fail_over(group, failed[-1], now)
            if group in self.down:  # down_s and the cause from the first failure; each failed relaunch kept
                self.down[group].update(since=before["since"], cause=before["cause"], failed_relaunches=failed)
        else:
            self._task_failed_alone(self.groups[group][0], cause, secondary, now)

    def _check_failovers(self, now: float) -> None:
        """Every loop turn: secondary causes whose grace ran out, regions that did not come back."""
        for group, (deadline, cause) in list(self._group_secondary.items()):
            if now >= deadline:
                del self._group_secondary[group]
                if self._steady():
                    self._fail_over(group, cause, now)
                else:
                    self._finish_attempt(False, cause)
        for group, info in self.down.items():
            if now > info["deadline"]:
                missing = sorted(set(self.groups[group]) - set(self.conns))
                self._finish_attempt(False, f"failover region {group} restarted, but tasks {', '.join(missing)} did "
                                            "not start within the start-up timeout; restarting every task")
                return

    def _fail_over(self, group: int, cause: str, now: float) -> None:
        """Take failover region ``group`` down: cancel what is left of its tasks, forget
        their connections and their acknowledgments of pending epochs, and ask the driver
        to launch them again (``events``)."""
        if not self._steady():
            self._finish_attempt(False, cause)
            return
        tasks = self.groups[group]
        for task in tasks:
            conn = self.conns.pop(task, None)
            if conn is not None:
                try:
                    conn.send(("cancel", cause[:2000]))
                except Exception:
                    pass
                conn.close()
            for table in (self.addresses, self.query_addresses, self.task_setup, self.live):
                table.pop(task, None)
            self.exhausted.discard(task)
            self._reported.discard(task)
        dropped = self.coordinator.retract(tasks, now)
        self.incarnation[group] += 1
        self.down[group] = {"since": now, "deadline": float("inf"), "cause": cause, "generation": None}
        self.log(f"failover region {group} ({', '.join(tasks)}) failed; it restarts alone, the other tasks keep "
                 f"running ({dropped} acknowledgement(s) of pending epochs withdrawn): {cause.splitlines()[0][:300]}")
        self.events.put(("failover", group, self.incarnation[group], cause))

    def _relaunching(self, group: int, incarnation: int, generation: int, now: float) -> None:
        if incarnation == self.incarnation[group] and group in self.down:
            self.down[group].update(deadline=now + self._rejoin_timeout, generation=generation)
            self.generation = max(self.generation, generation)  # the checkpoints' newest generation

    def _restored(self, task: str, now: float) -> None:
        """A task said it restored its state and runs: once its restarted failover region's
        tasks all did, note how long the region was down (failure → running again)."""
        group = self.group_of.get(task)
        if group in self._restoring:
            entry, waiting, since = self._restoring[group]
            waiting.discard(task)
            if not waiting:
                entry["running_s"] = now - since
                del self._restoring[group]

    def _rejoining(self, task: str) -> bool:
        return self.group_of is not None and self.group_of.get(task) in self.down

    def _rejoin(self, task: str, address, conn, now: float) -> None:
        """A restarted task said hello. Once its whole region did: send each the latest
        completed epoch to restore, then its sources a trigger for every pending epoch —
        as the other sources got it (a drain's epoch with its drain flag)."""
        group = self.group_of[task]
        self.conns[task] = conn
        if address is not None:
            self.addresses[task] = address
        tasks = self.groups[group]
        if any(t not in self.conns for t in tasks):
            return
        info = self.down.pop(group)
        self.coordinator.rejoin(tasks, now)  # the pending epochs' timeouts count from now
        restore = self.latest_restore
        for t in tasks:
            self._start(t, restore)
        ts = time.time()
        epochs = [p.epoch for p in self.coordinator.pending]
        for t in tasks:
            if t in self.sources:
                for epoch in epochs:  # a drain's epoch carries "drain": the rejoined sources end event time too
                    self._send(t, self.savepoints.trigger(epoch, ts))
        entry = {"region": group, "tasks": list(tasks), "generation": info["generation"],
                 "cause": info["cause"].splitlines()[0][:500] if info["cause"] else "",
                 "restored_epoch": restore["epoch"] if restore else None,
                 "down_s": now - info["since"], "running_s": None, "pending_epochs": epochs,
                 "failed_relaunches": list(info.get("failed_relaunches", ()))}
        self.failover_log.append(entry)
        self._restoring[group] = (entry, set(tasks), info["since"])
        self.log(f"failover region {group} restarted from epoch {restore['epoch'] if restore else None} after "
                 f"{now - info['since']:.2f} s; triggering pending epochs {epochs}")
