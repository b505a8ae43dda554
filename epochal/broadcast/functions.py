"""What a user writes for broadcast state (Flink's broadcast state pattern).

    >>> class Threshold(BroadcastProcessFunction):
    ...     def process_broadcast_element(self, rule, ctx):       # every subtask, same order
    ...         ctx.broadcast_state.put("limit", rule)
    ...     def process_element(self, reading, ctx):               # reads it, read-only
    ...         if reading > ctx.broadcast_state.get("limit", 100):
    ...             yield ("alert", reading)

    alerts = readings.connect_broadcast(limits).process("alerts", Threshold())

``connect_broadcast(rules)`` on a :class:`~epochal.streams.KeyedStream` takes a
:class:`KeyedBroadcastProcessFunction`, whose ``open`` may also declare keyed state
(``ctx.value_state`` / ``ctx.map_state``, with ``ttl=`` too), whose ``process_element``
sees ``ctx.key`` and whose ``process_broadcast_element`` may change every key's state
through ``ctx.apply_to_keyed_state(name, fn)``.
"""
from __future__ import annotations

from typing import Callable, Iterable

from epochal.broadcast.state import BroadcastState
from epochal.operators.keyed import StateContext
from epochal.time.units import to_seconds
from epochal.ttl.state import TtlMapState, TtlValueState

__all__ = ["BroadcastContext", "BroadcastProcessFunction", "KeyedBroadcastContext", "KeyedBroadcastProcessFunction"]


class BroadcastProcessFunction:
    """Base class of the function of ``stream.connect_broadcast(rules).process(name, fn)``.

    * ``open(ctx)``: once per task, before any element.
    * ``process_broadcast_element(element, ctx)``: an element of the broadcast input; runs in
      every subtask, in the same order everywhere, and may write ``ctx.broadcast_state``.
      Keep it deterministic: every subtask must reach the same state.
    * ``process_element(record, ctx)``: a record of the main input; ``ctx.broadcast_state``
      is read-only here.

    Both return an iterable of output records (or ``None``). Elements of the two inputs are
    not ordered against each other, except by epochs: everything before an epoch's barrier
    on either input is processed before anything after it (aligned checkpoints), so a rule
    emitted before a barrier applies to every record after it.
    """

    def open(self, ctx: "BroadcastContext") -> None:
        pass

    def process_element(self, record, ctx: "BroadcastContext") -> Iterable | None:
        raise NotImplementedError

    def process_broadcast_element(self, element, ctx: "BroadcastContext") -> Iterable | None:
        raise NotImplementedError


class KeyedBroadcastProcessFunction(BroadcastProcessFunction):
    """:class:`BroadcastProcessFunction` of a keyed main input: ``open(ctx)`` may declare
    keyed state, ``process_element(record, ctx)`` runs with ``ctx.key`` set and its keyed
    state belonging to that key. ``process_broadcast_element`` has no current key (keyed
    state is not accessible there)."""


class BroadcastContext:
    """Handed to every method: ``broadcast_state``, ``subtask``, ``parallelism``, ``operator``,
    and ``timestamp`` (event time in seconds of the element, ``None`` without event time)."""

    def __init__(self, operator: str, subtask: int, parallelism: int, state: BroadcastState):
        self.operator, self.subtask, self.parallelism = operator, subtask, parallelism
        self.broadcast_state = state
        self._ts = None

    @property
    def timestamp(self) -> float | None:
        return None if self._ts is None else to_seconds(self._ts)


class KeyedBroadcastContext(StateContext):
    """A :class:`~epochal.operators.keyed.StateContext` (keyed state declarations) with the
    broadcast state, the current key and :meth:`apply_to_keyed_state`."""

    def __init__(self, ctx, current, state: BroadcastState, ttl):
        super().__init__(ctx, current, None, ttl)
        self.operator = ctx.operator
        self.broadcast_state = state
        self._handles: dict[str, tuple] = {}  # state name -> (handle, backend name, kind)

    @property
    def key(self):
        """The key of the record being processed (``None`` in ``process_broadcast_element``)."""
        return self._current.key

    def value_state(self, name: str, default=None, queryable: bool = False, *, ttl=None):
        handle = super().value_state(name, default, queryable, ttl=ttl)
        self._handles[name] = (handle, f"{self.operator}/{name}", "value")
        return handle

    def map_state(self, name: str, queryable: bool = False, *, ttl=None):
        handle = super().map_state(name, queryable, ttl=ttl)
        self._handles[name] = (handle, f"{self.operator}/{name}", "map")
        return handle

    def apply_to_keyed_state(self, name: str, fn: Callable) -> list:
        """Call ``fn(key, state)`` for every key of this subtask that holds keyed state
        ``name`` (declared in ``open``), with ``state`` — the handle ``open`` got — bound to
        that key: it may read, update or clear it (Flink's ``applyToKeyedState``). Keys whose
        entries expired (``ttl=``) are skipped. Returns the outputs ``fn`` returned (an
        iterable or ``None`` per key), for ``process_broadcast_element`` to yield.

        Only in ``process_broadcast_element``: every subtask applies the element to the
        keys it owns, so together they change every key once. The changes are keyed state
        like any other — in the epoch of the broadcast element, snapshotted and restored
        with it — so a replay after a failure applies them exactly once (keep ``fn``
        deterministic, as the whole of ``process_broadcast_element``).

        Raises:
            RuntimeError: called from ``process_element`` (or ``open``).
            ValueError: no keyed state ``name`` was declared in ``open``.
        """
        where = f"operator {self.operator!r}"
        if not self.broadcast_state._writable:
            raise RuntimeError(f"{where}: apply_to_keyed_state is only possible in process_broadcast_element")
        entry = self._handles.get(name)
        if entry is None:
            raise ValueError(f"{where}: apply_to_keyed_state({name!r}): no keyed state of that name was declared in "
                             f"open (declared: {sorted(self._handles) or 'none'})")
        handle, scoped, kind = entry
        backend, cur = self._ctx.keyed_backend, self._current
        live = _liveness(handle, backend, scoped, cur)
        saved, out = (cur.key, cur.kg), []
        try:
            for kg in self._ctx.key_groups:
                keys = [k for k, _ in backend.value_items(scoped, kg)] if kind == "value" else backend.map_keys(scoped, kg)
                for key in keys:
                    cur.key, cur.kg = key, kg
                    if live is not None and not live():
                        continue
                    produced = fn(key, handle)
                    if produced is not None:
                        out.extend(produced)
        finally:
            cur.key, cur.kg = saved
        return out


def _liveness(handle, backend, scoped: str, cur) -> Callable[[], bool] | None:
    """For a TTL handle: whether the current key has a live (unexpired) entry; ``None``
    for a handle without TTL (every stored key is live)."""
    if isinstance(handle, TtlValueState):
        return lambda: handle._live() is not None
    if isinstance(handle, TtlMapState):
        return lambda: any(stamp + handle._ttl > handle._now()
                           for _mk, (_v, stamp) in backend.map_items(scoped, cur.kg, cur.key))
    return None
