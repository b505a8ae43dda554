"""Creates the runtime operator for a logical node (inside a task)."""
from __future__ import annotations

from epochal.graph import Node, NodeKind
from epochal.ttl.expiry import StateTtl
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.operators.keyed import KeyedProcessOperator, ReduceOperator, TtlReduceOperator
from epochal.operators.sink import SinkOperator
from epochal.query.readers import QueryableFlag
from epochal.operators.stateless import (
    FilterOperator,
    FlatMapOperator,
    MapOperator,
    TimedFilterOperator,
    TimedFlatMapOperator,
    TimedMapOperator,
)


_COLUMNAR = frozenset({NodeKind.MAP_BATCHES, NodeKind.TO_RECORDS, NodeKind.TO_BATCHES, NodeKind.AGGREGATE,
                       NodeKind.LOCAL_AGGREGATE})


def create_operator(node: Node, ctx: OperatorContext) -> RuntimeOperator:
    """Build ``node``'s runtime operator. Sources are not operators (the task owns the reader)."""
    op = _create(node, ctx)
    if node.dead_letters:
        op.enable_dead_letters()
    return op


def _create(node: Node, ctx: OperatorContext) -> RuntimeOperator:
    kind, timed = node.kind, node.timed_in  # timed: records are (timestamp, value) pairs
    if kind is NodeKind.MAP:
        return (TimedMapOperator if timed else MapOperator)(ctx, node.payload)
    if kind is NodeKind.FLAT_MAP:
        return (TimedFlatMapOperator if timed else FlatMapOperator)(ctx, node.payload)
    if kind is NodeKind.FILTER:
        return (TimedFilterOperator if timed else FilterOperator)(ctx, node.payload)
    if kind is NodeKind.REDUCE:  # extra: (initial?, StateTtl?, QueryableFlag?)
        extra, ttl = node.extra, None
        queryable = bool(extra) and isinstance(extra[-1], QueryableFlag)
        if queryable:
            extra = extra[:-1]
        if extra and isinstance(extra[-1], StateTtl):
            extra, ttl = extra[:-1], extra[-1]
        if ttl is not None:
            return TtlReduceOperator(ctx, node.key_fn, node.payload, *extra, timed=timed, ttl=ttl,
                                     queryable=queryable)
        return ReduceOperator(ctx, node.key_fn, node.payload, *extra, timed=timed, queryable=queryable)
    if kind is NodeKind.PROCESS:
        return KeyedProcessOperator(ctx, node.key_fn, node.payload, timed=timed)
    if kind is NodeKind.SINK:  # batches keep event time in a column, never in pairs
        return SinkOperator(ctx, node.payload, timed=timed and not node.columnar)
    if kind is NodeKind.WATERMARKS:
        if node.columnar:
            from epochal.columnar.time import ColumnWatermarkOperator

            return ColumnWatermarkOperator(ctx, node.payload)
        from epochal.time.assign import WatermarkOperator

        return WatermarkOperator(ctx, node.payload, timed)
    if kind in _COLUMNAR:
        from epochal.columnar.operators import create_columnar_operator

        return create_columnar_operator(ctx, node)
    if kind is NodeKind.WINDOW and node.columnar:
        from epochal.columnar.sessions import ColumnSessionOperator, ColumnSessionSpec
        from epochal.columnar.windows import ColumnWindowOperator

        if isinstance(node.payload, ColumnSessionSpec):
            return ColumnSessionOperator(ctx, node.payload)
        if node.payload.panes.processing_time:
            from epochal.columnar.processing_windows import ColumnProcessingWindowOperator

            return ColumnProcessingWindowOperator(ctx, node.payload)
        return ColumnWindowOperator(ctx, node.payload)
    if kind is NodeKind.WINDOW:
        from epochal.windows.operator import create_window_operator

        return create_window_operator(ctx, node)
    if kind is NodeKind.BROADCAST_PROCESS:
        from epochal.broadcast.operator import BroadcastProcessOperator

        return BroadcastProcessOperator(ctx, node.payload, timed=timed)
    if kind is NodeKind.KEYED_BROADCAST_PROCESS:
        from epochal.broadcast.operator import KeyedBroadcastProcessOperator

        return KeyedBroadcastProcessOperator(ctx, node.key_fn, node.payload, timed=timed)
    if kind is NodeKind.KEYED_CO_PROCESS and node.columnar:  # the vectorized joins
        from epochal.columnar.join_build import join_operator

        return join_operator(node.payload)(ctx, node.payload, *node.extra)
    if kind in (NodeKind.CO_PROCESS, NodeKind.KEYED_CO_PROCESS):
        from epochal.coprocess.operator import create_co_operator

        return create_co_operator(ctx, node)
    if kind is NodeKind.LOOP_HEAD:
        from epochal.loops.head import LoopHeadOperator

        return LoopHeadOperator(ctx)
    raise ValueError(f"operator {node.name!r}: kind {kind} has no runtime operator")
