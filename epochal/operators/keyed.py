"""Keyed stateful operators: ``reduce`` and the general ``process`` with keyed state.

Keyed state is partitioned by key group (seed 004 §4.2.1): every access goes to the
task's :class:`~epochal.backends.base.KeyedStateBackend` under the current record's key
group, so a snapshot (and a later rescale) can be cut per key group.

Per batch, the operators compute every record's key first and their key groups at once
(:class:`~epochal.backends.keygroups.KeyGroupAssigner`), then run the function record by
record. If a key fails, the batch is processed record by record instead (the key function
then runs twice for the records before the failing one), so the failing record is rejected
exactly where it stands.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from epochal.backends.keygroups import KeyGroupAssigner
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.query.readers import MapReader, StateReader, ValueReader, register
from epochal.operators.timer_firing import TimerFiring
from epochal.time.timers import TimerService
from epochal.time.units import MIN_TIME, to_seconds
from epochal.ttl.expiry import StateTtl
from epochal.ttl.registry import META, TtlRegistry
from epochal.ttl.queries import ttl_reader
from epochal.ttl.state import TtlMapState, TtlValueState

_MISSING = object()


class _CurrentKey:
    """The key (and its key group) of the record being processed, and its event time
    (µs, ``None`` without event time); set by the operator."""

    __slots__ = ("key", "kg", "ts")

    def __init__(self):
        self.key = None
        self.kg = -1
        self.ts = None


class ValueState:
    """One value per key. Contract: treat a value returned by :meth:`value` as read-only
    unless you :meth:`update` it afterwards; the backend protects pending snapshots
    from in-place mutation either way."""

    __slots__ = ("_get", "_put", "_delete", "_name", "_cur", "_default")

    def __init__(self, backend, name: str, current: _CurrentKey, default: Any):
        self._get, self._put, self._delete = backend.get, backend.put, backend.delete  # one lookup, not per call
        self._name, self._cur, self._default = name, current, default

    def value(self) -> Any:
        cur = self._cur
        return self._get(self._name, cur.kg, cur.key, self._default)

    def update(self, value: Any) -> None:
        cur = self._cur
        self._put(self._name, cur.kg, cur.key, value)

    def clear(self) -> None:
        cur = self._cur
        self._delete(self._name, cur.kg, cur.key)


class MapState:
    """A map per key (user key → value)."""

    __slots__ = ("_backend", "_name", "_cur")

    def __init__(self, backend, name: str, current: _CurrentKey):
        self._backend, self._name, self._cur = backend, name, current

    def get(self, map_key, default=None):
        return self._backend.map_get(self._name, self._cur.kg, self._cur.key, map_key, default)

    def put(self, map_key, value) -> None:
        self._backend.map_put(self._name, self._cur.kg, self._cur.key, map_key, value)

    def remove(self, map_key) -> None:
        self._backend.map_delete(self._name, self._cur.kg, self._cur.key, map_key)

    def __contains__(self, map_key) -> bool:
        return self._backend.map_contains(self._name, self._cur.kg, self._cur.key, map_key)

    def items(self) -> list:
        return self._backend.map_items(self._name, self._cur.kg, self._cur.key)

    def keys(self) -> list:
        return [k for k, _ in self.items()]

    def values(self) -> list:
        return [v for _, v in self.items()]

    def clear(self) -> None:
        self._backend.map_clear(self._name, self._cur.kg, self._cur.key)


class StateContext:
    """Handed to :meth:`KeyedProcessFunction.open` to declare keyed state.

    State names are scoped to the operator, so two operators may both use ``"count"``.
    """

    def __init__(self, ctx: OperatorContext, current: _CurrentKey, timers: TimerService | None = None,
                 ttl: TtlRegistry | None = None):
        self._ctx = ctx
        self._current = current
        self._timers = timers
        self._ttl = ttl
        self._declared: set[str] = set()
        self.subtask = ctx.subtask
        self.parallelism = ctx.parallelism

    @property
    def timers(self) -> TimerService:
        """Timers of the current key (:class:`~epochal.time.timers.TimerService`):
        ``register_event_time(t)``, ``register_processing_time(t)``, ``delete_*``; they are
        keyed state, so they are checkpointed, restored and rescaled with it."""
        if self._timers is None:
            raise ValueError(f"operator {self._ctx.operator!r}: timers exist in KeyedStream.process only")
        return self._timers

    @property
    def timestamp(self) -> float | None:
        """Event time (seconds) of the record being processed, or of the event-time timer
        firing; ``None`` on a stream without event time and in processing-time timers."""
        ts = self._current.ts
        return None if ts is None else to_seconds(ts)

    @property
    def watermark(self) -> float:
        """The operator's current event time (seconds; ``-inf`` before the first watermark,
        ``inf`` once a bounded input ended)."""
        return self.timers.watermark

    def processing_time(self) -> float:
        """The wall clock, in seconds."""
        return TimerService.processing_time()

    def _scoped(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError(f"operator {self._ctx.operator!r}: state name must be a non-empty string, got {name!r}")
        if name in self._declared:
            raise ValueError(f"operator {self._ctx.operator!r}: state {name!r} declared twice")
        if name == META:
            raise ValueError(f"operator {self._ctx.operator!r}: state name {META!r} is reserved (TTL bookkeeping)")
        self._declared.add(name)
        return f"{self._ctx.operator}/{name}"

    def _ttl_of(self, name: str, scoped: str, kind: str, ttl) -> StateTtl | None:
        config = StateTtl.coerce(ttl, f"operator {self._ctx.operator!r}, state {name!r}")
        if self._ttl is None:
            if config is not None:
                raise ValueError(f"operator {self._ctx.operator!r}, state {name!r}: this context keeps no "
                                 "TTL bookkeeping (ttl exists in KeyedStream.process and keyed broadcast functions)")
            return None
        self._ttl.declare(name, scoped, kind, config)
        return config

    def value_state(self, name: str, default: Any = None, queryable: bool = False, *,
                    ttl: StateTtl | Any = None) -> ValueState:
        """One value per key. ``queryable``: a running job answers lookups of it
        (``JobHandle.query``, :mod:`epochal.query`; absent keys read as ``default``).
        ``ttl``: a duration or :class:`~epochal.ttl.StateTtl`; the value then expires that
        long after its last update (see docs/ttl-broadcast.md)."""
        scoped = self._scoped(name)
        config = self._ttl_of(name, scoped, "value", ttl)
        if queryable:
            self._register_queryable(name, ValueReader(scoped, default), config)
        if config is not None:
            return TtlValueState(self._ctx.keyed_backend, scoped, self._current, default, config, self._ttl)
        return ValueState(self._ctx.keyed_backend, scoped, self._current, default)

    def map_state(self, name: str, queryable: bool = False, *, ttl: StateTtl | Any = None) -> MapState:
        """A map per key. ``queryable``: lookups return a key's whole map (heap backend).
        ``ttl``: each entry expires that long after its last update."""
        scoped = self._scoped(name)
        config = self._ttl_of(name, scoped, "map", ttl)
        if queryable:
            self._register_queryable(name, MapReader(scoped), config)
        if config is not None:
            return TtlMapState(self._ctx.keyed_backend, scoped, self._current, config, self._ttl)
        return MapState(self._ctx.keyed_backend, scoped, self._current)

    def _register_queryable(self, name: str, reader: StateReader, ttl) -> None:
        if ttl is not None:  # stamped entries: lookups leave out those expired at the version's clock
            reader = ttl_reader(reader, self._ttl, ttl)
        register(self._ctx.extras, reader.states[0], reader)  # the task serves it (epochal.query.server)


class KeyedProcessFunction:
    """Base class for the general keyed stateful operator (``KeyedStream.process``).

    Example:
        >>> class Count(KeyedProcessFunction):
        ...     def open(self, ctx):
        ...         self.n = ctx.value_state("n", default=0)
        ...     def process(self, key, value):
        ...         self.n.update(self.n.value() + 1)
        ...         yield (key, self.n.value())

    ``open`` is called once per task before any record (declare state there; keep ``ctx``
    for its ``timers``, ``timestamp`` and ``watermark``); ``process(key, value)`` returns an
    iterable of output records (or ``None``). State read and written in ``process``
    belongs to ``key``. The function object is copied into every task, so per-instance
    attributes other than state handles are not checkpointed: keep everything that must
    survive a failure in state.

    Timers (Flink's ``KeyedProcessFunction.onTimer``)::

        class Silence(KeyedProcessFunction):        # alert after 30 s without a heartbeat
            def open(self, ctx):
                self.ctx, self.due = ctx, ctx.value_state("due")
            def process(self, key, beat):
                if self.due.value() is not None:
                    self.ctx.timers.delete_event_time(self.due.value())
                self.due.update(self.ctx.timestamp + 30)
                self.ctx.timers.register_event_time(self.due.value())
            def on_timer(self, key, timestamp, domain):
                self.due.clear()
                yield ("silent", key, timestamp)

    Output records inherit the event time of the record being processed; those of an
    event-time timer get the timer's time, those of a processing-time timer none.
    """

    def open(self, ctx: StateContext) -> None:
        pass

    def process(self, key, value) -> Iterable | None:
        raise NotImplementedError

    def on_timer(self, key, timestamp: float, domain: str) -> Iterable | None:
        """A timer of ``key`` fired: ``timestamp`` in seconds, ``domain`` ``"event"`` (the
        watermark reached it) or ``"processing"`` (the wall clock did, or a bounded input
        ended: then every pending timer fires, so no state waits forever). State and timers
        belong to ``key``; returns output records like :meth:`process`. Each timer fires
        exactly once in the committed output, however often the job restores.

        Timers and ``ttl=`` (docs/ttl-broadcast.md): a key's timers are not state entries and
        do not expire with its state — a timer fires even after every TTL state of its key
        expired (reads then return the defaults), and firing is no access (it refreshes
        nothing unless ``on_timer`` reads or writes). An event-time ``on_timer(t)`` sees
        event-time TTL state as at ``t``: an entry last updated at ``s`` is live iff
        ``s + ttl > t``, however far the watermark jumped past ``t``; its writes are stamped
        ``t``."""
        raise NotImplementedError(f"{type(self).__name__} registered a timer but does not define on_timer")


class _KeyedOperator(RuntimeOperator):
    """``timed``: input records are ``(timestamp_us, value)`` pairs (event time), and so
    are the outputs."""

    def __init__(self, ctx: OperatorContext, key_fn: Callable, timed: bool = False):
        super().__init__(ctx)
        self.key_fn = key_fn
        self.current = _CurrentKey()
        self.max_parallelism = ctx.max_parallelism
        self.timed = timed
        self.assigner = KeyGroupAssigner(ctx.max_parallelism)  # key -> key group, memoized

    def _set_key(self, record) -> None:
        key = self.key_fn(record)
        self.current.key = key
        self.current.kg = self.assigner.assign(key)

    def _keys(self, values: list) -> tuple[list, list] | None:
        """The keys of ``values`` and their key groups, or ``None`` if a key fails (the
        caller then goes record by record)."""
        key_fn = self.key_fn
        try:
            keys = [key_fn(value) for value in values]
            return keys, self.assigner.assign_all(keys)
        except Exception:
            return None


class ReduceOperator(_KeyedOperator):
    """Keyed rolling reduce: ``acc = fn(acc, record)`` per key (the first record is the
    initial accumulator unless ``initial`` is given); emits the new accumulator.
    ``queryable``: a running job answers lookups of the accumulator, as state ``"acc"``
    (:mod:`epochal.query`; a key without one reads as ``None``)."""

    def __init__(self, ctx, key_fn, fn, initial=_MISSING, timed: bool = False, queryable: bool = False):
        super().__init__(ctx, key_fn, timed)
        self.fn = fn
        self.initial = initial
        self.state = f"{ctx.operator}/acc"
        if queryable:
            register(ctx.extras, self.state, ValueReader(self.state))

    def process_batch(self, records: list) -> list:
        timed = self.timed
        values = [r[1] for r in records] if timed else records
        keyed = self._keys(values)
        if keyed is None:
            return self._process_one_by_one(records)
        backend, fn, state, initial = self.ctx.keyed_backend, self.fn, self.state, self.initial
        get, put = backend.get, backend.put
        out = []
        append = out.append
        for record, value, key, kg in zip(records, values, *keyed):
            try:
                acc = get(state, kg, key, _MISSING)
                if acc is _MISSING:
                    acc = value if initial is _MISSING else fn(initial, value)
                else:
                    acc = fn(acc, value)
                put(state, kg, key, acc)
            except Exception as exc:
                self.reject(value, exc)
                continue
            append((record[0], acc) if timed else acc)
        return out

    def _process_one_by_one(self, records: list) -> list:
        backend, fn, state, initial = self.ctx.keyed_backend, self.fn, self.state, self.initial
        cur, timed = self.current, self.timed
        out = []
        for record in records:
            value = record[1] if timed else record
            try:
                self._set_key(value)
                acc = backend.get(state, cur.kg, cur.key, _MISSING)
                if acc is _MISSING:
                    acc = value if initial is _MISSING else fn(initial, value)
                else:
                    acc = fn(acc, value)
                backend.put(state, cur.kg, cur.key, acc)
            except Exception as exc:
                self.reject(value, exc)
                continue
            out.append((record[0], acc) if timed else acc)
        return out


class TtlReduceOperator(ReduceOperator):
    """``reduce(..., ttl=...)``: the accumulator is a TTL value state
    (:class:`~epochal.ttl.state.TtlValueState`); an expired key starts afresh."""

    def __init__(self, ctx, key_fn, fn, initial=_MISSING, timed: bool = False, ttl: StateTtl | None = None,
                 queryable: bool = False):
        super().__init__(ctx, key_fn, fn, initial, timed)
        self._watermark = MIN_TIME
        self.ttl = TtlRegistry(ctx.keyed_backend, ctx.operator, ctx.key_groups, self.current,
                               lambda: self._watermark, timed)
        self.ttl.declare("acc", self.state, "value", ttl)
        if queryable:  # an expired accumulator reads as None, as an absent one
            register(ctx.extras, self.state, ttl_reader(ValueReader(self.state), self.ttl, ttl))
        self.acc = TtlValueState(ctx.keyed_backend, self.state, self.current, _MISSING, ttl, self.ttl)

    def process_batch(self, records: list) -> list:
        fn, initial, cur, timed, acc_state = self.fn, self.initial, self.current, self.timed, self.acc
        out = []
        for record in records:
            value = record[1] if timed else record
            try:
                self._set_key(value)
                cur.ts = record[0] if timed else None
                acc = acc_state.value()
                if acc is _MISSING:
                    acc = value if initial is _MISSING else fn(initial, value)
                else:
                    acc = fn(acc, value)
                acc_state.update(acc)
            except Exception as exc:
                self.reject(value, exc)
                continue
            out.append((record[0], acc) if timed else acc)
        self.ttl.after_batch(len(records))
        return out

    def on_watermark(self, watermark: int) -> list:
        self._watermark = max(self._watermark, watermark)
        self.ttl.after_batch(0)
        return []

    def snapshot(self, epoch: int):
        self.ttl.snapshot()
        return None


class KeyedProcessOperator(TimerFiring, _KeyedOperator):
    """Runs a :class:`KeyedProcessFunction` with its declared keyed state and timers."""

    def __init__(self, ctx, key_fn, function: KeyedProcessFunction, timed: bool = False):
        super().__init__(ctx, key_fn, timed)
        self.function = function
        self._open_timers(ctx)
        timers = self.timers
        self.ttl = TtlRegistry(ctx.keyed_backend, ctx.operator, ctx.key_groups, self.current,
                               lambda: timers.watermark_us, timed)
        function.open(StateContext(ctx, self.current, self.timers, self.ttl))
        self._sweeps = self.ttl.active

    def process_batch(self, records: list) -> list:
        out = self._process_batch(records)
        if self._sweeps:
            self.ttl.after_batch(len(records))
        return out

    def snapshot(self, epoch: int):
        """Writes the TTL record of the key groups (:mod:`epochal.ttl.registry`); the keyed
        state itself is snapshotted by the backend right after."""
        self.ttl.snapshot()
        return None

    def _process_batch(self, records: list) -> list:
        timed = self.timed
        values = [r[1] for r in records] if timed else records
        keyed = self._keys(values)
        if keyed is None:
            return self._process_one_by_one(records)
        process = self.function.process
        cur = self.current
        out = []
        extend = out.extend
        if timed:
            for (ts, value), key, kg in zip(records, *keyed):
                cur.key, cur.kg, cur.ts = key, kg, ts
                try:
                    produced = process(key, value)
                    if produced is not None:
                        extend([(ts, v) for v in produced])
                except Exception as exc:
                    self.reject(value, exc)
            return out
        for record, key, kg in zip(records, *keyed):
            cur.key, cur.kg = key, kg
            try:
                produced = process(key, record)
                if produced is not None:
                    extend(produced if type(produced) is list else list(produced))
            except Exception as exc:
                self.reject(record, exc)
        return out

    def _process_one_by_one(self, records: list) -> list:
        process = self.function.process
        cur = self.current
        out = []
        if self.timed:
            for ts, value in records:
                try:
                    self._set_key(value)
                    cur.ts = ts
                    produced = process(cur.key, value)
                    if produced is not None:
                        out.extend([(ts, v) for v in produced])
                except Exception as exc:
                    self.reject(value, exc)
            return out
        for record in records:
            try:
                self._set_key(record)
                produced = process(cur.key, record)
                if produced is not None:
                    out.extend(produced if type(produced) is list else list(produced))
            except Exception as exc:
                self.reject(record, exc)
        return out

    def on_watermark(self, watermark: int) -> list:
        fired = super().on_watermark(watermark)
        if self._sweeps:  # event-time entries expire as the watermark moves
            self.ttl.after_batch(0)
        return fired

    def _timer_time(self, ts: int | None) -> None:
        self.ttl.timer_time = ts  # event-time TTL state as at the timer (epochal.ttl.registry)
