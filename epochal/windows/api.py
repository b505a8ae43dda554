"""``KeyedStream.window(...)``: how a pipeline author builds windows, and the build-time checks.

    >>> import epochal as ep
    >>> from epochal.windows import Tumbling
    >>> flow = ep.Dataflow("clicks")
    >>> clicks = flow.source("in", ep.sources.CollectionSource([("u1", 3.0), ("u1", 7.5)]))
    >>> per_user = (clicks.with_watermarks("ts", timestamp=lambda c: c[1], max_out_of_orderness="2s")
    ...                   .key_by(lambda c: c[0])
    ...                   .window(Tumbling("5s"), allowed_lateness="10s")
    ...                   .aggregate("count", ep.windows.Count()))
    >>> per_user.sink("out", ep.sinks.FileSink("/tmp/clicks-out"))
    >>> per_user.late().sink("late", ep.sinks.FileSink("/tmp/clicks-late"))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, NodeKind
from epochal.streams import Stream, builder, register_builder
from epochal.time.units import duration_micros
from epochal.windows.assigners import Session, Sliding, Tumbling
from epochal.windows.functions import (
    AggregateCombiner,
    AggregateFunction,
    Combiner,
    ProcessCombiner,
    ReduceCombiner,
)

__all__ = ["WindowNode", "WindowOutput", "WindowedStream"]


@dataclass(frozen=True)
class WindowNode:
    """The payload of a ``WINDOW`` node."""

    spec: Any  # PaneSpec or SessionSpec
    combiner: Combiner
    lateness: int  # µs
    assigner: str  # repr, for messages
    ttl: Any = None  # StateTtl of the keys' inactivity (epochal.windows.ttl), or None
    queryable: bool = False  # lookups of each key's open windows (epochal.windows.queries)


@register_builder("window")
class WindowedStream:
    """A keyed stream cut into windows; finish it with :meth:`reduce`, :meth:`aggregate` or
    :meth:`process` (each returns a :class:`WindowOutput` of
    :class:`~epochal.windows.WindowResult`)."""

    def __init__(self, keyed, assigner, allowed_lateness, ttl=None):
        if not isinstance(assigner, (Tumbling, Sliding, Session)):
            raise PipelineDefinitionError(
                f"window: expected Tumbling(...), Sliding(...) or Session(...) from epochal.windows, "
                f"got {type(assigner).__name__}")
        self._keyed = keyed
        self._assigner = assigner
        self._lateness = allowed_lateness
        self._ttl = ttl

    def reduce(self, name: str, fn: Callable, *, parallelism: int | None = None,
               queryable: bool = False) -> "WindowOutput":
        """One value per window: ``fn(a, b)``, associative, folds the window's values.
        ``queryable``: a running job answers lookups of each key's open windows, as state
        ``"windows"`` (:mod:`epochal.windows.queries`, docs/queryable-state.md)."""
        if not callable(fn):
            raise PipelineDefinitionError(f"window reduce {name!r}: expected a function, got {fn!r}")
        return self._build(name, ReduceCombiner(fn), parallelism, queryable)

    def aggregate(self, name: str, function: AggregateFunction, *, parallelism: int | None = None,
                  queryable: bool = False, checkpoints=None) -> "WindowOutput":
        """One accumulator per window (:class:`~epochal.windows.AggregateFunction`).
        ``queryable``: as in :meth:`reduce` (a window reads as ``function.result(acc)``).
        ``checkpoints``: ``epochal.Eventual(...)`` checkpoints each window on its own schedule
        in the operator's persisted output instead of epoch snapshots (seed 003,
        docs/eventual.md); then a plain :class:`~epochal.Stream` of results is returned."""
        if not isinstance(function, AggregateFunction):
            raise PipelineDefinitionError(f"window aggregate {name!r}: expected an epochal.windows.AggregateFunction "
                                          f"instance, got {type(function).__name__}")
        if checkpoints is not None:
            if queryable:
                raise PipelineDefinitionError(f"window {name!r}: queryable windows with eventual checkpoints are not "
                                              "supported; drop one of the two")
            return builder("eventual.window")(self, name, function, checkpoints, parallelism)
        return self._build(name, AggregateCombiner(function), parallelism, queryable)

    def process(self, name: str, fn: Callable, *, parallelism: int | None = None,
                queryable: bool = False) -> "WindowOutput":
        """``fn(key, window, elements)`` → iterable of values, over all of a window's elements.
        ``queryable``: as in :meth:`reduce` (a window reads as its list of elements)."""
        if not callable(fn):
            raise PipelineDefinitionError(f"window process {name!r}: expected a function, got {fn!r}")
        return self._build(name, ProcessCombiner(fn), parallelism, queryable)

    def _build(self, name: str, combiner: Combiner, parallelism, queryable: bool = False) -> "WindowOutput":
        keyed, assigner = self._keyed, self._assigner
        timed_in = keyed._timed(name)
        where = f"window {name!r}"
        if not isinstance(queryable, bool):
            raise PipelineDefinitionError(f"{where}: queryable must be True or False, got {queryable!r}")
        if not assigner.processing_time and not timed_in:
            raise PipelineDefinitionError(
                f"{where} uses event time ({assigner!r}) but its input has no timestamps: call "
                f".with_watermarks(name, timestamp=...) upstream, or use {type(assigner).__name__}(..., "
                "processing_time=True)")
        try:
            lateness = duration_micros(self._lateness, f"{where}: allowed_lateness")
        except Exception as exc:
            raise PipelineDefinitionError(str(exc)) from None
        if lateness and assigner.processing_time:
            raise PipelineDefinitionError(f"{where}: allowed_lateness applies to event-time windows only")
        ttl = self._window_ttl(where, timed_in)
        if ttl is not None and queryable:
            raise PipelineDefinitionError(f"{where}: queryable windows with a ttl are not supported yet (a query could "
                                          "read a key whose windows expired); drop one of the two")
        payload = WindowNode(assigner.spec(), combiner, lateness, repr(assigner), ttl, queryable)
        node = keyed._then(NodeKind.WINDOW, name, payload, parallelism, keyed._key_fn,
                           timed=timed_in or not assigner.processing_time)
        return WindowOutput(keyed.flow, (Input(node.name, FORWARD),), node.name, assigner.processing_time)

    def _window_ttl(self, where: str, timed_in: bool):
        """``ttl=`` checked at build time (:mod:`epochal.windows.ttl`)."""
        from epochal.ttl.expiry import EVENT
        from epochal.windows.ttl import checked_ttl

        config = checked_ttl(self._ttl, where)
        if config is None:
            return None
        if config.time == EVENT and (self._assigner.processing_time or not timed_in):
            raise PipelineDefinitionError(f"{where}: event-time ttl needs event-time windows on an input with "
                                          "timestamps (with_watermarks upstream); use time='processing'")
        return config


class WindowOutput(Stream):
    """The results of a window operator (a stream of :class:`~epochal.windows.WindowResult`),
    with its late records as a side output."""

    def __init__(self, flow, ports, operator: str, processing_time: bool):
        super().__init__(flow, ports)
        self._operator = operator
        self._processing_time = processing_time

    def late(self):
        """The input records that arrived after every window they belong to expired
        (``end - 1 + allowed_lateness <= watermark``), unchanged, with their timestamps.
        Read it (e.g. ``.sink(...)``) or they are only counted (``late_dropped`` in the
        job's task metrics) and logged."""
        if self._processing_time:
            raise PipelineDefinitionError(f"window {self._operator!r}: processing-time windows have no late records")
        return Stream(self._flow, (Input(self._operator, FORWARD, port="late"),))
