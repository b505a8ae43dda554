"""Value and map state with a time-to-live: the handles ``ctx.value_state(name, ttl=...)``
and ``ctx.map_state(name, ttl=...)`` return.

Every stored value is a plain tuple ``(value, stamp)`` — the stamp in wall-clock
nanoseconds for processing time, in event-time microseconds for event time — (a tuple, so the heap backend's
copy-on-write treats a stamped immutable value as immutable, as it would the bare value);
a map state stamps each entry. The rules (when an entry is expired, what an update stamps)
are :mod:`epochal.ttl.expiry`'s; the clock and the restore checks are the operator's
:class:`~epochal.ttl.registry.TtlRegistry`'s. An expired entry read here is deleted at
once (lazy cleanup); entries nobody reads are deleted by the sweep
(:mod:`epochal.ttl.cleanup`).
"""
from __future__ import annotations

from typing import Any

from epochal.ttl.expiry import EVENT, ON_READ_AND_WRITE, next_stamp
from epochal.ttl.registry import units

__all__ = ["TtlMapState", "TtlValueState"]

_MISSING = object()


class TtlValueState:
    """One value per key that expires ``ttl`` after its last update (or read, with
    ``update="read_and_write"``). Same contract as :class:`~epochal.operators.keyed.ValueState`."""

    __slots__ = ("_backend", "_get", "_put", "_name", "_cur", "_default", "_ttl", "_touch", "_event", "_now",
                 "_at")

    def __init__(self, backend, name: str, current, default: Any, config, registry):
        self._backend, self._name, self._cur, self._default = backend, name, current, default
        self._get, self._put = backend.get, backend.put  # one lookup, not per call (as ValueState)
        self._ttl = config.ttl_us * units(config.time)  # in stamp units (ns for processing time)
        self._touch = config.update == ON_READ_AND_WRITE
        self._event = config.time == EVENT
        self._now, self._at = registry.clock(config), registry.stamp_time(config)

    def _live(self):
        """``(value, stamp)`` of the current key, ``None`` if absent or expired (then deleted)."""
        cur = self._cur
        stored = self._get(self._name, cur.kg, cur.key, _MISSING)
        if stored is _MISSING:
            return None
        if stored[1] + self._ttl <= self._now():
            self._backend.delete(self._name, cur.kg, cur.key)
            return None
        return stored

    def value(self) -> Any:
        cur = self._cur
        stored = self._get(self._name, cur.kg, cur.key, _MISSING)  # _live, inlined: once per record
        if stored is _MISSING:
            return self._default
        if stored[1] + self._ttl <= self._now():
            self._backend.delete(self._name, cur.kg, cur.key)
            return self._default
        if self._touch:
            self._put(self._name, cur.kg, cur.key, (stored[0], next_stamp(
                EVENT if self._event else "", stored[1], self._at())))
        return stored[0]

    def update(self, value: Any) -> None:
        cur = self._cur
        if self._event:  # an older (out-of-order) record never shortens the key's life
            stored = self._live()
            self._put(self._name, cur.kg, cur.key,
                      (value, next_stamp(EVENT, None if stored is None else stored[1], self._at())))
        else:
            self._put(self._name, cur.kg, cur.key, (value, self._at()))

    def clear(self) -> None:
        cur = self._cur
        self._backend.delete(self._name, cur.kg, cur.key)


class TtlMapState:
    """A map per key whose entries each expire ``ttl`` after their last update (or read).
    Same contract as :class:`~epochal.operators.keyed.MapState`."""

    __slots__ = ("_backend", "_name", "_cur", "_ttl", "_touch", "_event", "_now", "_at")

    def __init__(self, backend, name: str, current, config, registry):
        self._backend, self._name, self._cur = backend, name, current
        self._ttl = config.ttl_us * units(config.time)  # in stamp units (ns for processing time)
        self._touch = config.update == ON_READ_AND_WRITE
        self._event = config.time == EVENT
        self._now, self._at = registry.clock(config), registry.stamp_time(config)

    def _live(self, map_key):
        cur = self._cur
        stored = self._backend.map_get(self._name, cur.kg, cur.key, map_key, _MISSING)
        if stored is _MISSING:
            return None
        if stored[1] + self._ttl <= self._now():
            self._backend.map_delete(self._name, cur.kg, cur.key, map_key)
            return None
        return stored

    def _restamp(self, map_key, stored) -> None:
        cur = self._cur
        stamp = next_stamp(EVENT if self._event else "", stored[1], self._at())
        self._backend.map_put(self._name, cur.kg, cur.key, map_key, (stored[0], stamp))

    def get(self, map_key, default=None):
        stored = self._live(map_key)
        if stored is None:
            return default
        if self._touch:
            self._restamp(map_key, stored)
        return stored[0]

    def put(self, map_key, value) -> None:
        cur = self._cur
        at = self._at()
        if self._event:
            stored = self._live(map_key)
            at = next_stamp(EVENT, None if stored is None else stored[1], at)
        self._backend.map_put(self._name, cur.kg, cur.key, map_key, (value, at))

    def remove(self, map_key) -> None:
        cur = self._cur
        self._backend.map_delete(self._name, cur.kg, cur.key, map_key)

    def __contains__(self, map_key) -> bool:
        return self._live(map_key) is not None

    def items(self) -> list:
        """The live entries (expired ones are deleted on the way)."""
        cur = self._cur
        now, ttl = self._now(), self._ttl
        out = []
        for map_key, stored in self._backend.map_items(self._name, cur.kg, cur.key):
            if stored[1] + ttl <= now:
                self._backend.map_delete(self._name, cur.kg, cur.key, map_key)
            else:
                if self._touch:
                    self._restamp(map_key, stored)
                out.append((map_key, stored[0]))
        return out

    def keys(self) -> list:
        return [k for k, _ in self.items()]

    def values(self) -> list:
        return [v for _, v in self.items()]

    def clear(self) -> None:
        cur = self._cur
        self._backend.map_clear(self._name, cur.kg, cur.key)
