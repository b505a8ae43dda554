"""What a pipeline author subclasses for two inputs, and the context it is opened with.

    >>> class Enrich(KeyedCoProcessFunction):          # orders enriched with the latest customer row
    ...     def open(self, ctx):
    ...         self.customer = ctx.value_state("customer")
    ...     def process1(self, key, order):
    ...         yield (order, self.customer.value())
    ...     def process2(self, key, customer):
    ...         self.customer.update(customer)

Contract (both classes): ``open(ctx)`` once per task before any record; ``process1`` for
every record of the first stream (the one ``connect`` is called on), ``process2`` for every
record of the second; each returns an iterable of output records or ``None``. The order
between the two inputs is the order the task reads them in (not deterministic across
runs), within one input channel it is the channel's order. The function object is copied
into every task: only state declared on ``ctx`` is checkpointed.
"""
from __future__ import annotations

from typing import Iterable

from epochal.operators.keyed import StateContext
from epochal.time.units import MIN_TIME, to_seconds
from epochal.ttl.registry import record_table_ttl

__all__ = ["CoContext", "CoProcessFunction", "KeyedCoProcessFunction"]


class CoContext(StateContext):
    """:class:`~epochal.operators.keyed.StateContext` (keyed state, ``timers``,
    ``timestamp``, ``watermark``) plus side outputs and the raw times the joins use.
    A non-keyed :class:`CoProcessFunction` gets one without keyed state and timers."""

    def __init__(self, ctx, current, timers, side_output: dict, timed: bool, ports: tuple, inputs=None):
        super().__init__(ctx, current, timers)
        self._side, self._timed, self._ports, self._inputs = side_output, timed, ports, inputs

    def output(self, port: str, value) -> None:
        """Put ``value`` in side output ``port`` (one of the function's ``side_outputs``),
        read with ``.side_output(port)`` on the operator's result stream. On a stream with
        event time it carries the timestamp of the record (or timer) being processed."""
        if port not in self._ports:
            raise ValueError(f"operator {self._ctx.operator!r}: side output {port!r} is not declared "
                             f"(side_outputs = {self._ports!r} on the function's class)")
        self._side[port].append((self._current.ts, value) if self._timed else value)

    def record_table_ttl(self, name: str, desc: tuple | None) -> None:
        """Advanced (the temporal join): keyed value state ``name`` holds tables
        ``[probes, versions, arrival_us]`` whose versions expire after ``desc`` (``(time,
        ttl_us, update)``, processing time; ``None``: they do not) — recorded for the offline
        state reader (:func:`~epochal.ttl.registry.record_table_ttl`). In ``open``; idempotent."""
        ctx = self._ctx
        record_table_ttl(ctx.keyed_backend, ctx.operator, ctx.key_groups, name, desc)

    @property
    def timestamp_us(self) -> int | None:
        """:attr:`timestamp` in integer microseconds (the engine's unit)."""
        return self._current.ts

    @property
    def watermark_us(self) -> int:
        """:attr:`watermark` in integer microseconds."""
        return self.timers.watermark_us

    @property
    def input_watermark_us(self) -> int:
        """The event time of the input the current record came from (its own channels'
        watermark), never behind :attr:`watermark_us`. A record at or before it is late for
        its input whatever the other input's pace — the joins' lateness test, which keeps
        lateness a property of one input's channels (deterministic for a single producer)."""
        inputs = self._inputs
        own = inputs.input_time[inputs.side] if inputs is not None else MIN_TIME
        return max(own, self.timers.watermark_us)

    @property
    def timestamp(self) -> float | None:
        ts = self._current.ts
        return None if ts is None else to_seconds(ts)


class _TwoInputs:
    #: names of the side outputs the function writes with ``ctx.output(port, value)``
    side_outputs: tuple = ()
    #: advanced: the function yields ``(timestamp_us, value)`` pairs and so chooses the event
    #: time of each output (the joins: a pair gets the later of its two rows' times); by
    #: default outputs inherit the time of the record or timer being processed
    stamps_output: bool = False

    def open(self, ctx: CoContext) -> None:
        pass


class KeyedCoProcessFunction(_TwoInputs):
    """Two keyed inputs sharing keyed state and timers per key: ``process1(key, value)``,
    ``process2(key, value)``, ``on_timer(key, timestamp, domain)`` as in
    :class:`~epochal.operators.keyed.KeyedProcessFunction` (timers registered by either
    side fire once, for the key)."""

    def process1(self, key, value) -> Iterable | None:
        raise NotImplementedError

    def process2(self, key, value) -> Iterable | None:
        raise NotImplementedError

    def on_timer(self, key, timestamp: float, domain: str) -> Iterable | None:
        raise NotImplementedError(f"{type(self).__name__} registered a timer but does not define on_timer")


class CoProcessFunction(_TwoInputs):
    """Two inputs without keys: ``process1(value)`` and ``process2(value)``. No keyed state
    and no timers (key the streams for those); ``ctx.timestamp``, ``ctx.output`` work."""

    def process1(self, value) -> Iterable | None:
        raise NotImplementedError

    def process2(self, value) -> Iterable | None:
        raise NotImplementedError
