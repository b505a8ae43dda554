"""``window(..., ttl=...)``: a key's pending window contents expire after inactivity.

**What TTL means for a window.** A window operator keeps, per key, the contents of its
windows that have not fired (and of those kept for ``allowed_lateness``). Without TTL they
go when their window ends — which may be never in practice: a 30-day window of a device
that fell silent, an event-time window behind a watermark that stalls, a long lateness.
With ``ttl`` the key's window state also ends when the key has been **inactive** for
``ttl``: no record of the key (that was not late) for ``ttl``

* processing time (``StateTtl(d)``, the default): ``ttl`` of wall clock since its last record;
* event time (``StateTtl(d, time="event")``): the watermark passes the newest event time of
  its records + ``ttl`` (an out-of-order record never shortens the life; a backfill expires
  keys as they expired then).

At that moment — the key's *deadline*, ``stamp + ttl`` — every pending pane (session) of
the key is deleted together with its fire and cleanup timers: a window of the key fires
only if it ends before the deadline (``end - 1 < stamp + ttl``, judged on the timer's own
time for event time and processing-time windows, on the wall clock at firing for an event-time
window with a processing-time ttl), and its contents are never emitted afterwards. The
key's next record starts afresh. Windows that fire normally are not affected, and a
key's TTL never deletes a result already emitted.

**How.** Per key one value state ``"<operator>/active"`` holds ``(None, stamp)`` — the
layout of :class:`~epochal.ttl.state.TtlValueState`, so restores check TTL changes and the
offline state reader judges it like any TTL state (:mod:`epochal.ttl.registry`) — and a
timer in ``"<operator>/$timers.ttl"`` (keyed state too: snapshotted and rescaled with the
key) is due at the deadline. A record only rewrites the stamp; the timer is moved lazily:
when it comes due and the key was active since, it is re-registered at the new deadline
(one timer write per key per ``ttl``, not per record). So expiry costs no sweep and the
state of an unbounded key space stays bounded by the keys active within ``ttl``.

``update="read_and_write"`` is refused: a window's contents are read only by its firing,
which is not activity of the key. Task thread only.
"""
from __future__ import annotations

import time
from typing import Callable

from epochal.time.timers import make_queue
from epochal.time.units import MAX_TIME
from epochal.ttl.expiry import EVENT, ON_READ_AND_WRITE, PROCESSING, StateTtl, expired, next_stamp
from epochal.ttl.registry import TtlRegistry, units

__all__ = ["WindowTtl", "checked_ttl", "window_ttl"]

_MISSING = object()


def checked_ttl(ttl, where: str) -> StateTtl | None:
    """A window's ``ttl=`` (record path or columnar) as a :class:`StateTtl`, or ``None``;
    build time. Raises ``PipelineDefinitionError`` naming ``where`` for a malformed ttl or
    ``update='read_and_write'`` (a window's firing is not activity of its key)."""
    from epochal.errors import ConfigError, PipelineDefinitionError

    try:
        config = StateTtl.coerce(ttl, f"{where}: ttl")
    except ConfigError as exc:
        raise PipelineDefinitionError(str(exc)) from None
    if config is not None and config.update == ON_READ_AND_WRITE:
        raise PipelineDefinitionError(f"{where}: ttl update='read_and_write' does not apply to windows (only a "
                                      "key's records keep its windows alive); use update='write'")
    return config


class WindowTtl:
    """The inactivity TTL of one window operator's keys (see the module docstring).

    Args:
        ctx: the operator's context (keyed backend, name, key groups).
        current: the operator's current key.
        config: the ``ttl`` (``None``: none — the object then only applies a TTL removed
            since the checkpoint).
        watermark: the operator's event-time watermark (µs).
        timed: the operator's input carries event time.
        drop: ``drop(kg, key)`` deletes the key's panes (sessions) and their timers.
    """

    def __init__(self, ctx, current, config: StateTtl | None, watermark: Callable[[], int], timed: bool,
                 drop: Callable[[int, object], None]):
        self.backend, self.config, self._drop = ctx.keyed_backend, config, drop
        self.state = f"{ctx.operator}/active"
        self._wall = time.time_ns  # looked up now: a test may substitute the clock
        self.registry = TtlRegistry(ctx.keyed_backend, ctx.operator, ctx.key_groups, current, watermark, timed,
                                    self._wall)
        self.registry.declare("active", self.state, "value", config)  # checks a changed ttl (raises)
        self.registry.governs = "active"  # readers hide every entry of an inactive key
        self.queue = make_queue(ctx.keyed_backend, f"{ctx.operator}/$timers.ttl", ctx.key_groups)
        if config is None:  # ttl removed since the checkpoint: declare() dropped the activity
            for _ in self.queue.pop_due(MAX_TIME):  # and its expiry timers go too
                pass
        self.event = config is not None and config.time == EVENT
        self.ttl = config.ttl_us * units(config.time) if config is not None else 0  # stamp units
        self._now = self.registry.clock(config) if config is not None else None

    @property
    def processing(self) -> bool:
        """Deadlines are on the wall clock."""
        return self.config is not None and self.config.time == PROCESSING

    def _deadline_us(self, stamp: int) -> int:
        """The timer time (µs) at which an entry stamped ``stamp`` has expired."""
        end = stamp + self.ttl
        return end if self.event else -(-end // 1000)

    # ------------------------------------------------------------------------ records
    def touch(self, kg: int, key, ts: int | None) -> None:
        """A record of ``key`` (event time ``ts`` µs, or ``None``) was added to its
        windows: the key is active. If its previous activity expired and the expiry has
        not run yet, the old contents are dropped first — call before adding the record."""
        if self.config is None:
            return
        get = self.backend.get
        stored = get(self.state, kg, key, _MISSING)
        old = None
        if stored is not _MISSING:
            if expired(stored[1], self.ttl, self._now()):
                self.expire(kg, key)
            else:
                old = stored[1]
        if self.event:
            stamp = next_stamp(EVENT, old, ts if ts is not None else self._now())
        else:
            stamp = self._wall()
        self.backend.put(self.state, kg, key, (None, stamp))
        if old is None:  # a new (or renewed) key: its expiry timer; a live one moves lazily
            self.queue.add(kg, self._deadline_us(stamp), key)

    def live_at(self, kg: int, key, at: int | None) -> bool:
        """Whether ``key``'s window contents are still live when a window firing at ``at``
        (µs, on the deadline's clock; ``None``: now) fires. An expired key is dropped."""
        if self.config is None:
            return True
        stored = self.backend.get(self.state, kg, key, _MISSING)
        if stored is _MISSING:
            return True  # no activity recorded (restored from a checkpoint without ttl)
        if at is None:
            now = self._now()
        else:
            now = at if self.event else at * 1000
        if expired(stored[1], self.ttl, now):
            self.expire(kg, key)
            return False
        return True

    def expire(self, kg: int, key) -> None:
        """Delete ``key``'s window contents, their timers and its activity."""
        self._drop(kg, key)
        self.backend.delete(self.state, kg, key)

    # --------------------------------------------------------------------------- time
    def advance(self, until: int) -> None:
        """Expiry timers due at ``until`` (µs, their clock): expire the keys inactive since,
        re-register the others at their new deadline."""
        get = self.backend.get
        for _ts, kg, key in self.queue.pop_due(until):
            stored = get(self.state, kg, key, _MISSING)
            if stored is _MISSING:
                continue
            deadline = self._deadline_us(stored[1])
            if deadline > until:
                self.queue.add(kg, deadline, key)
            else:
                self.expire(kg, key)

    def next_time(self) -> int | None:
        """The earliest expiry timer (µs), for processing-time ttl (else ``None``)."""
        if not self.processing:
            return None
        head = self.queue.peek()
        return head[0] if head is not None else None

    def snapshot(self) -> None:
        self.registry.snapshot()


def window_ttl(ctx, current, config: StateTtl | None, watermark: Callable[[], int], timed: bool,
               drop: Callable[[int, object], None]) -> WindowTtl | None:
    """The operator's :class:`WindowTtl`, or ``None`` when it has no ttl and its checkpoint
    had none either (nothing to do, nothing to pay)."""
    if config is None and not TtlRegistry(ctx.keyed_backend, ctx.operator, ctx.key_groups, current, watermark,
                                          timed).restored_meta:
        return None
    return WindowTtl(ctx, current, config, watermark, timed, drop)
