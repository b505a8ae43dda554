"""Creates the runtime operator for a logical node (inside a task)."""
from __future__ import annotations

from epochal.graph import Node, NodeKind
from epochal.operators.base import OperatorContext, RuntimeOperator
from epochal.operators.keyed import KeyedProcessOperator, ReduceOperator
from epochal.operators.sink import SinkOperator
from epochal.operators.stateless import FilterOperator, FlatMapOperator, MapOperator


def create_operator(node: Node, ctx: OperatorContext) -> RuntimeOperator:
    """Build ``node``'s runtime operator. Sources are not operators (the task owns the reader)."""
    kind = node.kind
    if kind is NodeKind.MAP:
        return MapOperator(ctx, node.payload)
    if kind is NodeKind.FLAT_MAP:
        return FlatMapOperator(ctx, node.payload)
    if kind is NodeKind.FILTER:
        return FilterOperator(ctx, node.payload)
    if kind is NodeKind.REDUCE:
        return ReduceOperator(ctx, node.key_fn, node.payload, *node.extra)
    if kind is NodeKind.PROCESS:
        return KeyedProcessOperator(ctx, node.key_fn, node.payload)
    if kind is NodeKind.SINK:
        return SinkOperator(ctx, node.payload)
    if kind is NodeKind.LOOP_HEAD:
        from epochal.loops.head import LoopHeadOperator

        return LoopHeadOperator(ctx)
    raise ValueError(f"operator {node.name!r}: kind {kind} has no runtime operator")
