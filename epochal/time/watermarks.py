"""Watermarks: generated from record timestamps, carried in-band, combined per task.

A watermark ``w`` on a channel promises that no later record on that channel has a
timestamp ``<= w`` (Flink's convention: a window ``[start, end)`` fires once the watermark
reached ``end - 1``). Watermarks travel as channel messages ``("W", w, idle)`` in FIFO order
with the data, exactly like barriers — so a channel blocked for alignment (seed 004
Alg. 6) holds its watermark back together with its data, and a watermark never overtakes
the records it follows. ``idle=True`` says the producer has no data for now: the channel
stops holding the consumer's watermark back until it sends an active one again.

Two pure pieces, no threads and no I/O (like :mod:`epochal.alignment.handlers`):

* :class:`BoundedOutOfOrderness` — the generator behind ``Stream.with_watermarks``:
  ``watermark = max timestamp seen - max_out_of_orderness - 1 µs``, plus idleness after
  ``idle_timeout`` of processing time without records;
* :class:`WatermarkTracker` — a task's event-time clock: the minimum over its non-idle
  input channels, never moving backwards. The task loop feeds it every ``"W"`` message it
  reads and forwards what it returns::

      change = tracker.on_watermark(channel, w, idle)
      if change is not None:
          advance_operators(change.watermark)       # timers and windows fire
          forward(("W", change.watermark, change.idle))

What a checkpoint holds: *no* watermark. The task's clock starts at ``MIN_TIME`` after a
restore and is regenerated: each generator restores its maximum timestamp (operator state)
and re-emits its watermark before any record, so downstream clocks catch up as soon as
every input delivered one. Timers and window contents are keyed state and survive.

Loops: a loop head's clock combines its external inputs only; watermarks arriving on a
feedback channel are dropped (records that go round a loop keep their timestamps and may
be late downstream). So a loop can never hold back, or stall, event time.
"""
from __future__ import annotations

from typing import NamedTuple

from epochal.time.units import MAX_TIME, MIN_TIME

__all__ = ["WATERMARK", "BoundedOutOfOrderness", "WatermarkChange", "WatermarkMark", "WatermarkTracker"]

#: kind of the channel message ``("W", watermark_us, idle)``
WATERMARK = "W"


class WatermarkChange(NamedTuple):
    """A task's (or generator's) new output: ``watermark`` (µs) and whether it is ``idle``."""

    watermark: int
    idle: bool


class WatermarkMark:
    """A watermark message kept in an unaligned checkpoint's channel state, between the
    records it was queued between (:mod:`epochal.alignment.channel_state`); replayed in
    order on restore. Never a user record: the task tells them apart by type."""

    __slots__ = ("watermark", "idle")

    def __init__(self, watermark: int, idle: bool):
        self.watermark, self.idle = watermark, idle

    def __reduce__(self):
        return WatermarkMark, (self.watermark, self.idle)

    def __eq__(self, other):
        return type(other) is WatermarkMark and (self.watermark, self.idle) == (other.watermark, other.idle)

    def __hash__(self):
        return hash((self.watermark, self.idle))

    def __repr__(self):
        return f"WatermarkMark({self.watermark}, idle={self.idle})"


class BoundedOutOfOrderness:
    """Watermarks for a stream whose timestamps are out of order by at most ``bound_us``.

    Contract: :meth:`on_event` for every record's timestamp in stream order; :meth:`emit`
    after a batch of records returns the new output, or ``None`` if nothing changed. With
    ``idle_timeout_us``, :meth:`on_tick` marks the stream idle once no record arrived for
    that long (processing time ``now_us``); the next record makes it active again.

        >>> g = BoundedOutOfOrderness(5_000_000)
        >>> g.on_event(12_000_000, now_us=0); g.on_event(10_000_000, now_us=0)
        >>> g.emit()
        WatermarkChange(watermark=6999999, idle=False)
        >>> g.emit() is None
        True
    """

    __slots__ = ("bound", "idle_timeout", "max_ts", "_last_event", "_idle", "_emitted", "_emitted_idle")

    def __init__(self, bound_us: int, idle_timeout_us: int | None = None):
        if bound_us < 0:
            raise ValueError(f"max_out_of_orderness must be >= 0, got {bound_us} µs")
        self.bound = bound_us
        self.idle_timeout = idle_timeout_us
        self.max_ts = MIN_TIME
        self._last_event: int | None = None
        self._idle = False
        self._emitted = MIN_TIME
        self._emitted_idle = False

    @property
    def current(self) -> int:
        """The watermark the timestamps seen so far allow."""
        if self.max_ts == MIN_TIME:
            return MIN_TIME
        if self.max_ts == MAX_TIME:
            return MAX_TIME
        return max(MIN_TIME, self.max_ts - self.bound - 1)

    def on_event(self, ts: int, now_us: int) -> None:
        if ts > self.max_ts:
            self.max_ts = ts
        self._last_event = now_us
        self._idle = False

    def on_end(self) -> None:
        """The input ended: the final watermark fires every window and event-time timer."""
        self.max_ts = MAX_TIME
        self._idle = False

    def next_tick(self) -> int | None:
        """Processing time (µs) at which :meth:`on_tick` may turn the stream idle. Never for
        an ended stream: its end-of-time watermark must keep counting downstream (an idle
        channel is skipped, and if every channel were idle the task's event time would
        stay where it was — an ended split would then hold back the live one)."""
        if self.idle_timeout is None or self._idle or self._last_event is None or self.max_ts == MAX_TIME:
            return None
        return self._last_event + self.idle_timeout

    def on_tick(self, now_us: int) -> None:
        due = self.next_tick()
        if due is not None and now_us >= due:
            self._idle = True

    def emit_idle(self) -> bool:
        """Whether the stream is idle now (no records for ``idle_timeout``)."""
        return self._idle

    def emit(self) -> WatermarkChange | None:
        """The output to forward now, if it changed since the last call."""
        w = self.current
        if w > self._emitted or self._idle != self._emitted_idle:
            self._emitted = max(w, self._emitted)
            self._emitted_idle = self._idle
            return WatermarkChange(self._emitted, self._idle)
        return None

    def restore(self, max_ts: int) -> None:
        """Continue after a restore: the watermark resumes where the snapshot left it."""
        self.max_ts = max_ts
        self._emitted = MIN_TIME
        self._emitted_idle = False


class WatermarkTracker:
    """A task's event-time clock over ``num_channels`` inputs (Flink's ``StatusWatermarkValve``).

    Per channel it keeps the highest watermark and whether the channel is idle. The output
    is the minimum over non-idle channels, never decreasing; when every channel is idle the
    output is idle (its watermark unchanged). A channel that turns active again with a
    lower watermark does not move the output back (its records may be late).

        >>> t = WatermarkTracker(2)
        >>> t.on_watermark(0, 10) is None       # channel 1 still at MIN_TIME
        True
        >>> t.on_watermark(1, 7)
        WatermarkChange(watermark=7, idle=False)
        >>> t.on_watermark(1, 7, idle=True)     # channel 1 idle: channel 0 alone counts
        WatermarkChange(watermark=10, idle=False)
    """

    __slots__ = ("_wm", "_idle", "watermark", "idle")

    def __init__(self, num_channels: int):
        self._wm = [MIN_TIME] * num_channels
        self._idle = [False] * num_channels
        self.watermark = MIN_TIME
        self.idle = num_channels == 0

    def add_channel(self) -> int:
        """One more input (e.g. a source split found at run time); returns its index."""
        self._wm.append(MIN_TIME)
        self._idle.append(False)
        if self.idle and len(self._wm) == 1:
            self.idle = False
        return len(self._wm) - 1

    def on_watermark(self, channel: int, watermark: int, idle: bool = False) -> WatermarkChange | None:
        """Channel ``channel`` delivered ``("W", watermark, idle)``; the task's new output
        if it changed, else ``None``."""
        if watermark > self._wm[channel]:
            self._wm[channel] = watermark
        self._idle[channel] = idle
        active = [w for w, i in zip(self._wm, self._idle) if not i]
        before = (self.watermark, self.idle)
        if active:
            self.watermark = max(self.watermark, min(active))
            self.idle = False
        else:
            self.idle = True
        if (self.watermark, self.idle) != before:
            return WatermarkChange(self.watermark, self.idle)
        return None

    def channel_watermark(self, channel: int) -> int:
        return self._wm[channel]
