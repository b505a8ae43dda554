"""The coordinator's network side, in the driver: one attempt's control plane.

Wraps the pure :class:`~epochal.epochs.coordinator.EpochCoordinator` with sockets and
storage. Protocol per attempt (task → coordinator / coordinator → task):

1. every task connects (authenticated with the attempt key) and says
   ``("hello", task, data_address)``; once all did, each gets
   ``("start", addresses, restore_metadata)`` — the addresses of the tasks it sends to and
   its share of the restored checkpoint's metadata —, restores its state and answers
   ``("running", task, {"setup_s", "restore_s"})`` (the attempt's milestones are in
   :attr:`CoordinatorServer.times`);
2. sources receive ``("trigger", epoch, ts)`` (Alg. 5); every task acknowledges with
   ``("ack", epoch, payload)`` after its snapshot is durable, or ``("decline", ...)``;
3. when all acked, the coordinator writes ``chk-n/_metadata`` (last: the checkpoint is
   complete only once it exists) and then sends ``("complete", n)`` — the commit phase of
   the epoch commit (seed 004 §4.1.3). A write that still fails after the storage's retries
   declines the epoch after all (:meth:`EpochCoordinator.revoke`: ``("abort", n)``, the job
   runs on, ``tolerable_failures`` decides); retention decides on this thread what to
   delete and a background deleter deletes it (:mod:`epochal.runtime.driver.deleter`); a
   failing retention is logged and runs again after the next completion;
4. sources report ``("exhausted", task)``; when all are, a FINAL epoch runs; after it
   completed — and, with loops, only once its loop heads logged nothing (quiescence,
   :mod:`epochal.loops.termination`; else another FINAL epoch runs) — every task receives
   ``("finish",)`` and answers ``("finished", task, metrics)``. With loops, the end of
   event time waits for quiescence: loop heads hold the end-of-input watermark until the
   first quiescent FINAL epoch, then get ``("release_end",)``, forward it, answer
   ``("released", task)``, and one more FINAL epoch commits what it fired;
5. a ``("failed", task, cause)`` message or a lost connection fails the attempt; every
   task then gets ``("cancel", cause)``.

Savepoints (:mod:`epochal.runtime.driver.savepoints`): a request triggers an epoch (MANUAL) whose
completion is copied to the savepoint's location while retention keeps it pinned. A stop
request suspends further triggers; its epoch n goes out as ``("complete", n, True)``, which
every task confirms with ``("committed", task, n)`` after its sinks committed; once all
confirmed and the savepoint is written, the tasks get ``("finish",)`` upstream first (a task
once every task feeding it finished, so no task sends into a finished one; feedback edges of
loops excepted: a finished loop head drains its feedback channels until their end of
stream, :meth:`~epochal.runtime.task.steps.ReadSteps._await_feedback_end`). From then on
the attempt is stopping: a task that fails or disconnects instead of finishing ends like a
finished one — it confirmed its commits already. A stop that drains sends its epoch's
trigger as ``("trigger", n, ts, "drain")`` (the sources end event time before the barrier);
an abort of it fails the attempt, and a failed copy of it stops the job all the same
(:mod:`epochal.runtime.driver.savepoints`).
"""
from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass, field

from epochal.epochs.coordinator import EpochCoordinator
from epochal.epochs.history import EpochHistory
from epochal.epochs.pending import TriggerReason
from epochal.epochs.restore_shares import OldTasks
from epochal.runtime.transport import wire
from epochal.runtime.driver.completion import EpochOutcomes
from epochal.runtime.driver.deleter import CheckpointDeleter
from epochal.runtime.driver.failover import SECONDARY_GRACE, FailoverRegions
from epochal.runtime.driver.fanout import Fanout
from epochal.runtime.driver.links import consumer_tasks, upstream_tasks
from epochal.runtime.driver.savepoints import SavepointTracker

TICK = 0.005


@dataclass
class AttemptOutcome:
    """How an attempt ended: ``ok`` or the ``cause`` of its failure."""

    ok: bool
    cause: str = ""
    fatal: bool = False  # retrying cannot help (the tasks cannot even load the dataflow)
    task_metrics: dict = field(default_factory=dict)
    #: (operator, record repr, error type) when a user function failed on a record
    poison: tuple | None = None


def _frame(conn, message) -> bytes:
    """The frame payload of ``message`` on ``conn`` (its codec's, as ``Connection.send`` encodes)."""
    codec = getattr(conn, "codec", None)
    return wire.encode(message) if codec is None else codec.dumps(message, where="message")


class CoordinatorServer(EpochOutcomes, FailoverRegions):
    """Serves one attempt. ``outcome`` is set once; :meth:`wait` blocks for it; with
    failover regions (:mod:`epochal.runtime.driver.failover`) the driver also takes each
    region's failure from :attr:`events` and launches it again."""

    def __init__(self, plan, generation: int, key: bytes, storage, config, restore: dict | None,
                 first_epoch: int, bind_host: str, log, startup_timeout: float = 300.0,
                 advertised_host: str | None = None, tls=None, savepoints: SavepointTracker | None = None,
                 peer_timeout: float | None = None, lineage=None, sink_mode: str | None = None,
                 groups: list[tuple[str, ...]] | None = None, deleter: CheckpointDeleter | None = None):
        self.plan = plan
        self.generation = generation
        self.key = key  # the attempt key (the relay hub derives its connections' keys from it)
        self.query_key: bytes | None = None  # set once the query token was revoked: the tasks' new key
        self.lineage = lineage  # epochal.epochs.lineage.Lineage: written into every _metadata
        self.sink_mode = sink_mode  # the sinks' SinkMode value: a restore with another one is checked
        self.storage = storage
        self.config = config
        self.restore = restore
        self.log = log
        self.tasks = [t.id for t in plan.tasks]
        self._upstream = upstream_tasks(plan)
        self._consumers = consumer_tasks(plan)
        self._old_tasks: tuple | None = None  # (restore, its OldTasks index) for the start messages
        self.sources = set(plan.source_tasks)
        self.loop_heads = plan.loop_head_tasks
        self.final_rounds = 0
        self._releasing: set[str] | None = None  # loop heads yet to release the end of input
        #: the latest ("metrics", task, counters) of every task, for live metrics (epochal.metrics)
        self.live: dict[str, dict] = {}
        self.coordinator = EpochCoordinator(config, self.tasks, first_epoch=first_epoch)
        self.conns: dict[str, wire.Connection] = {}
        self.addresses: dict[str, tuple] = {}
        #: task → address of its query server (epochal.query), registered after its restore
        self.query_addresses: dict[str, tuple] = {}
        self.started = False
        self.exhausted: set[str] = set()
        self.finished: dict[str, dict] = {}
        #: the attempt's completed and aborted epochs: the newest ``checkpoint.history`` in
        #: detail, all of them counted and summarised (bounded memory, epochal.epochs.history)
        self.history = EpochHistory(config.history)
        self.highest_triggered = first_epoch - 1
        self.inbox: queue.Queue = queue.Queue()
        self._secondary: tuple[float, str] | None = None
        self._startup_deadline = time.monotonic() + startup_timeout
        self._reported: set[str] = set()  # tasks that sent their own failure report
        self.outcome: AttemptOutcome | None = None
        #: monotonic times of this attempt's milestones: "connected" (every task said hello,
        #: "start" sent), "running" (every task restored its state and opened its operators),
        #: "failed" (the coordinator decided the attempt failed)
        self.times: dict[str, float] = {}
        self.task_setup: dict[str, dict] = {}  # task → {"setup_s", "restore_s"} from its "running"
        #: hosts that stopped answering a connection (wire.PeerLost) during this attempt
        self.lost_hosts: set[str] = set()
        self._done = threading.Event()
        #: savepoint requests (the driver's, shared by its attempts)
        self.savepoints = savepoints if savepoints is not None else SavepointTracker(storage, log)
        #: retention's deletes, off this loop (the driver's, shared by its attempts; else this attempt's own)
        self._own_deleter = deleter is None
        self.deleter = deleter if deleter is not None else CheckpointDeleter(storage, log)
        self._finish_held = False  # the job may finish once the savepoints in progress are written
        #: the savepoint URL the job stopped with (stop_with_savepoint), once it stops
        self.stopped_with_savepoint: str | None = None
        self._stop_url: str | None = None  # the stop's savepoint is written ("": a drain's failed)
        self._stopping = False  # every task committed the stop epoch: the tasks finish
        self._committed: set[str] = set()  # tasks that confirmed committing the stop epoch
        self._stopped: set[str] = set()  # tasks gone (failed, lost) after the stop's "finish"
        self._finish_sent: set[str] = set()
        self._init_failover(groups, restore, startup_timeout)
        #: the sends to the tasks: encoded once, written off this loop by a few sender threads
        self.fanout = Fanout(self._send_failed, _frame)
        # control messages are data (wire.CONTROL): a frame that is not, a pickle, is refused unread
        self.server = wire.Server(key, self._on_connection, host=bind_host, name="coordinator", tls=tls,
                                  peer_timeout=peer_timeout, codec=wire.CONTROL)
        #: where tasks reach the coordinator (the driver's advertised host, its bound port)
        self.address = (advertised_host or bind_host, self.server.address[1])
        self._thread = threading.Thread(target=self._loop, name="epochal-coordinator", daemon=True)
        self.savepoints.attach(self.inbox.put)
        self._thread.start()

    # ------------------------------------------------------------------ public
    @property
    def completed(self) -> list[dict]:
        """The newest completed epochs of this attempt (``checkpoint.history`` at most), oldest first."""
        return self.history.completed

    @property
    def aborted(self) -> list[dict]:
        """The newest aborted epochs of this attempt, oldest first."""
        return self.history.aborted

    def trigger_epoch(self) -> None:
        """Manual trigger from the API (thread-safe)."""
        self.inbox.put(("manual",))

    def rekey_queries(self, key: bytes) -> None:
        """The job's query token was revoked (thread-safe): every task's query server, now
        and after a failover region's restart, accepts only ``key``."""
        self.inbox.put(("query_key", key))

    def _start(self, task: str, restore) -> None:
        """Send ``task`` its start (and the query key, if the token was revoked since the attempt began)."""
        self._send(task, self._start_message(task, restore))
        if self.query_key is not None:
            self._send(task, ("query_key", self.query_key))

    def _start_message(self, task: str, restore) -> tuple:
        """``("start", addresses, restore)`` for ``task``: the addresses of the tasks it sends
        to, and its share of the checkpoint's metadata (:meth:`OldTasks.share
        <epochal.epochs.restore_shares.OldTasks.share>`) — not every task's of both, which
        made an attempt's start quadratic in bytes (1,000 tasks: an estimated 240 MB)."""
        addresses = {t: self.addresses[t] for t in self._consumers[task] if t in self.addresses}
        if restore is not None:
            if self._old_tasks is None or self._old_tasks[0] is not restore:
                self._old_tasks = (restore, OldTasks(restore["tasks"]))  # indexed once per restore
            restore = self._old_tasks[1].share(restore, self.plan, self.plan.task(task))
        return ("start", addresses, restore)

    def fail(self, cause: str, secondary: bool = False, fatal: bool = False) -> None:
        """Fail the attempt from outside: the user cancelled, or (``secondary``) the launcher
        saw a task process die — the task's own report, if it arrives within the grace
        period, is the better cause. ``fatal``: retrying cannot help (the job fails)."""
        self.inbox.put(("failed", "driver", cause, {"secondary": secondary, "fatal": fatal}))

    def wait(self, timeout: float | None = None) -> AttemptOutcome | None:
        self._done.wait(timeout)
        return self.outcome

    def close(self) -> None:
        """The attempt is over (after :meth:`wait`): let the queued sends go out (10 s at
        most), close the connections, then wait for retention's deletes queued by this
        attempt (:meth:`CheckpointDeleter.drain`), so that the next attempt's restore and
        epoch ids never meet a directory being deleted."""
        self.fanout.close()
        self.server.close()
        for conn in list(self.conns.values()):
            conn.close()
        if self._own_deleter:
            self.deleter.close()
        else:
            self.deleter.drain()

    # ------------------------------------------------------------------ connections
    def _on_connection(self, conn: wire.Connection) -> None:
        try:
            hello = conn.recv()
        except Exception:
            conn.close()
            return
        if type(hello) is not tuple or len(hello) < 3:
            conn.close()
            return
        if hello[0] == "setup_failed":
            self.inbox.put(("failed", f"#{hello[1]}", hello[2], {"fatal": True}))
            conn.close()
            return
        if hello[0] == "failed":  # failed before its hello (e.g. its data server cannot bind)
            self.inbox.put(hello)
            conn.close()
            return
        if hello[0] != "hello" or hello[1] not in self.tasks:
            conn.close()
            return
        self.inbox.put(("hello", hello[1], hello[2], conn))
        task, tag = hello[1], self.group_of is not None  # failover regions: fence old incarnations
        try:
            while True:
                msg = conn.recv()
                self.inbox.put(("via", task, conn, msg) if tag else msg)
        except Exception as exc:
            lost = ("lost", task, str(exc), wire.lost_host(exc))
            self.inbox.put(("via", task, conn, lost) if tag else lost)

    def _send(self, task: str, message: tuple) -> None:
        """Queue ``message`` for ``task``'s connection (:mod:`~epochal.runtime.driver.fanout`:
        written by a sender thread, in order); nothing if it is not connected."""
        conn = self.conns.get(task)
        if conn is not None:
            self.fanout.send(task, conn, message)

    def _broadcast(self, message: tuple, tasks=None) -> None:
        """Queue ``message`` for every connected task (of ``tasks``): encoded once."""
        conns = self.conns
        self.fanout.broadcast([(t, conns[t]) for t in (self.tasks if tasks is None else tasks) if t in conns], message)

    def _send_failed(self, task: str, conn, exc: BaseException) -> None:
        """A sender thread could not write to ``task``'s ``conn``: its connection is lost
        (fenced like its reads with failover regions: a failed write to an older
        incarnation's connection is dropped)."""
        lost = ("lost", task, f"send failed: {exc}", wire.lost_host(exc))
        self.inbox.put(("via", task, conn, lost) if self.group_of is not None else lost)

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        while self.outcome is None:
            timeout = TICK
            due = self.coordinator.next_periodic_due if self.started else None
            if due is not None and due > time.monotonic():  # wake for a periodic trigger on time, not at
                timeout = min(TICK, due - time.monotonic())  # the next tick (past due: blocked, tick)
            try:
                msg = self.inbox.get(timeout=max(timeout, 0.0001))
            except queue.Empty:
                msg = None
            try:
                if msg is not None:
                    self._handle(msg)
                    while self.outcome is None:
                        try:
                            self._handle(self.inbox.get_nowait())
                        except queue.Empty:
                            break
                if self._secondary is not None and time.monotonic() >= self._secondary[0]:
                    self._finish_attempt(False, self._secondary[1])
                if self.group_of is not None and self.outcome is None:
                    self._check_failovers(time.monotonic())
                if self.outcome is None and self.started:
                    self._tick(time.monotonic())
                elif self.outcome is None and time.monotonic() > self._startup_deadline:
                    missing = sorted(set(self.tasks) - set(self.conns))
                    self._finish_attempt(False, f"tasks {', '.join(missing)} did not start within the start-up "
                                                "timeout (not enough executor slots, or the workers cannot "
                                                "reach the driver?)")
            except Exception as exc:  # a coordinator bug or storage failure fails the attempt
                self._finish_attempt(False, f"coordinator: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
        self._done.set()

    def _tick(self, now: float) -> None:
        self._apply(self.coordinator.check_timeouts(now))
        if self.coordinator.failure_budget_exceeded:
            last = (self.history.latest_aborted or {}).get("detail", "")
            self._finish_attempt(False, f"more than {self.config.tolerable_failures} consecutive failed "
                                        f"checkpoints (checkpoint.tolerable_failures); last: {last}")
            return
        if self.savepoints.stop_epoch is not None:
            return  # stopping with a savepoint: no epoch after the savepoint's
        pending = self.coordinator.maybe_trigger(now)
        if pending is not None:
            self.savepoints.on_trigger(pending.epoch)
            self.highest_triggered = pending.epoch
            ts = time.time()
            message = self.savepoints.trigger(pending.epoch, ts)  # a drain's carries "drain"
            self._broadcast(message, self.sources)

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "via":  # a message of a task's connection: dropped if an older incarnation's
            _, task, conn, msg = msg
            if self.conns.get(task) is not conn:
                return
            kind = msg[0]
        now = time.monotonic()
        if self._stopping and kind in ("failed", "lost"):
            self._gone_while_stopping(msg[1], msg[2])
        elif kind == "group_failed":
            self._group_failed(msg[1], msg[2], msg[3], msg[4], now)
        elif kind == "relaunching":
            self._relaunching(msg[1], msg[2], msg[3], now)
        elif kind == "hello" and self.started and self._rejoining(msg[1]):
            self._rejoin(msg[1], msg[2], msg[3], now)
        elif kind == "hello":
            _, task, address, conn = msg
            self.conns[task] = conn
            if address is not None:
                self.addresses[task] = address
            if len(self.conns) == len(self.tasks) and not self.started:
                self.started = True
                self.times["connected"] = now
                for t in self.tasks:  # each its own share (a broadcast of the whole was quadratic)
                    self._send(t, self._start_message(t, self.restore))
                if self.query_key is not None:
                    self._broadcast(("query_key", self.query_key))
        elif kind == "running":
            self.task_setup[msg[1]] = dict(msg[2]) if len(msg) > 2 else {}
            if self.group_of is not None:
                self._restored(msg[1], now)
            if len(self.task_setup) == len(self.tasks):
                self.times.setdefault("running", now)  # the attempt's; a failover region's restart is in failover_log
        elif kind == "ack":
            _, epoch, payload = msg
            gone = [h["path"] for h in payload.get("shared", ()) if self.storage.shared_deleted(h["path"])]
            if gone:  # a task with a stale base reused a file retention already deleted
                self._apply(self.coordinator.decline(
                    payload["task"], epoch, f"task {payload['task']}: snapshot references {gone[0]}, "
                    "deleted by retention; the next snapshot uploads its files anew", now))
            else:  # acked_at: when the ack arrived, for the per-task "ack_s" of the completed epoch
                self._apply(self.coordinator.acknowledge(payload["task"], epoch, dict(payload, acked_at=now), now))
        elif kind == "decline":
            _, epoch, task, reason = msg
            self._apply(self.coordinator.decline(task, epoch, reason, now))
        elif kind == "request_epoch":
            self.coordinator.request_trigger(TriggerReason.SOURCE_REQUEST, now)
        elif kind == "manual":
            self.coordinator.request_trigger(TriggerReason.MANUAL, now)
        elif kind == "savepoint":  # a FINAL epoch in flight serves it; else the next trigger does
            final = [p.epoch for p in self.coordinator.pending if p.reason is TriggerReason.FINAL]
            if final:
                self.savepoints.on_trigger(final[-1])
            elif self.savepoints.has_waiting:
                self.coordinator.request_trigger(TriggerReason.MANUAL, now)
        elif kind == "committed":
            if msg[2] == self.savepoints.stop_epoch:
                self._committed.add(msg[1])
                self._maybe_stop()
        elif kind == "savepoint_done":
            self._retain(f"the savepoint copy of epoch {msg[1]}")  # unpinned: it may be deleted now
            stopping = self.savepoints.stop_ready()
            if stopping is not None:  # "": a drain whose copy failed stops all the same
                self._stop_url = stopping.url if stopping.error is None else ""
                self._maybe_stop()
            elif self._finish_held and not self.savepoints.busy and self._stop_url is None:
                self._finish_held = False
                self._broadcast(("finish",))
        elif kind == "exhausted":
            self.exhausted.add(msg[1])
            if self.exhausted >= self.sources:
                self.coordinator.request_final(now)
        elif kind == "query_key":
            self.query_key = msg[1]
            self._broadcast(msg)
        elif kind == "query_address":
            self.query_addresses[msg[1]] = tuple(msg[2])
        elif kind == "metrics":
            self.live[msg[1]] = msg[2]
        elif kind == "released":
            self._releasing.discard(msg[1])
            if not self._releasing:  # the end of event time went into every loop: commit what it fired
                self.coordinator.continue_final(time.monotonic())
                self.final_rounds += 1
        elif kind == "finished":
            self.finished[msg[1]] = msg[2]
            self._stopped.discard(msg[1])
            if len(self.finished) + len(self._stopped) >= len(self.tasks):
                self._finish_attempt(True)
            elif self._stopping:
                self._finish_upstream_first()
        elif kind == "failed":
            self._reported.add(msg[1])
            flags = msg[3] if len(msg) > 3 else {}
            if flags.get("lost_host"):
                self.lost_hosts.add(flags["lost_host"])
            if self._fails_over(msg[1], flags):
                self._task_failed_alone(msg[1], msg[2], flags.get("secondary", False), now, flags.get("poison"))
            elif flags.get("secondary"):
                if self._secondary is None:
                    self._secondary = (now + SECONDARY_GRACE, msg[2])
            else:
                self._finish_attempt(False, msg[2], fatal=flags.get("fatal", False),
                                     poison=tuple(flags["poison"]) if flags.get("poison") else None)
        elif kind == "lost":
            if len(msg) > 3 and msg[3]:
                self.lost_hosts.add(msg[3])
            if msg[1] not in self.finished and msg[1] not in self._reported:
                if len(msg) > 3 and msg[3]:  # its host went silent (ClusterConfig.peer_timeout)
                    cause = f"task {msg[1]} is unreachable: {msg[2]}"
                else:
                    cause = (f"task {msg[1]} disconnected without finishing (process crashed or was killed): "
                             f"{msg[2]}")
                if self._fails_over(msg[1], {"lost_host": msg[3] if len(msg) > 3 else None}):
                    self._task_failed_alone(msg[1], cause, False, now)
                elif self.started:
                    self._finish_attempt(False, cause)
                elif self._secondary is None:  # before start: usually the launcher tearing the attempt
                    self._secondary = (now + SECONDARY_GRACE, cause)  # down for another task's failure

    def _maybe_stop(self) -> None:
        """Stop with a savepoint: finish once it is written and every task committed."""
        if self._stop_url is not None and self._committed >= set(self.tasks) and not self._stopping:
            self._stopping = True
            self.stopped_with_savepoint = self._stop_url or None
            self.log(f"every task committed epoch {self.savepoints.stop_epoch} and "
                     f"{'the savepoint is written' if self._stop_url else 'it drained (its savepoint failed)'}: stopping")
            self._finish_upstream_first()

    def _finish_upstream_first(self) -> None:
        """Send "finish" to every task whose upstream tasks (over non-feedback channels) all ended."""
        ended = set(self.finished) | self._stopped
        for task in self.tasks:
            if task not in self._finish_sent and self._upstream[task] <= ended:
                self._finish_sent.add(task)
                self._send(task, ("finish",))

    def _gone_while_stopping(self, task: str, cause: str) -> None:
        """A task failed or disconnected after the stop's "finish": it committed the stop
        epoch already (confirmed), so it counts as stopped (a finished peer broke its channel)."""
        if task in self.tasks and task not in self.finished:
            self.log(f"task {task} ended while stopping: {str(cause).splitlines()[0][:200]}")
            self._stopped.add(task)
            self._send(task, ("cancel", "the job stopped with a savepoint"))
            if len(self.finished) + len(self._stopped) >= len(self.tasks):
                self._finish_attempt(True)
            else:
                self._finish_upstream_first()

    def _finish_attempt(self, ok: bool, cause: str = "", fatal: bool = False, poison: tuple | None = None) -> None:
        if self.outcome is not None:
            return
        if not ok:
            self.times["failed"] = time.monotonic()
            self._broadcast(("cancel", cause[:2000]))
        self.savepoints.attempt_ended(None if ok else cause)
        self.outcome = AttemptOutcome(ok, cause, fatal=fatal, task_metrics=dict(self.finished), poison=poison)
        self.events.put(("outcome",))
