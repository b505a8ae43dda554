"""The TTL bookkeeping of one keyed operator in one task: clocks, restore checks, the
record a checkpoint keeps of TTL, and the sweep.

**What a checkpoint holds.** At every snapshot (:meth:`TtlRegistry.snapshot`, called by
the operator's synchronous snapshot, before the backend's) the registry writes one entry
per owned key group into the operator's reserved value state ``"<operator>/~ttl"``::

    {"states": {name: (time, ttl_us, update)}, "clock": event-time clock (µs)}

So every key group describes its own TTL — it travels with the key group through a
rescale — and whoever reads it (a restored task, the offline state reader
:mod:`epochal.state.reader`) knows which states are stamped and, for event time, the
watermark at the cut: an entry expired then is expired for them too.

**Restores are checked.** A state declared after a restore compares the checkpoint's TTL
with its declaration (:func:`~epochal.ttl.expiry.ttl_change`): unchanged, or allowed and
applied (ttl added: entries stamped now; ttl removed: live entries unwrapped, expired ones
dropped; duration or update kind changed: applies to the stamps), or refused with a
:class:`~epochal.errors.ConfigError` that names the operator, the state and the change —
raised in ``open``, before any record, and fatal for the job (the task reports a
ConfigError as not retryable). An allowed change is named in a warning of the ``epochal``
logger. The check runs in the task, not in the driver's
:mod:`~epochal.runtime.driver.compatibility`, because a function declares its state (and
TTL) in ``open``: the driver never sees it.
"""
from __future__ import annotations

import logging
from typing import Callable

from epochal.errors import ConfigError
import time
from epochal.ttl.cleanup import Sweeper, TtlTarget
from epochal.time.units import MIN_TIME
from epochal.ttl.expiry import (EVENT, PROCESSING, StateTtl, TtlChange, clock_floor, expired, key_group_floors,
                                ttl_change)

__all__ = ["META", "TtlRegistry", "governs_record", "meta_state", "record_table_ttl", "units"]

META = "~ttl"
META_KEY = ""
log = logging.getLogger("epochal")


def meta_state(operator: str) -> str:
    """The backend name of ``operator``'s TTL record (one entry per key group)."""
    return f"{operator}/{META}"


class TtlRegistry:
    """TTL of the keyed states one operator declares (see the module docstring).

    Args:
        backend: the task's keyed backend (already restored).
        operator: the operator's name.
        key_groups: the key groups the task owns.
        current: the operator's current key (``.kg``, ``.key``, ``.ts`` in µs or ``None``).
        watermark: returns the operator's watermark (µs).
        timed: the operator's input carries event time.
        wall_clock_ns: processing time in **nanoseconds** (tests substitute a fake clock).
            Processing-time stamps are kept in ns: the clock is then ``time.time_ns``
            itself, a builtin — a Python-level µs clock cost 0.3 µs per call, a third of
            a heap state access, twice per update.
    """

    def __init__(self, backend, operator: str, key_groups: range, current, watermark: Callable[[], int],
                 timed: bool, wall_clock_ns: Callable[[], int] = time.time_ns):
        self.backend, self.operator, self.key_groups = backend, operator, key_groups
        self._current, self._watermark, self._timed, self._wall = current, watermark, timed, wall_clock_ns
        self._meta = meta_state(operator)
        restored = [backend.get(self._meta, kg, META_KEY) for kg in key_groups] if backend is not None else []
        self._old: dict[str, tuple] = {}
        for record in restored:
            if record:
                self._old.update(record["states"])
        self._had_meta = any(restored)
        self.floor = clock_floor(r.get("clock") for r in restored if r)
        #: each key group's own clock at the cut, when they differ (a rescale from cuts whose
        #: old subtasks had seen different watermarks: unaligned or at-least-once), else None
        self.floors = key_group_floors(key_groups, restored)
        self._targets: list[TtlTarget] = []
        self._configs: dict[str, tuple] = {}
        self.sweeper: Sweeper | None = None
        #: the state whose entry decides a key's life as a whole (window operators: the
        #: key's activity), or None; recorded so that readers hide the key's other state too
        self.governs: str | None = None
        #: the time of the event-time timer firing now (µs), else None: ``on_timer(t)`` sees
        #: event-time TTL state as at ``t``, however far the watermark jumped past it
        self.timer_time: int | None = None

    # ------------------------------------------------------------------------ clocks
    def clock(self, config: StateTtl) -> Callable[[], int]:
        """The clock against which ``config``'s entries expire, in its stamps' unit
        (:func:`units`). Event time: the watermark — or, while an event-time timer fires,
        the timer's time (:attr:`timer_time`), so what ``on_timer(t)`` sees does not depend
        on how far past ``t`` the watermark moved in one step. Processing time: the wall
        clock (also in processing-time timers, which fire at or after their time).

        Event time after a restore: never below the clock recorded at the cut — each key
        group's own (:attr:`floors`) when the key groups came from old subtasks that had
        seen different watermarks (issue 46: the highest of them expired entries early that
        the replayed channel state of a slower subtask found alive), read through the
        current key's group; one floor for all otherwise."""
        if config.time == EVENT:
            watermark, floor = self._watermark, self.floor
            if self.floors is None:
                return lambda: max(watermark() if self.timer_time is None else self.timer_time, floor)
            floors, low, cur = self.floors, min(self.floors.values()), self._current

            def clock() -> int:  # the key group's own floor until the watermark passes them all
                t = watermark() if self.timer_time is None else self.timer_time
                return t if t >= floor else max(t, floors.get(cur.kg, low))

            return clock
        return self._wall

    def sweep_clock(self, config: StateTtl) -> Callable[[], int]:
        """The clock of the sweep, which visits key groups without setting the current key:
        as :meth:`clock`, but with key groups of different floors the lowest one, so nothing
        is deleted before its own key group's clock says it expired (issue 46)."""
        if config.time != EVENT or self.floors is None:
            return self.clock(config)
        watermark, low = self._watermark, min(self.floors.values())
        return lambda: max(watermark(), low)

    def stamp_time(self, config: StateTtl) -> Callable[[], int]:
        """When an update happens: the record's (or event-time timer's) event time (µs),
        else the event-time clock; the wall clock (ns) for processing time."""
        if config.time == EVENT:
            cur, now = self._current, self.clock(config)
            return lambda: cur.ts if cur.ts is not None else now()
        return self._wall

    # ------------------------------------------------------------------- declarations
    def declare(self, short: str, scoped: str, kind: str, config: StateTtl | None) -> None:
        """State ``short`` (backend name ``scoped``; ``kind`` ``"value"`` or ``"map"``) is
        declared with ``config`` (``None``: no TTL). Checks and applies the change from
        the restored checkpoint's TTL of that state. Task thread, in ``open``.

        Raises:
            ConfigError: event-time TTL on an input without event time, or a refused change.
        """
        where = f"operator {self.operator!r}, state {short!r}"
        if config is not None and config.time == EVENT and not self._timed:
            raise ConfigError(f"{where}: event-time ttl needs event time on the operator's input; assign "
                              "timestamps and watermarks (with_watermarks) upstream or use time='processing'")
        new = config.describe() if config is not None else None
        old = self._old.get(short)
        if old is not None:
            old = tuple(old)
        change = ttl_change(old, new, old != new and self._has_entries(scoped, kind))
        if not change.allowed:
            raise ConfigError(f"{where}: cannot restore: {change.text} (checkpoint: {_show(old)}, now: "
                              f"{_show(new)}); keep the checkpoint's ttl, or drop the state by renaming it")
        if change is not TtlChange.UNCHANGED:  # allowed: applied, and named in the log
            log.warning("%s: restoring with a changed ttl: %s (checkpoint: %s, now: %s)", where, change.text,
                        _show(old), _show(new))
        if change is TtlChange.ENABLED:  # only processing time may be enabled: ns stamps
            stamp = self._wall()
            self._rewrite(scoped, kind, lambda value: (value, stamp))
        elif change is TtlChange.DISABLED:
            now = self._wall() if old[0] == PROCESSING else self.floor
            life = old[1] * units(old[0])
            self._rewrite(scoped, kind, lambda stored: None if expired(stored[1], life, now) else stored[0])
        if config is not None:
            self._configs[short] = new
            self._targets.append(TtlTarget(kind, scoped, config.ttl_us * units(config.time),
                                           self.sweep_clock(config), config.time == PROCESSING))

    def _has_entries(self, scoped: str, kind: str) -> bool:
        b = self.backend
        if kind == "value":
            return any(b.value_items(scoped, kg) for kg in self.key_groups)
        return any(b.map_keys(scoped, kg) for kg in self.key_groups)

    def _rewrite(self, scoped: str, kind: str, convert: Callable) -> None:
        """Replace every entry ``v`` of the state by ``convert(v)`` (``None``: delete)."""
        b = self.backend
        for kg in self.key_groups:
            if kind == "value":
                for key, stored in b.value_items(scoped, kg):
                    new = convert(stored)
                    b.put(scoped, kg, key, new) if new is not None else b.delete(scoped, kg, key)
                continue
            for key in b.map_keys(scoped, kg):
                for mk, stored in b.map_items(scoped, kg, key):
                    new = convert(stored)
                    b.map_put(scoped, kg, key, mk, new) if new is not None else b.map_delete(scoped, kg, key, mk)

    @property
    def restored_meta(self) -> bool:
        """The restored checkpoint recorded TTL for this operator."""
        return self._had_meta

    @property
    def active(self) -> bool:
        """Some declared state has a TTL."""
        return bool(self._targets)

    # ----------------------------------------------------------------- epoch and sweep
    def after_batch(self, records: int) -> None:
        """A batch of ``records`` was processed: one bounded sweep step."""
        if self.sweeper is None:
            self.sweeper = Sweeper(self.backend, self._targets, self.key_groups)
        self.sweeper.step(records)

    def snapshot(self) -> None:
        """Write the TTL record into every owned key group (synchronous part of the
        operator's snapshot, before the backend pins its state)."""
        if not self._targets:
            if self._had_meta:  # TTL removed from every state since the checkpoint
                self.backend.drop_state(self._meta)
                self._had_meta = False
            return
        watermark = self._watermark()
        clock = max(watermark, self.floor)
        record = {"states": dict(self._configs), "clock": clock}
        if self.governs is not None and self.governs in self._configs:
            record["governs"] = governs_record(self.governs, self._configs[self.governs], stamped=True)
        put, floors = self.backend.put, self.floors if watermark < self.floor else None
        for kg in self.key_groups:
            put(self._meta, kg, META_KEY,
                record if floors is None else {**record, "clock": max(watermark, floors.get(kg, MIN_TIME))})
        self._had_meta = True


def governs_record(short: str, desc: tuple, stamped: bool) -> dict:
    """The part of a key group's TTL record that names the state deciding each key's life
    as a whole (:class:`~epochal.ttl.reading.KeyGroupTtl` hides every entry of a key whose
    entry there expired): ``desc`` its :meth:`StateTtl.describe`; ``stamped``: its entries
    are ``(value, stamp)`` (else the stamp itself)."""
    return {"state": short, "ttl": tuple(desc), "stamped": stamped}


def record_table_ttl(backend, operator: str, key_groups: range, state: str, desc: tuple | None) -> None:
    """Record in every owned key group that ``operator``'s value state ``state`` (its
    short name) holds
    temporal-join tables ``[probes, versions, arrival_us]`` whose versions expire ``desc``
    (``(time, ttl_us, update)``, processing time: ``arrival_us + ttl_us <= now``) — the
    stamp lives inside the value, so the offline reader (:mod:`epochal.ttl.reading`)
    learns it here. ``desc`` ``None``: no such ttl; a record restored from a checkpoint
    that had one is dropped. Task thread, in ``open`` (after restore); idempotent."""
    meta = meta_state(operator)
    if desc is None:
        if any(backend.get(meta, kg, META_KEY) for kg in key_groups):
            backend.drop_state(meta)
        return
    record = {"states": {}, "clock": None, "table": {"state": state, "ttl": tuple(desc)}}
    for kg in key_groups:
        backend.put(meta, kg, META_KEY, record)


def panes_record(state: str, ttl_us: int) -> dict:
    """The TTL record of a columnar window operator with a processing-time ttl
    (:mod:`epochal.columnar.windows`): its ``state`` holds key blocks whose rows' last
    accumulator is the wall clock (µs) of the key's newest rows, and a key whose newest stamp
    is ``ttl_us`` old has expired — what the offline reader judges at read time
    (:meth:`~epochal.ttl.reading.KeyGroupTtl.expired_pane_keys`)."""
    return {"states": {}, "clock": None, "panes": {"state": state, "ttl_us": int(ttl_us)}}


def units(time_domain: str) -> int:
    """Stamp units per µs: processing-time stamps are wall-clock nanoseconds, event-time
    stamps microseconds (the unit of timestamps and watermarks)."""
    return 1000 if time_domain == PROCESSING else 1


def _show(desc) -> str:
    return "no ttl" if desc is None else f"ttl {desc[1] / 1e6:g}s {desc[0]} time, update on {desc[2]}"
