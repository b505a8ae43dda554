"""Keyed stateful operators: ``reduce`` and the general ``process`` with keyed state.

Keyed state is partitioned by key group (seed 004 §4.2.1): every access goes to the
task's :class:`~epochal.backends.base.KeyedStateBackend` under the current record's key
group, so a snapshot (and a later rescale) can be cut per key group.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from epochal.backends.keygroups import key_group_for
from epochal.operators.base import OperatorContext, RuntimeOperator

_MISSING = object()


class _CurrentKey:
    """The key (and its key group) of the record being processed; set by the operator."""

    __slots__ = ("key", "kg")

    def __init__(self):
        self.key = None
        self.kg = -1


class ValueState:
    """One value per key. Contract: treat a value returned by :meth:`value` as read-only
    unless you :meth:`update` it afterwards; the backend protects pending snapshots
    from in-place mutation either way."""

    __slots__ = ("_backend", "_name", "_cur", "_default")

    def __init__(self, backend, name: str, current: _CurrentKey, default: Any):
        self._backend, self._name, self._cur, self._default = backend, name, current, default

    def value(self) -> Any:
        return self._backend.get(self._name, self._cur.kg, self._cur.key, self._default)

    def update(self, value: Any) -> None:
        self._backend.put(self._name, self._cur.kg, self._cur.key, value)

    def clear(self) -> None:
        self._backend.delete(self._name, self._cur.kg, self._cur.key)


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

    def __init__(self, ctx: OperatorContext, current: _CurrentKey):
        self._ctx = ctx
        self._current = current
        self._declared: set[str] = set()
        self.subtask = ctx.subtask
        self.parallelism = ctx.parallelism

    def _scoped(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            raise ValueError(f"operator {self._ctx.operator!r}: state name must be a non-empty string, got {name!r}")
        if name in self._declared:
            raise ValueError(f"operator {self._ctx.operator!r}: state {name!r} declared twice")
        self._declared.add(name)
        return f"{self._ctx.operator}/{name}"

    def value_state(self, name: str, default: Any = None) -> ValueState:
        return ValueState(self._ctx.keyed_backend, self._scoped(name), self._current, default)

    def map_state(self, name: str) -> MapState:
        return MapState(self._ctx.keyed_backend, self._scoped(name), self._current)


class KeyedProcessFunction:
    """Base class for the general keyed stateful operator (``KeyedStream.process``).

    Example:
        >>> class Count(KeyedProcessFunction):
        ...     def open(self, ctx):
        ...         self.n = ctx.value_state("n", default=0)
        ...     def process(self, key, value):
        ...         self.n.update(self.n.value() + 1)
        ...         yield (key, self.n.value())

    ``open`` is called once per task before any record (declare state there);
    ``process(key, value)`` returns an iterable of output records (or ``None``). State
    read and written in ``process`` belongs to ``key``. The function object is copied
    into every task, so per-instance attributes other than state handles are not
    checkpointed: keep everything that must survive a failure in state.
    """

    def open(self, ctx: StateContext) -> None:
        pass

    def process(self, key, value) -> Iterable | None:
        raise NotImplementedError


class _KeyedOperator(RuntimeOperator):
    def __init__(self, ctx: OperatorContext, key_fn: Callable):
        super().__init__(ctx)
        self.key_fn = key_fn
        self.current = _CurrentKey()
        self.max_parallelism = ctx.max_parallelism

    def _set_key(self, record) -> None:
        key = self.key_fn(record)
        self.current.key = key
        self.current.kg = key_group_for(key, self.max_parallelism)


class ReduceOperator(_KeyedOperator):
    """Keyed rolling reduce: ``acc = fn(acc, record)`` per key (the first record is the
    initial accumulator unless ``initial`` is given); emits the new accumulator."""

    def __init__(self, ctx, key_fn, fn, initial=_MISSING):
        super().__init__(ctx, key_fn)
        self.fn = fn
        self.initial = initial
        self.state = f"{ctx.operator}/acc"

    def process_batch(self, records: list) -> list:
        backend, fn, state, initial = self.ctx.keyed_backend, self.fn, self.state, self.initial
        cur = self.current
        out = []
        record = None
        try:
            for record in records:
                self._set_key(record)
                acc = backend.get(state, cur.kg, cur.key, _MISSING)
                if acc is _MISSING:
                    acc = record if initial is _MISSING else fn(initial, record)
                else:
                    acc = fn(acc, record)
                backend.put(state, cur.kg, cur.key, acc)
                out.append(acc)
        except Exception as exc:
            raise self.fail(record, exc) from exc
        return out


class KeyedProcessOperator(_KeyedOperator):
    """Runs a :class:`KeyedProcessFunction` with its declared keyed state."""

    def __init__(self, ctx, key_fn, function: KeyedProcessFunction):
        super().__init__(ctx, key_fn)
        self.function = function
        function.open(StateContext(ctx, self.current))

    def process_batch(self, records: list) -> list:
        process = self.function.process
        cur = self.current
        out = []
        record = None
        try:
            for record in records:
                self._set_key(record)
                produced = process(cur.key, record)
                if produced is not None:
                    out.extend(produced)
        except Exception as exc:
            raise self.fail(record, exc) from exc
        return out
