"""``Stream.iterate``: how a pipeline author builds a loop, and the build-time checks.

The loop becomes one logical node — the Loop Head (kind ``LOOP_HEAD``, a pass-through) —
whose inputs are the loop's input stream plus the ``feedback`` stream's producers, marked
``feedback=True``. Those feedback inputs are the graph's only back-edges: every other
input must name an operator defined earlier (checked in ``Dataflow._add``), so a cycle
that does not pass through a feedback input cannot be built.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, NodeKind
from epochal.streams import Stream, register_builder


@dataclass(frozen=True)
class LoopOptions:
    """Per-loop settings carried by the head node."""

    log_memory_records: int = 100_000


@register_builder("iterate")
def build_loop(stream, name: str, body, parallelism, log_memory_records: int):
    if not callable(body):
        raise PipelineDefinitionError(f"iterate {name!r}: body must be a function Stream -> (feedback, output)")
    if not isinstance(log_memory_records, int) or isinstance(log_memory_records, bool) or log_memory_records < 1:
        raise PipelineDefinitionError(f"iterate {name!r}: log_memory_records must be an integer >= 1, "
                                      f"got {log_memory_records!r}")
    flow = stream.flow
    head = stream._then(NodeKind.LOOP_HEAD, name, LoopOptions(log_memory_records), parallelism, accepts="any")
    result = body(Stream(flow, (Input(head.name, FORWARD),)))
    if (not isinstance(result, tuple) or len(result) != 2
            or not all(isinstance(s, Stream) and s.flow is flow for s in result)):
        raise PipelineDefinitionError(
            f"iterate {name!r}: body must return a tuple (feedback, output) of two streams of dataflow "
            f"{flow.name!r}, got {type(result).__name__}")
    feedback, output = result
    ports = feedback._ports
    if any(p.node == name for p in ports):
        raise PipelineDefinitionError(
            f"iterate {name!r}: the feedback stream is the loop's input itself; records would circulate "
            "forever without reaching an operator. Feed back the output of an operator of the body")
    inside = _downstream_of(flow, name)
    outside = [p.node for p in ports if p.node not in inside]
    if outside:
        raise PipelineDefinitionError(
            f"iterate {name!r}: the feedback stream comes from {', '.join(map(repr, outside))}, which does not "
            "read the loop's input; the feedback must be computed from the stream the body receives")
    if feedback._timed(name) != head.timed_in or feedback._columnar(name) != head.columnar:
        raise PipelineDefinitionError(
            f"iterate {name!r}: the feedback stream must carry the same kind of records as the loop's input "
            "(with or without event time; records or Arrow batches)")
    fb_inputs = tuple(replace(p, feedback=True) for p in ports)
    flow._nodes[name] = replace(flow._nodes[name], inputs=flow._nodes[name].inputs + fb_inputs)
    return output


def _downstream_of(flow, start: str) -> set[str]:
    """Operators reachable from ``start`` along forward (non-feedback) edges."""
    reach = {start}
    for node in flow._nodes.values():  # insertion order is a topological order of forward edges
        if any(not i.feedback and i.node in reach for i in node.inputs):
            reach.add(node.name)
    return reach
