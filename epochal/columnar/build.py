"""Building columnar keyed aggregates into the graph (``key_by("k").aggregate(...)``).

An aggregate whose aggregations all combine in Arrow becomes two nodes:

    producer ──forward──▶ <name>.local ──hash(key)──▶ <name>
                          (LOCAL_AGGREGATE,            (AGGREGATE: keyed state,
                           chained into the producer)   one merge per epoch)

The local node has the producer's parallelism and reads it forward, so it runs inside the
producer's tasks; it sends about one partial row per key and epoch instead of every row
across the shuffle (:mod:`epochal.columnar.partials`). It holds no state: it flushes before
every barrier, so what it received before barrier n reaches the aggregate before barrier n.
``local=False`` keeps one node (the aggregate pre-aggregates each batch itself).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, NodeKind
from epochal.streams import KeyedStream, Stream, register_builder

__all__ = ["AggregateSpec", "LocalAggregateSpec", "build_aggregate"]

#: default memory budget of an aggregate's buffer of unmerged partials (per subtask)
BUDGET_BYTES = 64 << 20


@dataclass(frozen=True)
class AggregateSpec:
    """The payload of an ``AGGREGATE`` node."""

    column: str
    aggregations: dict
    #: the input batches are partials of a ``<name>.local`` node, not raw rows
    partial_input: bool = False
    budget_bytes: int = BUDGET_BYTES
    #: StateTtl of the keys' accumulators (epochal.columnar.ttl), or None
    ttl: Any = None
    #: lookups of each key's results, state "results" (epochal.columnar.queries)
    queryable: bool = False
    #: event-time ttl: the input's event-time column (a ColumnTime), whose min and max per
    #: key are the hidden aggregations OLDEST and STAMP, last (epochal.columnar.ttl)
    ttl_time: Any = None


@dataclass(frozen=True)
class LocalAggregateSpec:
    """The payload of a ``LOCAL_AGGREGATE`` node."""

    column: str
    aggregations: dict
    budget_bytes: int = BUDGET_BYTES


@register_builder("columnar.aggregate")
def build_aggregate(keyed, name: str, parallelism, aggregations: dict, local: bool | None,
                    budget_bytes: int, ttl=None, queryable: bool = False):
    """Add the aggregate's node(s) after ``keyed`` and return the output stream."""
    from epochal.columnar.aggregates import Aggregation

    column = getattr(keyed._key_fn, "column", None)
    if not aggregations:
        raise PipelineDefinitionError(f"aggregate {name!r}: name at least one aggregation, e.g. n=count()")
    for out, agg in aggregations.items():
        if not isinstance(agg, Aggregation):
            raise PipelineDefinitionError(
                f"aggregate {name!r}: {out}= must be an aggregation from epochal.columnar (count(), sum(col), "
                f"...), got {type(agg).__name__}")
        if out == column:
            raise PipelineDefinitionError(f"aggregate {name!r}: output column {out!r} is the key column; name the "
                                          "aggregation otherwise")
    if not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool) or budget_bytes < 1:
        raise PipelineDefinitionError(f"aggregate {name!r}: budget_bytes must be a positive integer, got "
                                      f"{budget_bytes!r}")
    config = _aggregate_ttl(name, ttl)
    from epochal.columnar.selections import bind_time
    from epochal.columnar.time import event_time_of

    aggregations = bind_time(aggregations, lambda: event_time_of(keyed, f"aggregate {name!r}: first/last").column,
                             f"aggregate {name!r}")
    ttl_time = None
    if config is not None and config.time == "event":
        from epochal.columnar.aggregates import max as amax, min as amin
        from epochal.columnar.ttl import OLDEST, STAMP

        ttl_time = event_time_of(keyed, f"aggregate {name!r}: event-time ttl")
        aggregations = dict(aggregations, **{OLDEST: amin(ttl_time.column), STAMP: amax(ttl_time.column)})
    if config is not None and queryable:
        raise PipelineDefinitionError(f"aggregate {name!r}: queryable results with a ttl are not supported yet (a "
                                      "query could read a key whose accumulators expired); drop one of the two")
    if not isinstance(queryable, bool):
        raise PipelineDefinitionError(f"aggregate {name!r}: queryable must be True or False, got {queryable!r}")
    combinable = all(a.combinable for a in aggregations.values())
    if local and not combinable:
        user = [n for n, a in aggregations.items() if not a.combinable]
        raise PipelineDefinitionError(f"aggregate {name!r}: local=True needs aggregations that combine in Arrow; "
                                      f"{', '.join(map(repr, user))} use a ColumnAggregateFunction")
    upstream = keyed
    if local is None:
        local = combinable
    if local:
        forward = Stream(keyed.flow, tuple(Input(p.node, FORWARD, p.feedback, p.port) for p in keyed._ports))
        node = forward._then(NodeKind.LOCAL_AGGREGATE, f"{name}.local",
                             LocalAggregateSpec(column, dict(aggregations), budget_bytes), None, accepts="batches",
                             timed=False)
        partials = Stream(keyed.flow, (Input(node.name, FORWARD),))
        upstream = KeyedStream(keyed.flow, partials._repartition(keyed._ports[0].partitioning), keyed._key_fn)
    node = upstream._then(NodeKind.AGGREGATE, name, AggregateSpec(column, dict(aggregations), bool(local),
                                                                     budget_bytes, config, queryable, ttl_time),
                          parallelism, keyed._key_fn, accepts="batches", timed=False)
    return Stream(keyed.flow, (Input(node.name, FORWARD),))


def _aggregate_ttl(name: str, ttl):
    """``ttl=`` of a columnar aggregate, checked at build time (:mod:`epochal.columnar.ttl`)."""
    from epochal.errors import ConfigError
    from epochal.ttl.expiry import ON_READ_AND_WRITE, StateTtl

    try:
        config = StateTtl.coerce(ttl, f"aggregate {name!r}: ttl")
    except ConfigError as exc:
        raise PipelineDefinitionError(str(exc)) from None
    if config is not None and config.update == ON_READ_AND_WRITE:
        raise PipelineDefinitionError(f"aggregate {name!r}: ttl update='read_and_write' does not apply (nothing reads "
                                      "the accumulators but the merge); use update='write'")
    return config
