"""``KeyedStream.interval_join`` / ``window_join`` / ``temporal_join``: how a pipeline
author builds joins, and the build-time checks. Each returns a builder finished with
``.apply(name, fn=pair)``, a keyed two-input node (:mod:`epochal.coprocess`) running a
join function (:mod:`epochal.joins.functions`).

    >>> import epochal as ep
    >>> from epochal.windows import Tumbling
    >>> flow = ep.Dataflow("bids")
    >>> bids = (flow.source("bids", ep.sources.CollectionSource([("a1", 3.0, 10)]))
    ...         .with_watermarks("bid-time", timestamp=lambda b: b[1]))
    >>> auctions = (flow.source("auctions", ep.sources.CollectionSource([("a1", 1.0, "lamp")]))
    ...             .with_watermarks("auction-time", timestamp=lambda a: a[1]))
    >>> joined = (bids.key_by(lambda b: b[0])
    ...           .interval_join(auctions.key_by(lambda a: a[0]), "-1h", 0, how="left")
    ...           .apply("bid-auction", lambda bid, auction: (bid[0], bid[2], auction and auction[2])))
"""
from __future__ import annotations

from typing import Callable

from epochal.coprocess.api import TwoInputOutput, add_two_input_node
from epochal.errors import ConfigError, PipelineDefinitionError
from epochal.graph import FORWARD, Input, NodeKind
from epochal.joins.functions import IntervalJoinFunction, TemporalJoinFunction, WindowJoinFunction, pair
from epochal.joins.interval import IntervalSpec
from epochal.streams import KeyedStream, register_builder
from epochal.time.units import duration_micros
from epochal.windows.assigners import Session, Sliding, Tumbling

__all__ = ["IntervalJoin", "JoinOutput", "TemporalJoin", "WindowJoin"]

_HOW = {"inner": (False, False), "left": (True, False), "right": (False, True), "full": (True, True)}


def _no_ttl(kind: str, ttl) -> None:
    """Interval and window joins take no ``ttl``: every buffered row is deleted once the
    watermark passes its expiry (interval) or its window's end (window), and no row can stay
    behind a watermark that moves — the watermark already bounds their state."""
    if ttl is not None:
        what = "a row is deleted once the watermark passes its match interval" if kind == "interval_join" else \
            "a window's rows are deleted once the watermark passes its end"
        raise PipelineDefinitionError(
            f"{kind}: ttl is not supported: {what}, so the watermark already bounds the join's state (a stalled "
            "watermark holds it: give the inputs an idle_timeout); drop ttl=")


def _signed_duration(value, what: str) -> int:
    """µs of a duration that may be negative (``-5``, ``"-5s"``)."""
    try:
        if isinstance(value, str) and value.strip().startswith("-"):
            return -duration_micros(value.strip()[1:], what)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            return -duration_micros(-value, what)
        return duration_micros(value, what)
    except ConfigError as exc:
        raise PipelineDefinitionError(str(exc)) from None


class _Join:
    kind = "join"
    hows = tuple(_HOW)

    def __init__(self, left, right, how: str):
        what = f"{self.kind}"
        for s, side in ((left, "this stream"), (right, "the other stream")):
            if not isinstance(s, KeyedStream):
                raise PipelineDefinitionError(f"{what}: {side} must be keyed (a.key_by(k).{self.kind}(b.key_by(k), "
                                              f"...)), got {type(s).__name__}")
        if right.flow is not left.flow:
            raise PipelineDefinitionError(f"{what}: both streams must belong to the same Dataflow")
        if how not in self.hows:
            raise PipelineDefinitionError(f"{what}: how must be one of {', '.join(map(repr, self.hows))}, got {how!r}")
        self._left, self._right, self._how = left, right, how

    def _function(self, fn):
        raise NotImplementedError

    def apply(self, name: str, fn: Callable = pair, *, parallelism: int | None = None,
              right_suffix: str = "_right") -> "JoinOutput":
        """Emit ``fn(left, right)`` for each joined pair (``None`` for the missing side of an
        outer row); returns the joined stream, whose :meth:`JoinOutput.late` holds the late rows.
        On two streams of Arrow batches the vectorized join (:mod:`epochal.columnar.joins`,
        :mod:`epochal.columnar.temporal_join`)
        emits joined rows instead (no ``fn``; ``right_suffix`` renames the right input's
        columns the left one has too)."""
        if not callable(fn):
            raise PipelineDefinitionError(f"{self.kind} {name!r}: expected a function (left, right) -> output, "
                                          f"got {fn!r}")
        columnar = [s._columnar(name) for s in (self._left, self._right)]
        if all(columnar):
            from epochal.columnar.join_build import build_column_join

            return build_column_join(self, name, fn, parallelism, right_suffix)
        for s, batches in zip((self._left, self._right), columnar):
            if batches:
                nodes = ", ".join(repr(p.node) for p in s._ports)
                raise PipelineDefinitionError(
                    f"{self.kind} {name!r}: {nodes} carries Arrow batches and the other input carries records — "
                    "convert the other input with to_batches(name, schema) for the vectorized join, or convert it "
                    f"with to_records(name) (the record-path {self.kind})")
            if not s._timed(name):
                raise PipelineDefinitionError(
                    f"{self.kind} {name!r} joins in event time but {', '.join(repr(p.node) for p in s._ports)} has no "
                    "timestamps: call .with_watermarks(name, timestamp=...) on both inputs before key_by")
        node = add_two_input_node(self._left, self._right, NodeKind.KEYED_CO_PROCESS, name, self._function(fn),
                                  parallelism)
        return JoinOutput(self._left.flow, (Input(node.name, FORWARD),), node.name, ("late",))


@register_builder("interval_join")
class IntervalJoin(_Join):
    kind = "interval_join"

    def __init__(self, left, right, lower, upper, how: str, ttl=None):
        super().__init__(left, right, how)
        _no_ttl(self.kind, ttl)
        lo = _signed_duration(lower, "interval_join: lower")
        hi = _signed_duration(upper, "interval_join: upper")
        if lo > hi:
            raise PipelineDefinitionError(f"interval_join: lower ({lower!r}) must not be after upper ({upper!r})")
        self._spec = IntervalSpec(lo, hi, *_HOW[how])

    def _function(self, fn):
        return IntervalJoinFunction(self._spec, fn)


@register_builder("window_join")
class WindowJoin(_Join):
    kind = "window_join"

    def __init__(self, left, right, assigner, how: str, ttl=None):
        super().__init__(left, right, how)
        _no_ttl(self.kind, ttl)
        if not isinstance(assigner, (Tumbling, Sliding, Session)):
            raise PipelineDefinitionError(f"window_join: expected Tumbling(...), Sliding(...) or Session(...) from "
                                          f"epochal.windows, got {type(assigner).__name__}")
        if getattr(assigner, "processing_time", False):
            raise PipelineDefinitionError("window_join: windows join in event time; drop processing_time=True")
        self._spec = assigner.spec()

    def _function(self, fn):
        return WindowJoinFunction(self._spec, *_HOW[self._how], fn)


@register_builder("temporal_join")
class TemporalJoin(_Join):
    kind = "temporal_join"
    hows = ("inner", "left")

    def __init__(self, left, table, how: str, is_delete, ttl=None):
        super().__init__(left, table, how)
        if is_delete is not None and not callable(is_delete) and not isinstance(is_delete, str):
            raise PipelineDefinitionError(f"temporal_join: is_delete must be a function row -> bool (records) or the "
                                          f"name of a boolean column (Arrow batches), got {is_delete!r}")
        self._is_delete = is_delete
        self._ttl = _join_ttl(ttl)

    def _function(self, fn):
        if isinstance(self._is_delete, str):
            raise PipelineDefinitionError(f"temporal_join: is_delete={self._is_delete!r} names a column, which only "
                                          "streams of Arrow batches have: on records it is a function row -> bool")
        return TemporalJoinFunction(self._how == "left", self._is_delete, fn, self._ttl)


def _join_ttl(ttl) -> tuple | None:
    """``(time, ttl_us)`` of a temporal join's ``ttl=``, checked at build time."""
    from epochal.ttl.expiry import ON_READ_AND_WRITE, StateTtl

    try:
        config = StateTtl.coerce(ttl, "temporal_join: ttl")
    except ConfigError as exc:
        raise PipelineDefinitionError(str(exc)) from None
    if config is None:
        return None
    if config.update == ON_READ_AND_WRITE:
        raise PipelineDefinitionError("temporal_join: ttl update='read_and_write' does not apply (a probe reading "
                                      "the table is not activity of the key); use update='write'")
    return (config.time, config.ttl_us)


class JoinOutput(TwoInputOutput):
    """The joined stream; :meth:`late` holds the rows that came too late to join."""

    def late(self):
        """``("left" | "right", row)`` for every row at or behind the join's watermark when
        it arrived (with its timestamp). Read it, or they are only counted (``late_dropped``)."""
        return self.side_output("late")
