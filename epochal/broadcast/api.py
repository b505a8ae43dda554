"""``stream.connect_broadcast(rules).process(name, fn)``: builds the graph of broadcast state.

The broadcast input gets a tagging map (``"<name>.broadcast"``: wraps each element in
:class:`~epochal.broadcast.state.BroadcastElement`) and reaches the operator over a
BROADCAST edge; the main input keeps its partitioning (by key for a keyed stream). The
operator node reads both as one input (``BROADCAST_PROCESS``, or ``KEYED_BROADCAST_PROCESS``
on a keyed stream, whose keyed state is keyed operator state like ``process``'s).

How this sits on a general two-input operator later (``connect`` / CoProcessFunction): the
tag is what a two-input operator's input index is; once nodes carry per-input indices to
the operator, the tagging map disappears and the operator's ``process_element`` /
``process_broadcast_element`` become its ``process1`` / ``process2``, with the broadcast
snapshot (:class:`~epochal.broadcast.state.BroadcastSnapshot`) unchanged.
"""
from __future__ import annotations

from epochal.broadcast.functions import BroadcastProcessFunction, KeyedBroadcastProcessFunction
from epochal.broadcast.state import BroadcastElement
from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, Node, NodeKind, PartitionKind
from epochal.streams import KeyedStream, Stream, check_name, register_builder

__all__ = ["BroadcastConnectedStream"]


class BroadcastConnectedStream:
    """A main stream connected with a broadcast stream; :meth:`process` adds the operator."""

    def __init__(self, main: Stream, rules: Stream):
        self._main, self._rules = main, rules

    def process(self, name: str, function, *, parallelism: int | None = None) -> Stream:
        """Run ``function`` (a :class:`BroadcastProcessFunction`, or a
        :class:`KeyedBroadcastProcessFunction` on a keyed stream) as operator ``name``.

        Raises:
            PipelineDefinitionError: a wrong function type, the streams mix event time and
                none, or carry Arrow batches.
        """
        check_name(name, "operator")
        main, rules, flow = self._main, self._rules, self._main.flow
        keyed = isinstance(main, KeyedStream)
        want = KeyedBroadcastProcessFunction if keyed else BroadcastProcessFunction
        if not isinstance(function, want) or (not keyed and isinstance(function, KeyedBroadcastProcessFunction)):
            raise PipelineDefinitionError(
                f"connect_broadcast(...).process {name!r}: expected a {want.__name__} instance on a "
                f"{'keyed' if keyed else 'non-keyed'} stream, got {type(function).__name__}")
        if main._columnar(name) or rules._columnar(name):
            raise PipelineDefinitionError(f"connect_broadcast(...).process {name!r}: works on records, not Arrow "
                                          "batches; convert with to_records(...) first")
        timed, rules_timed = main._timed(name), rules._timed(name)
        if timed != rules_timed:
            raise PipelineDefinitionError(
                f"connect_broadcast(...).process {name!r}: the main stream {'has' if timed else 'has no'} event "
                f"time but the broadcast stream {'has' if rules_timed else 'has none'}; call with_watermarks on the "
                "one without (an idle_timeout keeps a quiet rules stream from holding event time back)")
        tagged = rules.map(f"{name}.broadcast", BroadcastElement, parallelism=rules._default_parallelism())
        ports = tuple(main._ports) + tuple(tagged.broadcast()._ports)
        p = main._default_parallelism() if parallelism is None else parallelism
        kind = NodeKind.KEYED_BROADCAST_PROCESS if keyed else NodeKind.BROADCAST_PROCESS
        node = flow._add(Node(name, kind, ports, p, function, main._key_fn if keyed else None,
                              timed_in=timed, timed=timed))
        return Stream(flow, (Input(node.name, FORWARD),))


@register_builder("connect_broadcast")
def connect_broadcast(main: Stream, rules: Stream) -> BroadcastConnectedStream:
    if not isinstance(rules, Stream) or rules.flow is not main.flow:
        raise PipelineDefinitionError("connect_broadcast: the broadcast stream must be a Stream of the same Dataflow")
    if any(p.partitioning.kind is not PartitionKind.FORWARD for p in rules._ports):
        raise PipelineDefinitionError("connect_broadcast: pass the broadcast stream itself, not a repartitioned one "
                                      "(it is broadcast to every subtask already)")
    return BroadcastConnectedStream(main, rules)
