"""The physical task: one long-running process, one mailbox thread.

The task thread is the only thread that touches operators, state and the source reader.
Helper threads only move bytes: input readers fill per-channel queues, credit readers
update credits, the control reader queues coordinator messages, the uploader writes
snapshots. They all wake the task thread through one condition variable ``cv``.

Per step the task thread (1) handles coordinator messages, (2) a source polls its reader
or a regular task takes the next message from a non-blocked input channel, (3) flushes
batches that lingered. Barriers go to the barrier handler picked by the guarantee
factory (aligned: seed 004 Alg. 6; tracker: §4.5.4; unaligned:
:mod:`epochal.alignment.unaligned`); sources inject barriers when the coordinator
triggers an epoch (Alg. 5). Step (2) lives in :mod:`~epochal.runtime.task.steps`, what
happens when a barrier is reached in :mod:`~epochal.runtime.task.barriers`.

Channel state. A snapshot taken before its barrier reached every input — an unaligned one,
or a loop head's, whose barrier still circulates the loop (Alg. 7) — is completed by the
task's :class:`~epochal.alignment.channel_state.ChannelStateRecorder` with the records in
flight: the upload is held until every channel owing records delivered them. With
unaligned snapshots (``components.priority_barriers``) barriers are taken when they
*arrive* (:meth:`InputGate.take_arrivals`), before the data queued ahead of them, also
while the task waits for credit (the blocked send then goes out without credit, so the
task gets back to its loop at once), and the task forwards its barrier ahead of the
credit-based flow control. A restore replays the channel state before any new input.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
import traceback

from epochal.alignment.channel_state import ChannelStateRecorder
from epochal.backends.retry import RetryPolicy
from epochal.backends.storage import CheckpointStorage
from epochal.errors import (ChannelSetupError, ConfigError, DataError, EpochalError, InjectedFault, OperatorError,
                            TaskStartError)
from epochal.loops.head import LOOP_LOG, LoopHeadProtocol
from epochal.metrics.quantiles import Summary
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.operators.factory import create_operator
from epochal.query.server import QueryServer
from epochal.query.versions import CommittedVersions
from epochal.runtime.task.attempt import AttemptSpec
from epochal.runtime.task.barriers import BarrierSteps
from epochal.runtime.task.chain import OperatorChain
from epochal.runtime.task.metrics import MetricSteps
from epochal.runtime.task.queries import QuerySteps
from epochal.runtime.task.replay import replay_restored
from epochal.runtime.task.restore import RestoredState, edge_of, load_restored_state
from epochal.runtime.task.router import Router
from epochal.runtime.task.snapshots import Uploader
from epochal.runtime.task.steps import ReadSteps
from epochal.runtime.transport import credentials, wire
from epochal.runtime.transport.channels import END, ChannelFailure, InputGate, OutputChannel
from epochal.sinks.base import SinkWriteError
from epochal.testing import FaultInjector
from epochal.time.units import MAX_TIME, now_micros
from epochal.time.watermarks import WatermarkTracker

log = logging.getLogger("epochal")


class TaskCancelled(EpochalError):
    """The coordinator cancelled this attempt (another task failed) or went away."""


class Task(ReadSteps, BarrierSteps, QuerySteps, MetricSteps):
    """Runs task ``index`` of an attempt until the coordinator says ``finish``.

    ``host`` is the address this task's data server is advertised at (peers connect to
    it), ``bind_host`` the address it binds (see :func:`epochal.runtime.launch.worker.task_addresses`);
    both default to the attempt's ``bind_host``.
    """

    def __init__(self, attempt: AttemptSpec, plan, index: int, host: str | None = None,
                 bind_host: str | None = None, node: str | None = None):
        self.attempt = attempt
        self.host = host or attempt.bind_host
        self.bind_host = bind_host or self.host
        self.node = node or self.host  # where the launcher says the task runs (for messages)
        self.plan = plan
        self.spec = plan.tasks[index]
        self.cv = threading.Condition()
        self.control: collections.deque = collections.deque()
        self.finished = False
        self.exhausted = False
        self.reader = None
        self._source_offsets: dict[int, dict] = {}  # epoch -> the reader's offsets at its barrier, until complete
        self.coordinator: wire.Connection | None = None
        self.server: wire.Server | None = None
        self.outputs: dict[str, OutputChannel] = {}
        self.uploader: Uploader | None = None
        self.faults = FaultInjector(attempt.faults, self.spec.chain, self.spec.subtask, attempt.generation)
        # A loop head's feedback channels come last: unbounded credit, never aligned (epochal.loops).
        self.n_aligned = self.spec.aligned_inputs
        components = attempt.components
        self.priority = components.priority_barriers  # unaligned snapshots: barriers overtake data
        self.gate = InputGate(self.spec.inputs, attempt.channels.credits, self.cv,
                              unbounded=frozenset(range(self.n_aligned, len(self.spec.inputs))),
                              announce_barriers=self.priority, in_flight=attempt.channels.in_flight,
                              unbounded_memory_bytes=attempt.channels.feedback_memory_bytes)
        self.handler = components.barrier_handler(self.n_aligned)
        self.clock = WatermarkTracker(self.n_aligned)  # event time of the task's input (epochal.time)
        self._end_held = False  # a loop head holds the end of input until the loop is quiescent
        memory = 100_000
        if self.spec.is_loop_head:
            memory = plan.nodes[self.spec.chain[0]].payload.log_memory_records
        self.recorder = ChannelStateRecorder(
            log_key=lambda c: LOOP_LOG if c >= self.n_aligned else self.spec.inputs[c],
            attach=self._attach_channel_state, memory_records=memory,
            discard=frozenset() if self.faults.loop_log_enabled else frozenset({LOOP_LOG}),
            memory_bytes=attempt.channels.log_memory_bytes)
        self.loop: LoopHeadProtocol | None = None
        if self.spec.is_loop_head:
            self.loop = LoopHeadProtocol(range(self.n_aligned, len(self.spec.inputs)), self.recorder)
        # epoch -> trigger time, for barriers forwarded later; entries up to a snapshot's epoch
        # are dropped with it, so at most the epochs in flight are kept
        self._barrier_ts: dict[int, float] = {}
        # queryable state (epochal.query): {"op/state": (kind, default)}, filled by operators'
        # open(); its committed versions, pinned at barriers; the server answering lookups
        self.queryable: dict[str, tuple] = {}
        self.query_versions = CommittedVersions()
        self.query_server: QueryServer | None = None
        self.query_key: bytes | None = None  # the query key once the token was revoked (else the attempt's)
        # timings as streaming summaries (count, sum, max, p50, p99): bounded over any run
        self.metrics = {"task": self.spec.id, "host": self.node, "source": self.spec.is_source, "records_in": 0,
                        "snapshots": 0, "unaligned_snapshots": 0, "channel_state_replayed": 0, "channel_state_watermarks": 0,
                        "alignment_s": Summary(), "sync_s": Summary(), "loop_replayed": 0}
        self._cpu_start = time.process_time()  # a reused Spark worker ran other tasks before this one

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> dict:
        try:
            start = self._connect()
            self._setup(start)
            self._loop()
            return self._final_metrics()
        except BaseException as exc:
            self._report_failure(exc)
            raise
        finally:
            self._teardown()

    def _where(self) -> str:
        advertised = f" (advertised as {self.host})" if self.host != self.node else ""
        return f"task {self.spec.id} on host {self.node}{advertised}"

    def _connect(self) -> tuple:
        """Join the attempt: reach the coordinator, bind the data server, say hello, wait
        for ``start``. Fails at once, naming this task, its host and the address, when the
        coordinator cannot be reached (:class:`TaskStartError`: nobody else can report for
        this task) or the data server cannot bind (reported to the coordinator)."""
        key, tls = self.attempt.key, self.attempt.tls
        coordinator = self.attempt.coordinator
        try:
            self.coordinator = wire.connect(
                coordinator, key, {"task": self.spec.id, "generation": self.attempt.generation}, tls=tls,
                peer_timeout=self.attempt.peer_timeout, codec=wire.CONTROL)
        except (OSError, EpochalError) as exc:
            raise TaskStartError(
                f"{self._where()} cannot connect to the coordinator at {coordinator[0]}:{coordinator[1]}: "
                f"{type(exc).__name__}: {exc} — the executors must reach the driver at that address (set "
                "spark.driver.host, or EPOCHAL_DRIVER_HOST for a multi-homed driver; check firewalls)"
            ) from exc
        address = None
        if self.spec.inputs:
            try:
                self.server = wire.Server(key, self.gate.attach, host=self.bind_host, name=self.spec.id, tls=tls,
                                          peer_timeout=self.attempt.peer_timeout)
            except OSError as exc:
                raise ChannelSetupError(
                    f"{self._where()} cannot bind its data server to {self.bind_host}: {exc} — set "
                    "EPOCHAL_TASK_HOST / EPOCHAL_TASK_BIND_HOST in the executors' environment "
                    "(spark.executorEnv.*) to an address of this host"
                ) from exc
            address = (self.host, self.server.address[1])
        self.coordinator.send(("hello", self.spec.id, address))
        start = self.coordinator.recv()
        while start[0] == "query_key":  # the query token was revoked while this task joined
            self.query_key = start[1]
            start = self.coordinator.recv()
        if start[0] != "start":
            raise TaskCancelled(f"task {self.spec.id}: coordinator sent {start[0]!r} instead of start")
        threading.Thread(target=self._read_control, name=f"epochal-control-{self.spec.id}", daemon=True).start()
        return start

    def _read_control(self) -> None:
        try:
            while True:
                msg = self.coordinator.recv()
                with self.cv:
                    self.control.append(msg)
                    self.cv.notify_all()
        except Exception as exc:
            with self.cv:
                self.control.append(("lost", str(exc)))
                self.cv.notify_all()

    def _setup(self, start) -> None:
        """Connect outputs, restore state, open operators; then report ``running`` with
        ``setup_s`` (start received → ready) and ``restore_s`` (reading and installing the
        checkpointed state: task state files plus the keyed backend)."""
        t_setup = time.monotonic()
        _, addresses, restore = start
        key = self.attempt.key
        credentials.bind(key, self.attempt.generation)  # for relay sinks and sources (their own connections)
        for gate in self.spec.outputs:
            for cid in gate.channels:
                consumer = self.plan.channels[cid].consumer
                address = tuple(addresses[consumer])
                try:
                    conn = wire.connect(address, key, {"channel": cid}, tls=self.attempt.tls,
                                        peer_timeout=self.attempt.peer_timeout)
                except (OSError, EpochalError) as exc:
                    raise ChannelSetupError(
                        f"{self._where()} cannot connect to task {consumer} at {address[0]}:{address[1]} "
                        f"(channel {cid}): {type(exc).__name__}: {exc} — tasks must reach each other at the "
                        "addresses they advertise (the executor's address, or EPOCHAL_TASK_HOST)"
                    ) from exc
                self.outputs[cid] = OutputChannel(cid, conn, self.cv)
        ch = self.attempt.channels
        self.router = Router(self.spec.outputs, self.outputs, ch.batch_size, ch.linger,
                             self.plan.max_parallelism, self.spec.id, self._check_cancelled,
                             batch_bytes=ch.batch_bytes, max_frame_bytes=ch.max_frame_bytes)
        storage = CheckpointStorage(self.attempt.storage_url, self.plan.job,
                                    retry_policy=RetryPolicy(deadline=self.attempt.storage_retry))
        self.uploader = Uploader(self.spec.id, storage, self._send, self.faults, self.attempt.inline_state)
        t_restore = time.monotonic()
        restored: RestoredState = load_restored_state(self.plan, self.spec, restore, storage)

        self.backend = None
        if len(self.spec.key_groups):
            self.backend = self.attempt.backend.create(self.spec.key_groups)
            if restored.keyed:
                self.backend.restore_from(restored.keyed, storage)
                mine = set(self.spec.chain)  # state names are "<operator>/<state>"
                for state in self.backend.state_names():
                    if state.split("/", 1)[0] not in mine:  # allow_non_restored_state dropped it
                        self.backend.drop_state(state)
        restore_s = time.monotonic() - t_restore
        nodes = self.plan.nodes
        op_names = self.spec.chain[1:] if self.spec.is_source else self.spec.chain
        self.operators = []
        for name in op_names:
            ctx = OperatorContext(
                operator=name, task=self.spec.id, subtask=self.spec.subtask, parallelism=self.spec.parallelism,
                generation=self.attempt.generation, job=self.plan.job, max_parallelism=self.plan.max_parallelism,
                keyed_backend=self.backend, key_groups=self.spec.key_groups,
                extras={"sink_mode": self.attempt.components.sink_mode, "lineage": self.attempt.lineage,
                        "queryable": self.queryable, "snapshot_modes": self.attempt.components.snapshot_modes},
            )
            op = self.faults.wrap(name, create_operator(nodes[name], ctx))
            op.restore(restored.operators.get(name))
            self.operators.append(op)
        # each operator's producer in this task (-1: the task's input); a tree when a fan-out is chained
        index = {name: i for i, name in enumerate(op_names)}
        parents = [index.get(nodes[name].inputs[0].node, -1) if k or self.spec.is_source else -1
                   for k, name in enumerate(op_names)]
        self.chain = OperatorChain(self.operators, self.router, self.spec.id, self.metrics, parents,
                                   self.spec.chain[0] if self.spec.is_source else None)
        self._inputs_apart = self._input_selector()
        if self.spec.is_source:
            source = nodes[self.spec.chain[0]].payload
            # a source of Arrow batches returns whole batches: one per poll keeps barriers prompt
            self._poll_size = 1 if source.schema is not None else self.attempt.channels.batch_size
            for i, op in enumerate(self.operators):  # e.g. with_watermarks tracks event time per split
                if parents[i] == -1:
                    op.bind_source_splits(list(self.spec.source_splits))
            self.reader = source.create_reader(
                list(self.spec.source_splits), restored.source,
                subtask=self.spec.subtask, parallelism=self.spec.parallelism,
            )
            if hasattr(self.reader, "bind_storage"):  # readers that keep logs there (epochal.eventual)
                self.reader.bind_storage(self.attempt.storage_url, self.plan.job, self.attempt.generation,
                                         self.attempt.log_key)
        self._send(("running", self.spec.id, {"setup_s": time.monotonic() - t_setup, "restore_s": restore_s}))
        self._serve_queries(restore)
        self.chain.after_batch()  # a restored watermark generator resumes event time first
        replay_restored(self, restored, storage)  # loop logs, then channel state: before new input

    def _teardown(self) -> None:
        for op in getattr(self, "operators", None) or ():  # external clients, on every path
            try:
                op.release()
            except Exception:  # release must not raise; a failing one must not hide the cause
                log.warning("task %s: releasing operator %s failed", self.spec.id, op.ctx.operator, exc_info=True)
        if self.query_server is not None:
            self.query_server.close()  # before the backend closes: no read of a closed database
        self.query_versions.close()
        self.recorder.close()
        if self.uploader:
            self.uploader.close()
        for out in self.outputs.values():
            out.close()
        self.gate.close()
        if self.server:
            self.server.close()
        if getattr(self, "backend", None) is not None:
            self.backend.close()
        if self.reader is not None:
            try:
                self.reader.close()
            except Exception:
                pass
        if self.coordinator:
            self.coordinator.close()

    def _send(self, message: tuple) -> None:
        self.coordinator.send(message)

    def _report_failure(self, exc: BaseException) -> None:
        if self.coordinator is None or isinstance(exc, TaskCancelled):
            return
        if isinstance(exc, (OperatorError, EpochalError)):
            cause = str(exc)
            if isinstance(exc, (OperatorError, InjectedFault)):  # a user function's (or a test's) raise: where
                cause += _innermost_frames(exc.__cause__ or exc)  # (the dashboard's exceptions view shows it)
        else:
            cause = f"task {self.spec.id}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
        # A broken channel is usually the echo of another task's failure: the coordinator
        # prefers a primary cause that arrives shortly after.
        secondary = isinstance(exc, ChannelFailure)
        # A ConfigError (e.g. state that cannot be rescaled) or a DataError (input that
        # cannot be read, decoded or encoded) is deterministic: restarting the attempt would
        # fail the same way, so the job fails at once.
        try:
            flags = {"secondary": secondary, "fatal": isinstance(exc, (ConfigError, DataError))}
            if isinstance(exc, OperatorError):  # the driver stops retrying a record that fails every time
                flags["poison"] = [exc.operator, exc.record_repr, exc.cause.split(":", 1)[0]]
            elif isinstance(exc, SinkWriteError):  # a record the sink cannot write fails every time too
                flags["poison"] = [exc.sink_name, exc.record_repr, exc.reason.split(":", 1)[0]]
            lost = wire.lost_host(exc)
            if lost is not None:  # a peer's host went silent: the driver waits for Spark to drop it
                flags["lost_host"] = lost
            self._send(("failed", self.spec.id, cause, flags))
        except Exception:
            return
        # Wait (briefly) for the coordinator's answer: closing the socket while its "cancel"
        # sits unread would reset the connection, and a reset may destroy our report in
        # the coordinator's receive buffer — the job would then blame the wrong task.
        deadline = time.monotonic() + 2.0
        with self.cv:
            while not any(m[0] in ("cancel", "lost") for m in self.control) and time.monotonic() < deadline:
                self.cv.wait(0.05)

    def _check_cancelled(self) -> bool:
        """While blocked on credit: raise if the coordinator cancelled the attempt; True if
        a barrier must not wait for it (with unaligned snapshots: one arrived, a source was
        triggered, or an aligning epoch's timeout passed), so the blocked send goes out
        without credit (see the router) and the loop takes the barrier or switches."""
        for msg in list(self.control):
            if msg[0] in ("cancel", "lost"):
                raise TaskCancelled(f"task {self.spec.id}: {msg[0]}: {msg[1] if len(msg) > 1 else ''}")
        if not self.priority:
            return False
        return (self.gate.has_arrivals or any(m[0] == "trigger" for m in self.control)
                or getattr(self.handler, "switch_due", False))

    # ------------------------------------------------------------------ main loop
    def _loop(self) -> None:
        linger = self.attempt.channels.linger
        chain = self.chain
        interval = self.attempt.metrics_interval
        next_report = time.monotonic()
        while not self.finished:
            self._drain_control()
            if self.finished:
                return
            progressed = self._step_source() if self.spec.is_source else self._step_inputs()
            now_mono = time.monotonic()
            self.router.flush_if_lingering(now_mono)
            if now_mono >= next_report:
                next_report = now_mono + interval
                self._send(("metrics", self.spec.id, self.live_metrics()))
            due = chain.next_processing_time()  # processing-time timers (epochal.time.timers)
            if due is not None:
                now = now_micros()
                if now >= due:
                    chain.fire_processing_time(now)
                    continue
            if not progressed:
                with self.cv:
                    if self.control or self._input_ready():
                        continue
                    timeout = linger if self.router.oldest_unsent is not None else 0.05
                    if self.spec.is_source and not self.exhausted:
                        timeout = min(timeout, 0.002)
                    if due is not None:
                        timeout = max(0.0, min(timeout, (due - now_micros()) / 1e6))
                    self.cv.wait(timeout)

    def _blocked(self) -> frozenset[int]:
        if self.loop is None:
            return self.handler.blocked_channels
        return self.handler.blocked_channels | self.loop.blocked_channels

    def _input_ready(self) -> bool:
        blocked = self._blocked()
        return any(q and i not in blocked for i, q in enumerate(self.gate.queues))

    def _process(self, records: list, channel: int | None = None) -> None:
        if self._inputs_apart is not None and channel is not None:
            self._inputs_apart(self._input_of[channel])
        self.chain.process(records)

    _inputs_apart = None  # the head operator's select_input, when it reads its inputs apart (connect)

    def _input_selector(self):
        """The bound ``select_input`` of a head operator reading several logical inputs
        (:mod:`epochal.coprocess`), after mapping each input channel to its input index;
        ``None`` for every other task."""
        if self.spec.is_source or not self.operators:
            return None
        head = getattr(self.operators[0], "inner", self.operators[0])  # fault wrappers delegate
        if type(head).select_input is RuntimeOperator.select_input:
            return None
        self._input_of = [edge_of(cid)[2] for cid in self.spec.inputs]
        head.bind_input_channels(self._input_of[:self.n_aligned])
        self._input_watermark = head.input_watermark
        return head.select_input

    def select_input_channel(self, channel_id: str) -> None:
        """Replaying channel ``channel_id``'s checkpointed records (:mod:`~epochal.runtime.task.replay`)."""
        if self._inputs_apart is not None:
            self._inputs_apart(edge_of(channel_id)[2])

    def on_input_watermark(self, channel: int, watermark: int, idle: bool) -> None:
        if self._inputs_apart is not None:
            self._input_watermark(channel, watermark, idle)
        change = self.clock.on_watermark(channel, watermark, idle)
        if change is not None:
            if self.loop is not None and change.watermark >= MAX_TIME:
                self._end_held = True  # until the coordinator says the loop is empty (release_end)
                return
            self.chain.advance(change)

    def _drain_control(self) -> None:
        while self.control:
            msg = self.control.popleft()
            kind = msg[0]
            if kind == "trigger":
                if self.spec.is_source:
                    if len(msg) > 3 and msg[3] == "drain":  # stop-with-savepoint (drain): runtime/driver/savepoints.py
                        self._drain_source()
                    self._snapshot_and_forward(msg[1], msg[2])
            elif kind == "complete":
                self.faults.on_epoch_complete(msg[1])
                for op in self.operators:
                    self.faults.on_commit(op.ctx.operator, msg[1])
                    op.notify_epoch_complete(msg[1])
                if self.backend is not None:
                    self.backend.notify_epoch_complete(msg[1])
                self.faults.after_epoch_complete(msg[1])
                self.query_versions.completed(msg[1])
                if self.reader is not None:
                    offsets = self._source_offsets.pop(msg[1], None)
                    for e in [e for e in self._source_offsets if e < msg[1]]:
                        del self._source_offsets[e]  # aborted or never notified: covered by this one
                    if offsets is not None:
                        self.reader.notify_epoch_complete(msg[1], offsets)
                if len(msg) > 2 and msg[2]:  # stopping with a savepoint: confirm the commit (runtime/driver/savepoints.py)
                    self._send(("committed", self.spec.id, msg[1]))
            elif kind == "abort":  # coordinator gave up the epoch: release alignment and loop logging
                self._barrier_ts.pop(msg[1], None)
                self._source_offsets.pop(msg[1], None)
                self.handler.abort_epoch(msg[1])
                self.recorder.drop(msg[1])
                if self.loop is not None:
                    self.loop.abort(msg[1])
                if self.backend is not None:
                    self.backend.notify_epoch_aborted(msg[1])
                self.query_versions.aborted(msg[1])
            elif kind == "query":  # a read-uncommitted lookup (epochal.query.server)
                self._answer_live(msg)
            elif kind == "query_key":  # the job's query token was revoked (epochal.query)
                self.rekey_queries(msg[1])
            elif kind == "release_end":  # a loop head: the loop is quiescent, event time may end
                if self._end_held:
                    self.chain.end_of_input()
                    self.router.flush()
                self._send(("released", self.spec.id))
            elif kind == "finish":
                self._finish()
                return
            elif kind in ("cancel", "lost"):
                raise TaskCancelled(f"task {self.spec.id}: {kind}: {msg[1] if len(msg) > 1 else ''}")

    def _drain_source(self) -> None:
        """A drain's trigger: stop reading and end event time — the end-of-input watermark
        goes out ahead of the drain's barrier, so every window and timer downstream fires
        into its epoch. Unlike the end of the input, the coordinator is not told: no FINAL
        epoch follows; the job stops with the drain's savepoint."""
        if not self.exhausted:
            self._end_input()

    def _finish(self) -> None:
        """Clean end: the final epoch completed, so nothing is in flight anywhere."""
        for op in self.operators:
            op.close()
        try:
            self.router.broadcast((END,))
        except ChannelFailure:
            # a consumer that finished first closed its end (a loop head, before the tasks
            # feeding it back): the final epoch completed, so it needs nothing more from us
            pass
        self.finished = True
        self._send(("metrics", self.spec.id, self.live_metrics()))  # the final counts for the live metrics
        self._send(("finished", self.spec.id, self._final_metrics()))
        if self.loop is not None:  # its loop's tail finishes after it: take what it still sends
            self._await_feedback_end()


def _innermost_frames(exc: BaseException, frames: int = 3) -> str:
    """Where ``exc`` was raised: its traceback's innermost ``frames`` as lines after the cause's
    first (``File "...", line N, in f``; file names cut to their last 60 characters), short
    enough for the job's final error message."""
    tb = traceback.extract_tb(exc.__traceback__)[-frames:]
    return "".join(f'\n  File "{"…" + f.filename[-59:] if len(f.filename) > 60 else f.filename}", line {f.lineno},'
                   f' in {f.name}' for f in tb)
