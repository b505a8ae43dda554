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
(``ctx.value_state`` / ``ctx.map_state``, with ``ttl=`` too) and whose ``process_element``
sees ``ctx.key``.
"""
from __future__ import annotations

from typing import Iterable

from epochal.broadcast.state import BroadcastState
from epochal.operators.keyed import StateContext
from epochal.time.units import to_seconds

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
    broadcast state and the current key."""

    def __init__(self, ctx, current, state: BroadcastState, ttl):
        super().__init__(ctx, current, None, ttl)
        self.operator = ctx.operator
        self.broadcast_state = state

    @property
    def key(self):
        """The key of the record being processed (``None`` in ``process_broadcast_element``)."""
        return self._current.key
