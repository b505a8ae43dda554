"""Firing a keyed function's timers: what :class:`~epochal.operators.keyed.KeyedProcessOperator`
and :class:`~epochal.coprocess.operator.KeyedCoProcessOperator` share.

The timers themselves are keyed state (:class:`~epochal.time.timers.TimerService`); this
mixin turns the task's clock events into ``function.on_timer`` calls, each under its key,
and hands back what they produced::

    watermark advances      -> on_watermark(w)            -> every event-time timer <= w fires
    processing time reaches -> on_processing_time(now)    -> every processing-time timer <= now fires
    the task asks           -> next_processing_time()     -> the earliest pending one (or None)

Called on the task thread only (the one that owns the operator and its state).
"""
from __future__ import annotations

from epochal.time.timers import EVENT_TIME, TimerService
from epochal.time.units import to_seconds


class TimerFiring:
    """Mixin for a keyed runtime operator whose ``function`` has ``on_timer(key, ts, domain)``.

    Expects ``self.current`` (the current key), ``self.function``, ``self.timed`` and
    ``self.fail`` of a :class:`~epochal.operators.keyed._KeyedOperator`; call
    :meth:`_open_timers` in ``__init__`` before the function's ``open``. ``stamps``: the
    function stamps its own output records (else an event-time timer's output carries the
    timer's time, a processing-time timer's ``None``)."""

    stamps = False

    def _open_timers(self, ctx) -> None:
        self.timers = TimerService(ctx.keyed_backend, ctx.operator, self.current, ctx.key_groups)
        self._fired: list = []

    def on_watermark(self, watermark: int) -> list:
        self.timers.advance_watermark(watermark, self._fire)
        fired, self._fired = self._fired, []
        return fired

    def next_processing_time(self) -> int | None:
        return self.timers.next_processing_time()

    def on_processing_time(self, now: int) -> list:
        self.timers.fire_processing_time(now, self._fire)
        fired, self._fired = self._fired, []
        return fired

    def _timer_time(self, ts: int | None) -> None:
        """Told the event time of the timer about to fire (``None`` after it fired)."""

    def _fire(self, key, kg: int, ts: int, domain: str) -> None:
        cur = self.current
        cur.key, cur.kg = key, kg
        cur.ts = ts if domain == EVENT_TIME else None
        self._timer_time(cur.ts)
        try:
            produced = self.function.on_timer(key, to_seconds(ts), domain)
            if produced is not None:
                if self.stamps or not self.timed:
                    self._fired.extend(produced)
                else:
                    self._fired.extend([(cur.ts, v) for v in produced])
        except Exception as exc:
            raise self.fail(f"{domain}-time timer of key {key!r} at {to_seconds(ts)}", exc) from exc
        finally:
            self._timer_time(None)
