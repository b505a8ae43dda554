"""Fault injection for proving recovery (public API, like Bytewax's ``testing``).

Pass faults to a run: ``flow.run(..., faults=[CrashAtRecord("count", record=500)])``.
Each fault fires once, in one attempt (``generation``, 0 = the first run), in one
subtask; the restarted attempt then runs clean, so a test compares its output with a
failure-free golden run.

``how="raise"`` raises :class:`~epochal.errors.InjectedFault` inside the task (a task
failure); ``how="exit"`` kills the task's process with ``os._exit`` (a process crash:
nothing is flushed, no goodbye is sent).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from epochal.errors import InjectedFault
from epochal.operators.base import RuntimeOperator

_HOW = ("raise", "exit")


@dataclass(frozen=True)
class Fault:
    """Base: where (operator name + subtask) and when (attempt) a fault fires.

    ``after_epoch``: the fault waits until the task was told that this epoch (or a later
    one) completed in the current attempt — so recovery restores real state instead of
    restarting from scratch.
    """

    operator: str
    subtask: int = 0
    generation: int = 0
    how: str = "raise"
    after_epoch: int = 0

    def __post_init__(self):
        if self.how not in _HOW:
            raise ValueError(f"{type(self).__name__}.how must be one of {_HOW}, got {self.how!r}")

    def fire(self, detail: str) -> None:
        message = f"injected {type(self).__name__} in {self.operator}[{self.subtask}] (generation {self.generation}): {detail}"
        if self.how == "exit":
            print(message + " — exiting process", file=sys.stderr, flush=True)
            os._exit(17)
        raise InjectedFault(message)


@dataclass(frozen=True)
class CrashAtRecord(Fault):
    """Fail when ``operator`` is about to process its ``record``-th record (1-based,
    counted from the start of the attempt). With ``after_epoch``, the fault fires at the
    first record once the task was told that epoch completed — or, if the ``record``-th
    went by before that and no record follows, right after the task handled that
    completion (its sinks committed): a test that waits for a completed epoch in the
    driver and then feeds the rest of the input cannot know when the task hears of it."""

    record: int = 1


@dataclass(frozen=True)
class CrashDuringAlignment(Fault):
    """Fail while the task running ``operator`` is aligning (its first input channel
    blocked, not all barriers arrived) for epoch ``epoch`` or the first one after it."""

    epoch: int = 1


@dataclass(frozen=True)
class CrashDuringSnapshotUpload(Fault):
    """Fail inside the asynchronous upload of ``operator``'s task snapshot for epoch
    ``epoch`` (or the first after it), after the state was serialised and before the state
    file is written.

    ``how="exit"`` crashes the process mid-upload; ``how="raise"`` is a storage error:
    the task declines the epoch and keeps running (the coordinator's tolerable-failure
    budget decides whether the job restarts).
    """

    epoch: int = 1
    how: str = "exit"


@dataclass(frozen=True)
class CrashDuringDurability(Fault):
    """Fail on the task's uploader thread just before the asynchronous part of
    ``operator``'s snapshot for epoch ``epoch`` (or the first after it) runs: for a
    two-phase-commit sink, its durability step — the epoch's transaction is sealed (the
    next one is taking records) but its files are not yet flushed, fsynced and closed.

    ``how="exit"`` crashes the process: the epoch was never acknowledged, so recovery
    restores an earlier epoch. ``how="raise"`` is an error of the asynchronous part before
    the sink touched the transaction (like a failed upload): the task declines the epoch
    and keeps running, and the next epoch's durability step makes the transaction durable
    (within the coordinator's tolerable-failure budget no restart is needed).
    """

    epoch: int = 1
    how: str = "exit"


@dataclass(frozen=True)
class CrashDuringCommit(Fault):
    """Fail when ``operator`` (a sink) is told epoch ``epoch`` (or a later one) completed,
    before its commit ran."""

    epoch: int = 1


@dataclass(frozen=True)
class CrashWhileLogging(Fault):
    """Fail when the loop head ``operator`` logs feedback records for epoch ``epoch`` (or
    the first after it): barrier ``epoch`` was forwarded into the loop and has not come
    back yet (seed 004 Alg. 7, lines 12-13)."""

    epoch: int = 1


@dataclass(frozen=True)
class CrashDuringReplay(Fault):
    """Fail while the task running ``operator`` replays the channel state of the
    (unaligned) checkpoint it restored, once it has replayed at least ``records`` records
    (a crash during recovery itself: the next attempt restores the same checkpoint)."""

    records: int = 1


@dataclass(frozen=True)
class DisableLoopLog(Fault):
    """TEST ONLY: loop head ``operator`` keeps no in-transit log, in every attempt and
    subtask. Proves the log matters: with it disabled, records in flight inside the loop
    at the restored cut are lost."""


class FaultInjector:
    """The faults of one task in one attempt; the runtime calls its hooks.

    Hooks are cheap no-ops when no fault applies (the common case).
    """

    def __init__(self, faults, operators: tuple[str, ...], subtask: int, generation: int):
        self._faults = [
            f for f in (faults or ())
            if f.operator in operators and f.subtask == subtask and f.generation == generation
        ]
        self.loop_log_enabled = not any(isinstance(f, DisableLoopLog) and f.operator in operators
                                        for f in (faults or ()))

        self.completed = 0
        self._crashing: list[_CrashingOperator] = []

    def on_epoch_complete(self, epoch: int) -> None:
        self.completed = max(self.completed, epoch)

    def after_epoch_complete(self, epoch: int) -> None:
        """Task thread, once every operator was told ``epoch`` completed (sinks committed):
        a :class:`CrashAtRecord` whose record went by before its ``after_epoch`` was
        known fires now."""
        for op in self._crashing:
            op.fire_if_overdue(epoch)

    def _ready(self, f: Fault) -> bool:
        return self.completed >= f.after_epoch

    def _take(self, kind, epoch: int | None = None):
        for f in self._faults:
            if isinstance(f, kind) and (epoch is None or epoch >= f.epoch) and self._ready(f):
                self._faults.remove(f)
                return f
        return None

    def wrap(self, name: str, op: RuntimeOperator) -> RuntimeOperator:
        for f in self._faults:
            if isinstance(f, CrashAtRecord) and f.operator == name:
                self._faults.remove(f)
                self._crashing.append(_CrashingOperator(op, f, self))
                return self._crashing[-1]
        return op

    def on_alignment(self, epoch: int) -> None:
        f = self._take(CrashDuringAlignment, epoch)
        if f:
            f.fire(f"aligning epoch {epoch}")

    def on_upload(self, epoch: int) -> None:
        f = self._take(CrashDuringSnapshotUpload, epoch)
        if f:
            f.fire(f"uploading snapshot of epoch {epoch}")

    def on_before_ack(self, operator: str, epoch: int) -> None:
        """Uploader thread: ``operator``'s asynchronous snapshot part of ``epoch`` is next."""
        for f in list(self._faults):
            if isinstance(f, CrashDuringDurability) and f.operator == operator and epoch >= f.epoch and self._ready(f):
                self._faults.remove(f)
                f.fire(f"asynchronous snapshot part (durability step) of epoch {epoch}")

    def on_loop_log(self, epoch: int) -> None:
        f = self._take(CrashWhileLogging, epoch)
        if f:
            f.fire(f"logging in-transit records of epoch {epoch}")

    def on_replay(self, replayed: int) -> None:
        """Task thread: restored channel state is being replayed; ``replayed`` so far."""
        for f in list(self._faults):
            if isinstance(f, CrashDuringReplay) and replayed >= f.records:
                self._faults.remove(f)
                f.fire(f"replaying channel state ({replayed} records)")

    def on_commit(self, operator: str, epoch: int) -> None:
        for f in self._faults:
            if isinstance(f, CrashDuringCommit) and f.operator == operator and epoch >= f.epoch and self._ready(f):
                self._faults.remove(f)
                f.fire(f"committing epoch {epoch}")


class _CrashingOperator(RuntimeOperator):
    """Delegates to ``inner`` and fires ``fault`` at the k-th record."""

    def __init__(self, inner: RuntimeOperator, fault: CrashAtRecord, injector: FaultInjector):
        super().__init__(inner.ctx)
        self.inner = inner
        self.fault = fault
        self.injector = injector
        self.seen = 0
        self.fired = False

    def process_batch(self, records: list) -> list:
        k = self.fault.record
        if not self.fired and records and self.seen + len(records) >= k and self.injector._ready(self.fault):
            before = max(0, k - 1 - self.seen)
            self.inner.process_batch(records[:before])
            self.fired = True
            self.fault.fire(f"record {self.seen + before + 1}: {records[before]!r}")
        self.seen += len(records)
        return self.inner.process_batch(records)

    def fire_if_overdue(self, epoch: int) -> None:
        if not self.fired and self.seen >= self.fault.record and self.injector._ready(self.fault):
            self.fired = True
            self.fault.fire(f"record {self.fault.record} went by before epoch {self.fault.after_epoch} was known "
                            f"to be complete; fired after epoch {epoch}'s completion")

    def restore(self, state):
        self.inner.restore(state)

    def snapshot(self, epoch):
        return self.inner.snapshot(epoch)

    def notify_epoch_complete(self, epoch):
        self.inner.notify_epoch_complete(epoch)

    def close(self):
        self.inner.close()

    # event time: the wrapper is transparent
    @property
    def generates_watermarks(self):
        return self.inner.generates_watermarks

    @property
    def side_output(self):
        return self.inner.side_output

    def on_watermark(self, watermark):
        return self.inner.on_watermark(watermark)

    def emit_watermark(self):
        return self.inner.emit_watermark()

    def next_processing_time(self):
        return self.inner.next_processing_time()

    def on_processing_time(self, now):
        return self.inner.on_processing_time(now)

    def prepare_snapshot_pre_barrier(self, epoch):
        return self.inner.prepare_snapshot_pre_barrier(epoch)

    def bind_source_splits(self, splits):
        self.inner.bind_source_splits(splits)

    def set_input_split(self, split, finished):
        self.inner.set_input_split(split, finished)
