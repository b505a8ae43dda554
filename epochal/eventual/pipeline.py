"""The author's opt-in: ``keyed.window(...).aggregate(name, fn, checkpoints=ep.Eventual(...))``
— a window aggregation with continuous eventual checkpoints (seed 003) instead of epoch
snapshots, and the build-time checks that say what cannot have them and why.

    >>> import epochal as ep
    >>> from epochal.windows import Sum, Tumbling
    >>> flow = ep.Dataflow("clicks")
    >>> clicks = flow.source("in", ep.sources.CollectionSource([("u1", 1.0, 3), ("u2", 2.5, 4)]))
    >>> per_user = (clicks.with_watermarks("ts", timestamp=lambda c: c[1])
    ...                   .key_by(lambda c: c[0])
    ...                   .window(Tumbling("5s"))
    ...                   .aggregate("sum", Sum(lambda c: c[2]),
    ...                              checkpoints=ep.Eventual(budget=0.05, max_extent="30s")))
    >>> sorted(flow.nodes)           # the source and its timestamps are the operator's own input now
    ['sum']

What the builder does (docs/eventual.md, "In a job"): the operator reads its input itself,
since recovery asks the *input* to replay from T (seed 003 §II.B), so the source and its
``with_watermarks`` become part of it and the job gets one source node named after the window
operator (:class:`~epochal.eventual.source.EventualWindowSource`); everything downstream is an
ordinary epoch region. The ``map`` / ``filter`` / ``flat_map`` operators between the source and
``key_by`` go into the operator too (:mod:`~epochal.eventual.chain`: they run again on the
records replayed after T, so they must be deterministic per record). It refuses, naming the
operator: processing-time windows, allowed lateness, ttl, any other operator between the source
and ``key_by`` (:func:`~epochal.eventual.chain.input_chain`), and a source that cannot be
replayed from an event-time position (it names the source).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from epochal.errors import ConfigError, PipelineDefinitionError
from epochal.eventual import operator_state as cec
from epochal.eventual.chain import Chain, Mapped, input_chain
from epochal.eventual.extent import ExtentPolicy
from epochal.eventual.records import Result
from epochal.eventual.source import EventualWindowSource, ReadAll
from epochal.sources.collection import CollectionSource
from epochal.streams import register_builder
from epochal.time.units import duration_micros, to_micros
from epochal.windows.assigners import Session, Sliding, Tumbling
from epochal.windows.functions import AggregateFunction, WindowResult

__all__ = ["Eventual"]

#: µs per unit of a numeric timestamp, as ``with_watermarks(timestamp_unit=)`` reads it
_UNIT_US = {"ms": 1_000, "us": 1}


@dataclass(frozen=True)
class Eventual:
    """Continuous eventual checkpoints for one window aggregation (seed 003).

    Args:
        budget: the fraction of the operator's time its Gchecks may take ("how much time to
            devote ... to checkpointing").
        max_extent: a duration (``"30s"``, seconds): a window whose latest footprint lags the
            newest input by that much is checkpointed at once, past the budget ("when is
            checkpointing necessary for the slowest windows"); ``None``: budget only.
        flush_every: input tuples per flush of the output queue (one segment; results reach
            downstream when flushed).
        storage: the logs' root; ``None``: the job's checkpoint storage.
        splits: CEC operators (one log each) over the key space; ``None``: the window's
            parallelism. Fixed for the logs' lifetime: a job restored at another parallelism
            keeps it (each subtask runs the splits ``j`` with ``j % parallelism == subtask``),
            so set it to the largest parallelism the job will rescale to.

    Raises:
        ConfigError: a value out of range, naming it.
    """

    budget: float = 0.05
    max_extent: Any = None
    flush_every: int = 1000
    storage: str | None = None
    splits: int | None = None

    def __post_init__(self):
        if isinstance(self.flush_every, bool) or not isinstance(self.flush_every, int) or self.flush_every < 1:
            raise ConfigError(f"Eventual: flush_every must be an int >= 1, got {self.flush_every!r}")
        if self.splits is not None and (isinstance(self.splits, bool) or not isinstance(self.splits, int)
                                        or self.splits < 1):
            raise ConfigError(f"Eventual: splits must be an int >= 1 or None, got {self.splits!r}")
        self.policy()

    def policy(self) -> ExtentPolicy:
        extent = None if self.max_extent is None else duration_micros(self.max_extent, "Eventual: max_extent",
                                                                      positive=True)
        return ExtentPolicy(budget=self.budget, max_extent=extent)


class WindowAggregate:
    """An :class:`~epochal.windows.AggregateFunction` as the CEC operator's aggregate: the
    accumulator is ``(the function's accumulator, the latest timestamp)`` (a session's end)."""

    def __init__(self, function: AggregateFunction):
        self.function = function

    @property
    def zero(self):
        return (self.function.create(), None)

    def add(self, acc, item):
        value, ts = item
        return (self.function.add(acc[0], value), ts)

    def result(self, acc):
        return (self.function.result(acc[0]), acc[1])


class Windows:
    """Makes the operator (picklable: shipped to the tasks) and turns its ``R`` records into
    :class:`~epochal.windows.WindowResult` ``(key, start, end, value)`` in seconds."""

    def __init__(self, windows, function: AggregateFunction):
        self.windows, self.aggregate = windows, WindowAggregate(function)

    def __call__(self, scheduler) -> cec.EventualWindows:
        return cec.EventualWindows(self.windows, self.aggregate, closing="time", scheduler=scheduler)

    def result(self, r: Result) -> WindowResult:
        key, start = r.window
        value, last = r.value
        end = last + self.windows.gap if isinstance(self.windows, cec.Session) else self.windows.end(start)
        return WindowResult(key, start / 1e6, end / 1e6, value)


def _windows(assigner, where: str):
    if assigner.processing_time:
        raise PipelineDefinitionError(f"{where}: eventual checkpoints need event-time windows (the log is in "
                                      f"timestamp order); {assigner!r} is in processing time")
    if isinstance(assigner, Session):
        return cec.Session(assigner.gap)
    if assigner.offset:
        raise PipelineDefinitionError(f"{where}: eventual checkpoints support windows without an offset, "
                                      f"{assigner!r} has offset {assigner.offset} µs")
    if isinstance(assigner, Tumbling):
        return cec.Tumbling(assigner.size)
    if isinstance(assigner, Sliding):
        if assigner.size % assigner.slide:
            raise PipelineDefinitionError(f"{where}: eventual checkpoints need a sliding window's size to be a "
                                          f"multiple of its slide, got {assigner!r}")
        return cec.Sliding(assigner.size, assigner.slide)
    raise PipelineDefinitionError(f"{where}: no eventual checkpoints for {assigner!r}")


class _Timestamp:
    """``with_watermarks``' timestamp function, in µs."""

    def __init__(self, fn, unit: str):
        self.fn, self.unit = fn, unit

    def __call__(self, record) -> int:
        ts = self.fn(record)
        if self.unit == "s":
            return to_micros(ts)
        if self.unit == "ns":
            return int(ts) // 1000
        return int(ts) * _UNIT_US[self.unit]


def _input(keyed, where: str):
    """The source node, the nodes taken into the operator (its chain, :mod:`~epochal.eventual.chain`)
    and the replayable input the keyed stream reads, or an error naming what stands in the way."""
    src, taken, stamp, pre, post = input_chain(keyed, where)
    source = src.payload
    chain = Chain(pre, _Timestamp(stamp.payload.timestamp, stamp.payload.unit), post, where)
    if callable(getattr(source, "read_after", None)):
        if chain.fanout > 1:
            raise PipelineDefinitionError(
                f"{where}: source {src.name!r} seeks by its own positions (read_after), one position per record: "
                "a flat_map before key_by would give several records one position — flat_map inside read_after, "
                "or move it after the window")
        return src, taken, (Mapped(source, chain) if pre or post else source)
    if isinstance(source, CollectionSource) and source.schema is None:
        return src, taken, ReadAll(source, chain, where)
    raise PipelineDefinitionError(
        f"{where}: source {src.name!r} ({source.name}) cannot be replayed from an event-time position, which "
        "eventual checkpoints recover from (seed 003: replay after T); use a CollectionSource or a source with "
        "read_after(position), or epoch snapshots (no checkpoints=)")


@register_builder("eventual.window")
def build_eventual_window(windowed, name: str, function, checkpoints, parallelism):
    """``WindowedStream.aggregate(name, function, checkpoints=Eventual(...))`` (module docstring)."""
    where = f"window {name!r}"
    if not isinstance(checkpoints, Eventual):
        raise PipelineDefinitionError(f"{where}: checkpoints must be epochal.Eventual(...) or None, got "
                                      f"{type(checkpoints).__name__}")
    keyed = windowed._keyed
    if keyed.is_columnar:
        raise PipelineDefinitionError(f"{where}: eventual checkpoints work on records; on Arrow batches convert with "
                                      "to_records(...) before key_by, then window(...).aggregate(..., checkpoints=)")
    if windowed._lateness not in (0, None, "0s"):
        raise PipelineDefinitionError(f"{where}: eventual checkpoints take no allowed_lateness (windows close in "
                                      "timestamp order)")
    if windowed._ttl is not None:
        raise PipelineDefinitionError(f"{where}: eventual checkpoints take no ttl (every window closes by time)")
    windows = Windows(_windows(windowed._assigner, where), function)
    try:
        policy = checkpoints.policy()
    except ConfigError as exc:
        raise PipelineDefinitionError(f"{where}: {exc}") from None
    src, taken, replay = _input(keyed, where)
    flow = keyed.flow
    p = keyed._default_parallelism() if parallelism is None else parallelism
    splits = p if checkpoints.splits is None else checkpoints.splits
    payload = EventualWindowSource(name, replay, keyed._key_fn, windows, None, windows.result, policy, splits,
                                   checkpoints.flush_every, checkpoints.storage)
    for node in taken:  # the operator reads its source itself now, through these (key_by side first)
        flow.remove_unread(node.name)
    region = flow.remove_unread(src.name)
    return flow.source(name, payload, parallelism=p, region=region)
