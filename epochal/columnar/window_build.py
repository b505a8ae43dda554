"""Building columnar windows into the graph: ``key_by("k").window(Tumbling("10s"))
.aggregate("w", n=count(), ...)`` on a stream of Arrow batches — the checks made when the
graph is built (what windows of batches do and refuse, naming the fix), the optional
``<name>.local`` partial aggregate before the shuffle, and the ``WINDOW`` node's payload
(:class:`ColumnWindowSpec`) that :class:`~epochal.columnar.windows.ColumnWindowOperator`
runs (:mod:`epochal.columnar.windows` describes the semantics).
"""
from __future__ import annotations

from dataclasses import dataclass

from epochal.columnar.panes import STAMP, PaneLocal
from epochal.columnar.time import ColumnTime, event_time_of
from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, NodeKind
from epochal.streams import Stream, register_builder
from epochal.time.units import duration_micros
from epochal.windows.assigners import PaneSpec, Session, Sliding, Tumbling

__all__ = ["ARRIVAL", "EVENT", "PROCESSING", "ColumnWindowOutput", "ColumnWindowSpec", "ColumnWindowedStream"]

ARRIVAL = "\x00arrival"  # processing-time ttl: the wall clock (µs) at which a row arrived
#: the clocks of a window's ttl
EVENT, PROCESSING = "event", "processing"


@dataclass(frozen=True)
class ColumnWindowSpec:
    """The payload of a columnar ``WINDOW`` node."""

    column: str  # the key column
    time: ColumnTime | None  # None: processing-time windows on an input without event time
    panes: PaneSpec
    aggregations: dict
    budget_bytes: int = 64 << 20
    #: ttl of the keys' panes (µs), or None; then ``aggregations`` ends with STAMP
    ttl_us: int | None = None
    #: the ttl's clock: "event" (STAMP is the newest event time) or "processing" (the newest arrival)
    ttl_time: str = EVENT
    #: the input batches are partials of a ``<name>.local`` node (:class:`PaneLocal`), not raw rows
    partial_input: bool = False
    #: allowed lateness (µs): a fired window keeps its panes this much longer and fires
    #: again, updated, when rows of it arrive (:mod:`epochal.columnar.windows`)
    lateness_us: int = 0


@register_builder("columnar.window")
def window_batches(keyed, assigner, allowed_lateness, ttl=None) -> "ColumnWindowedStream":
    """``KeyedStream.window`` on a stream of Arrow batches."""
    return ColumnWindowedStream(keyed, assigner, allowed_lateness, ttl)


def _window_ttl(where: str, ttl) -> tuple[str, int] | None:
    """``(time, µs)`` of a columnar window's ``ttl=``, checked at build time."""
    from epochal.windows.ttl import checked_ttl

    config = checked_ttl(ttl, where)
    if config is None:
        return None
    return config.time, config.ttl_us


class ColumnWindowedStream:
    """``key_by(column).window(assigner)`` on a columnar stream; finish with
    :meth:`aggregate` (see the module docstring)."""

    def __init__(self, keyed, assigner, allowed_lateness, ttl=None):
        self._keyed = keyed
        self._assigner = assigner
        self._lateness = allowed_lateness
        self._ttl = ttl

    def aggregate(self, name: str, *, parallelism: int | None = None, budget_bytes: int = 64 << 20,
                  queryable: bool = False, local: bool = False, checkpoints=None,
                  **aggregations) -> "ColumnWindowOutput":
        """One row per key and window: ``aggregate("w", n=count(), total=sum("v"))``.
        ``queryable=True`` is refused: windows of batches are not queryable yet.

        ``local=True`` adds ``<name>.local`` before the shuffle, chained into the producer's
        task: each batch becomes one partial row per (key, pane) — its aggregations'
        partials and the pane's newest event time, so the row stays in its pane and is late
        exactly when its rows would be (:class:`PaneLocal`) — and only those cross to the
        window (Spark's partial aggregation before its exchange). The output is the same;
        ``.late()`` then carries late *partial* rows (key, event time, partial columns), not
        the input rows. Not with a ``ttl``."""
        from epochal.columnar.aggregates import Aggregation

        keyed, assigner, where = self._keyed, self._assigner, f"window {name!r}"
        if checkpoints is not None:  # eventual checkpoints (epochal.eventual) are on the record path
            raise PipelineDefinitionError(
                f"{where}: eventual checkpoints work on records, not Arrow batches: use to_records(...) before "
                "key_by, then window(...).aggregate(name, AggregateFunction, checkpoints=ep.Eventual(...))")
        if queryable is not False:
            raise PipelineDefinitionError(
                f"{where}: windows of Arrow batches are not queryable yet; for queryable windows use "
                "to_records(...), then key_by(...).window(...).aggregate(name, fn, queryable=True) (state 'windows')")
        if not isinstance(assigner, (Tumbling, Sliding, Session)):
            raise PipelineDefinitionError(f"{where}: on Arrow batches, windows are Tumbling(...), Sliding(...) or "
                                          f"Session(...); for {type(assigner).__name__} use to_records(...) and the "
                                          "record path")
        try:
            lateness = duration_micros(self._lateness, f"{where}: allowed_lateness")
        except Exception as exc:
            raise PipelineDefinitionError(str(exc)) from None
        if lateness < 0:
            raise PipelineDefinitionError(f"{where}: allowed_lateness must not be negative, got {self._lateness!r}")
        processing, timed = assigner.processing_time, keyed._timed(name)
        if processing and lateness:
            raise PipelineDefinitionError(f"{where}: allowed_lateness applies to event-time windows only")
        if not processing and not timed:
            raise PipelineDefinitionError(f"{where} uses event time but its input has none: call "
                                          ".with_watermarks(name, timestamp='column') upstream"
                                          + ("" if isinstance(assigner, Session) else
                                             f", or use {type(assigner).__name__}(..., processing_time=True)"))
        if not aggregations:
            raise PipelineDefinitionError(f"{where}: name at least one aggregation, e.g. n=count()")
        column = keyed._key_fn.column
        for out, agg in aggregations.items():
            if not isinstance(agg, Aggregation):
                raise PipelineDefinitionError(f"{where}: {out}= must be an aggregation from epochal.columnar "
                                              f"(count(), sum(col), ...), got {type(agg).__name__}")
            if not agg.combinable:
                raise PipelineDefinitionError(f"{where}: {out}= is a ColumnAggregateFunction (one Python accumulator "
                                              "per key, no merge); in windows of batches write it as "
                                              "aggregate_batches(fn, columns) (add(batch), merge, result)")
            if out in (column, "window_start", "window_end"):
                raise PipelineDefinitionError(f"{where}: output column {out!r} is taken; name the aggregation "
                                              "otherwise")
        time, ttl = event_time_of(keyed, where) if timed else None, _window_ttl(where, self._ttl)
        from epochal.columnar.selections import bind_time

        def time_column() -> str:
            if time is None:
                raise PipelineDefinitionError(f"{where}: first/last order rows by event time, and the input has "
                                              "none: name a column with first(column, time=...) or call "
                                              ".with_watermarks(...) upstream")
            return time.column

        aggregations = bind_time(aggregations, time_column, where)
        if processing:
            return self._processing(name, where, column, time, ttl, local, aggregations, parallelism, budget_bytes)
        if not isinstance(local, bool):
            raise PipelineDefinitionError(f"{where}: local must be True or False, got {local!r}")
        if local and ttl is not None:
            raise PipelineDefinitionError(f"{where}: local=True with a ttl is not supported (a key's stamp needs its "
                                          "rows); drop one of the two")
        if local and time.column in aggregations:
            raise PipelineDefinitionError(f"{where}: with local=True the partial rows carry the event-time column "
                                          f"{time.column!r}; name the aggregation otherwise")
        if lateness and ttl is not None:
            raise PipelineDefinitionError(f"{where}: allowed_lateness with a ttl is not supported on Arrow batches; "
                                          "drop one of the two, or use to_records(...) and the record path's windows")
        if isinstance(assigner, Session):
            return self._session(name, where, column, time, ttl, local, lateness, aggregations, parallelism)
        ttl_time, ttl_us = ttl if ttl is not None else (EVENT, None)
        if ttl_us is not None:
            from epochal.columnar.aggregates import max as amax

            aggregations = dict(aggregations, **{STAMP: amax(time.column if ttl_time == EVENT else ARRIVAL)})
        spec = ColumnWindowSpec(column, time, assigner.spec(), dict(aggregations), budget_bytes, ttl_us, ttl_time,
                                partial_input=local, lateness_us=lateness)
        if local:
            from epochal.streams import KeyedStream

            forward = Stream(keyed.flow, tuple(Input(p.node, FORWARD, p.feedback, p.port) for p in keyed._ports))
            partials = forward.map_batches(f"{name}.local", PaneLocal(column, time, spec.panes, spec.aggregations))
            keyed = KeyedStream(keyed.flow, partials._repartition(keyed._ports[0].partitioning), keyed._key_fn)
        node = keyed._then(NodeKind.WINDOW, name, spec, parallelism, keyed._key_fn, accepts="batches", timed=False)
        return ColumnWindowOutput(keyed.flow, (Input(node.name, FORWARD),), node.name)


    def _processing(self, name, where, column, time, ttl, local, aggregations, parallelism, budget_bytes):
        """The ``WINDOW`` node of processing-time windows (:mod:`epochal.columnar.processing_windows`)."""
        if ttl is not None:
            raise PipelineDefinitionError(f"{where}: processing-time windows of Arrow batches take no ttl; use "
                                          "to_records(...) and the record path's window(..., ttl=...)")
        if local:
            raise PipelineDefinitionError(f"{where}: local=True is for event-time windows (a row's pane is its event "
                                          "time's); drop it for processing-time windows")
        spec = ColumnWindowSpec(column, time, self._assigner.spec(), dict(aggregations), budget_bytes)
        keyed = self._keyed
        node = keyed._then(NodeKind.WINDOW, name, spec, parallelism, keyed._key_fn, accepts="batches", timed=False)
        return ColumnWindowOutput(keyed.flow, (Input(node.name, FORWARD),), node.name, processing_time=True)

    def _session(self, name, where, column, time, ttl, local, lateness, aggregations, parallelism):
        """The ``WINDOW`` node of session windows (:mod:`epochal.columnar.sessions`)."""
        if ttl is not None:
            raise PipelineDefinitionError(f"{where}: session windows of Arrow batches take no ttl; use to_records(...) "
                                          "and the record path's window(Session(...), ttl=...)")
        if local:
            raise PipelineDefinitionError(f"{where}: local=True is for Tumbling and Sliding windows (a batch's partial "
                                          "rows per pane); session windows of Arrow batches merge per batch: drop it")
        from epochal.columnar.sessions import ColumnSessionSpec

        spec = ColumnSessionSpec(column, time, self._assigner.gap, dict(aggregations), lateness)
        keyed = self._keyed
        node = keyed._then(NodeKind.WINDOW, name, spec, parallelism, keyed._key_fn, accepts="batches", timed=False)
        return ColumnWindowOutput(keyed.flow, (Input(node.name, FORWARD),), node.name)


class ColumnWindowOutput(Stream):
    """The fired windows (batches), with the late rows as a side output."""

    def __init__(self, flow, ports, operator: str, processing_time: bool = False):
        super().__init__(flow, ports)
        self._operator = operator
        self._processing_time = processing_time

    def late(self) -> Stream:
        """Rows that arrived after every window they belong to had fired (and, with
        ``allowed_lateness``, expired), unchanged
        (batches with their event-time column). Read it or they are only counted
        (``late_dropped``) and logged. Processing-time windows have none (refused)."""
        if self._processing_time:
            raise PipelineDefinitionError(f"window {self._operator!r}: processing-time windows have no late records")
        return Stream(self._flow, (Input(self._operator, FORWARD, port="late"),))


