"""What a window computes: the user's function, and the results it emits.

Three ways, as in Flink, behind one small *combiner* interface the operator uses
(``add`` a value to an accumulator, ``merge`` two accumulators — panes of a sliding
window, merging sessions — and turn an accumulator into ``results``):

* ``.reduce(name, fn)`` — ``fn(a, b)`` combines two values of the same type; it must be
  associative (panes and sessions are combined in any grouping). One value per window.
* ``.aggregate(name, AggregateFunction)`` — ``create()``, ``add(acc, value)``,
  ``merge(a, b)``, ``result(acc)``: an accumulator of another type (e.g. an average's
  sum and count). One accumulator per window (pane), never the elements.
* ``.process(name, fn)`` — ``fn(key, window, elements)`` sees every element of the window
  (in pane order, and in arrival order within a pane) and returns an iterable of values;
  the only way that keeps the elements in state.

Every value becomes one :class:`WindowResult` ``(key, start, end, value)``, with ``start``
and ``end`` in seconds (``end`` exclusive); its event time is ``end - 1 µs``, so windows can
be cascaded.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, NamedTuple

__all__ = ["AggregateFunction", "Window", "WindowResult"]


class Window(NamedTuple):
    """A window ``[start, end)`` in seconds."""

    start: float
    end: float


class WindowResult(NamedTuple):
    """One result of one window of one key (written as a dict by ``FileSink``)."""

    key: Any
    start: float
    end: float
    value: Any


class AggregateFunction:
    """Incremental aggregation with its own accumulator type (Flink's ``AggregateFunction``).

    Example — the average of each window::

        class Mean(AggregateFunction):
            def create(self): return (0.0, 0)
            def add(self, acc, value): return (acc[0] + value, acc[1] + 1)
            def merge(self, a, b): return (a[0] + b[0], a[1] + b[1])
            def result(self, acc): return acc[0] / acc[1]

    Accumulators are kept in keyed state: return new values (or mutate and return the
    accumulator you were given); they must be picklable.
    """

    def create(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, value: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc


class Combiner:
    """The operator's view of the user's function (see the module docstring)."""

    kind = ""

    def add(self, acc: Any, value: Any, empty: bool) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def results(self, key, window: Window, acc: Any) -> Iterable:
        raise NotImplementedError


class ReduceCombiner(Combiner):
    kind = "reduce"

    def __init__(self, fn: Callable):
        self.fn = fn

    def add(self, acc, value, empty):
        return value if empty else self.fn(acc, value)

    def merge(self, a, b):
        return self.fn(a, b)

    def results(self, key, window, acc):
        return (acc,)


class AggregateCombiner(Combiner):
    kind = "aggregate"

    def __init__(self, agg: AggregateFunction):
        self.agg = agg

    def add(self, acc, value, empty):
        return self.agg.add(self.agg.create() if empty else acc, value)

    def merge(self, a, b):
        return self.agg.merge(a, b)

    def results(self, key, window, acc):
        return (self.agg.result(acc),)


class ProcessCombiner(Combiner):
    kind = "process"

    def __init__(self, fn: Callable):
        self.fn = fn

    def add(self, acc, value, empty):
        if empty:
            return [value]
        acc.append(value)
        return acc

    def merge(self, a, b):
        return a + b

    def results(self, key, window, acc):
        produced = self.fn(key, window, acc)
        if produced is None:
            return ()
        if isinstance(produced, (str, bytes)):
            raise TypeError(f"window process function returned a {type(produced).__name__}; it must return an "
                            "iterable of values (wrap one value in a list)")
        return produced
