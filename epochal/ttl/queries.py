"""Queryable state with a time-to-live: what a lookup of a stamped state returns (seed 004
§4.3.1 with :mod:`epochal.ttl`).

A state declared ``queryable=True`` and with ``ttl=`` stores ``(value, stamp)`` tuples
(:mod:`epochal.ttl.state`). Its readers unwrap live entries and treat expired ones as
absent — **expired as of the version's clock**: the state's TTL clock
(:meth:`~epochal.ttl.registry.TtlRegistry.clock`: the wall clock for processing time, the
operator's watermark for event time) read on the task thread at the instant the version was
pinned (:meth:`~epochal.query.readers.StateReader.mark`). A read-committed answer is thus
what the task itself would have read at the epoch's barrier, whether or not the sweep had
deleted the entry by then; a read-uncommitted one judges against the clock of the moment of
the live read. Reads never delete nor restamp (a query is not an access: ``update=
"read_and_write"`` is not extended by lookups).
"""
from __future__ import annotations

from typing import Any, Callable

from epochal.query.readers import MapReader, StateReader, ValueReader
from epochal.ttl.expiry import expired
from epochal.ttl.registry import units

__all__ = ["TtlMapReader", "TtlValueReader", "ttl_reader"]

_MISSING = object()


class TtlValueReader(ValueReader):
    """A stamped value state: the value if live at the version's clock, else ``default``."""

    task_side = ("_clock",)

    def __init__(self, state: str, default: Any, clock: Callable[[], int], ttl: int):
        super().__init__(state, default)
        self._clock, self._ttl = clock, ttl

    def mark(self) -> int:
        return self._clock()

    def read(self, source, kg, key, mark):
        stored = source.get(self.states[0], kg, key, _MISSING)
        if stored is _MISSING or expired(stored[1], self._ttl, mark):
            return self.default
        return stored[0]


class TtlMapReader(MapReader):
    """A map state with stamped entries: the key's entries live at the version's clock."""

    task_side = ("_clock",)

    def __init__(self, state: str, clock: Callable[[], int], ttl: int):
        super().__init__(state)
        self._clock, self._ttl = clock, ttl

    def mark(self) -> int:
        return self._clock()

    def read(self, source, kg, key, mark):
        ttl = self._ttl
        return {mk: stored[0] for mk, stored in source.map_items(self.states[0], kg, key).items()
                if not expired(stored[1], ttl, mark)}


def ttl_reader(reader: StateReader, registry, config) -> StateReader:
    """The reader of ``reader``'s state declared with ``config`` (a
    :class:`~epochal.ttl.StateTtl`) in the operator whose TTL ``registry``
    (:class:`~epochal.ttl.registry.TtlRegistry`) keeps the clocks. Build time, task side."""
    clock, ttl = registry.clock(config), config.ttl_us * units(config.time)
    if isinstance(reader, ValueReader):
        return TtlValueReader(reader.states[0], reader.default, clock, ttl)
    if isinstance(reader, MapReader):
        return TtlMapReader(reader.states[0], clock, ttl)
    raise TypeError(f"no ttl reader for {type(reader).__name__}")
