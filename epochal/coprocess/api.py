"""``Stream.connect``: how a pipeline author builds a two-input operator, and the
build-time checks.

    >>> import epochal as ep
    >>> flow = ep.Dataflow("enrich")
    >>> orders = flow.source("orders", ep.sources.CollectionSource([("c1", 10), ("c2", 5)]))
    >>> customers = flow.source("customers", ep.sources.CollectionSource([("c1", "Ada")]))
    >>> enriched = (orders.key_by(lambda o: o[0])
    ...             .connect(customers.key_by(lambda c: c[0]))
    ...             .process("enrich", ep.coprocess.KeyedCoProcessFunction()))

A node with both streams' ports as its inputs; ``extra`` holds how many of them are the
first stream's, a keyed node's ``key_fn`` is the pair of key functions.
"""
from __future__ import annotations

from epochal.coprocess.functions import CoProcessFunction, KeyedCoProcessFunction
from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, NodeKind
from epochal.streams import KeyedStream, Stream, register_builder

__all__ = ["ConnectedStreams", "TwoInputOutput", "add_two_input_node"]


def _check_pair(first: Stream, second, what: str) -> None:
    if not isinstance(second, Stream) or second.flow is not first.flow:
        raise PipelineDefinitionError(f"{what}: expects a stream of the same Dataflow, got {second!r}")
    for stream in (first, second):
        if stream._columnar(what):
            raise PipelineDefinitionError(
                f"{what}: two-input operators and joins work on records, and "
                f"{', '.join(repr(p.node) for p in stream._ports)} carries Arrow batches — convert it with "
                "to_records(name) first (the record-path equivalent; interval_join and window_join of batches are vectorized)")
    if isinstance(first, KeyedStream) != isinstance(second, KeyedStream):
        raise PipelineDefinitionError(
            f"{what}: connect a keyed stream with a keyed one (a.key_by(f).connect(b.key_by(g))) or an unkeyed "
            "with an unkeyed one; to send every record of one side to every subtask, broadcast it")


def add_two_input_node(first: Stream, second: Stream, kind: NodeKind, name: str, payload, parallelism,
                       dead_letters: bool = False, timed: bool | None = None):
    """Add the node reading ``first`` (input 1) and ``second`` (input 2); returns it."""
    both = Stream(first.flow, first._ports + second._ports)
    key_fn = (first._key_fn, second._key_fn) if kind is NodeKind.KEYED_CO_PROCESS else None
    return both._then(kind, name, payload, parallelism, key_fn, (len(first._ports),), timed=timed,
                      dead_letters=dead_letters)


@register_builder("connect")
class ConnectedStreams:
    """Two streams read by one operator; finish with :meth:`process`."""

    def __init__(self, first: Stream, second: Stream):
        _check_pair(first, second, "connect")
        self._first, self._second = first, second
        self._keyed = isinstance(first, KeyedStream)

    def process(self, name: str, function, *, parallelism: int | None = None,
                dead_letters: bool = False) -> "TwoInputOutput":
        """Run ``function``: a :class:`~epochal.coprocess.KeyedCoProcessFunction` on keyed
        streams, a :class:`~epochal.coprocess.CoProcessFunction` otherwise. Both streams must
        carry event time, or neither."""
        expected = KeyedCoProcessFunction if self._keyed else CoProcessFunction
        if not isinstance(function, expected):
            hint = ("" if self._keyed else " (key both streams for keyed state and timers)")
            raise PipelineDefinitionError(f"connect(...).process {name!r}: expected a {expected.__name__} instance, "
                                          f"got {type(function).__name__}{hint}")
        ports = function.side_outputs
        if not isinstance(ports, tuple) or not all(isinstance(p, str) and p and p != "main" for p in ports):
            raise PipelineDefinitionError(f"connect(...).process {name!r}: side_outputs must be a tuple of names "
                                          f"(not 'main'), got {ports!r}")
        kind = NodeKind.KEYED_CO_PROCESS if self._keyed else NodeKind.CO_PROCESS
        node = add_two_input_node(self._first, self._second, kind, name, function, parallelism, dead_letters)
        return TwoInputOutput(self._first.flow, (Input(node.name, FORWARD),), node.name, ports)


class TwoInputOutput(Stream):
    """The output of a two-input operator, with its declared side outputs."""

    def __init__(self, flow, ports, operator: str, side_outputs: tuple):
        super().__init__(flow, ports)
        self._operator, self._side_outputs = operator, side_outputs

    def side_output(self, port: str) -> Stream:
        """The records the function put in ``port`` with ``ctx.output(port, value)``."""
        if port not in self._side_outputs:
            raise PipelineDefinitionError(f"operator {self._operator!r} has no side output {port!r} "
                                          f"(declared: {', '.join(map(repr, self._side_outputs)) or 'none'})")
        return Stream(self._flow, (Input(self._operator, FORWARD, port=port),))
