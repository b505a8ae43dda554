"""The record operators between a CEC window's source and its ``key_by`` — ``map``, ``filter``,
``flat_map`` and one ``with_watermarks`` — taken into the CEC operator's input, so that a
replay from T (seed 003 §II.B: "request replay of input tuples with timestamps t > T")
reproduces the records the window read the first time.

Why they move into the operator. Recovery asks the operator's *input* to replay after T, the
oldest footprint. The operator reads its source itself (:mod:`epochal.eventual.source`), so
what stood between the source and ``key_by`` must run again on the replayed records, inside
the operator, in the same order: :class:`Chain` is that composition, a pure function of one
source record. It is correct when each function is **deterministic per record** (the same
record in, the same records out, whatever ran before) — the contract stated in
docs/eventual.md; a function with side effects or hidden state would replay differently, and a
replay whose records differ from the logged ones is refused where it shows
(:class:`~epochal.eventual.operator_state.ReplayMismatch`).

Positions. One source record may become several (``flat_map``) or none (``filter``). Every
record the window sees needs its own, strictly increasing position
(:class:`~epochal.eventual.records.Position`), stable across replays; with a ``flat_map`` in
the chain the ``j``-th record made from source record ``i`` is at sequence number
``i * FANOUT + j``, so a replay can resume in the middle of one record's outputs (it reads
record ``i`` again and skips the outputs at or before the position). Without a ``flat_map``,
``FANOUT`` is 1 and a position's sequence number is the source record's index, as before.

:func:`input_chain` reads the chain off the graph at build time and refuses, naming the
operator, what cannot be replayed this way: a keyed or stateful operator, a union of streams, an
operator with ``dead_letters=True`` (its rejected records would be sent again on every replay),
a repartitioning other than ``key_by``, and no ``with_watermarks`` at all.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from epochal.errors import DataError, PipelineDefinitionError
from epochal.graph import NodeKind, PartitionKind

__all__ = ["FANOUT", "Chain", "Mapped", "input_chain"]

#: outputs one source record may have behind a ``flat_map`` (their sequence numbers' stride)
FANOUT = 1 << 20

_STAGES = (NodeKind.MAP, NodeKind.FILTER, NodeKind.FLAT_MAP)


class Chain:
    """``source record → [(record, timestamp in µs)]``: the stages before ``with_watermarks``,
    its timestamp function, then the stages after it (which keep their input's timestamp).

    Args:
        pre, post: ``(kind, operator name, fn)`` in the order records pass them.
        timestamp: ``with_watermarks``' timestamp function, in µs.
        where: the window operator, for errors.
    """

    def __init__(self, pre: list, timestamp: Callable[[Any], int], post: list, where: str):
        self.pre, self.timestamp, self.post, self.where = pre, timestamp, post, where
        self.fanout = FANOUT if any(kind is NodeKind.FLAT_MAP for kind, _, _ in pre + post) else 1

    @property
    def names(self) -> list[str]:
        """The operators taken into the window, source side first."""
        return [name for _, name, _ in self.pre] + [name for _, name, _ in self.post]

    def _stage(self, kind: NodeKind, name: str, fn: Callable, records: list) -> list:
        if kind is NodeKind.MAP:
            return [fn(r) for r in records]
        if kind is NodeKind.FILTER:
            return [r for r in records if fn(r)]
        out: list = []
        for r in records:
            produced = fn(r)
            if produced is None:
                continue
            if isinstance(produced, (str, bytes)) or not isinstance(produced, Iterable):
                raise DataError(f"{self.where}: flat_map {name!r} returned {type(produced).__name__}, not an "
                                "iterable of records")
            out.extend(produced)
        return out

    def values(self, record) -> list:
        """The stages alone (no timestamps): the records ``record`` becomes."""
        records = [record]
        for kind, name, fn in self.pre + self.post:
            records = self._stage(kind, name, fn, records)
        return records

    def __call__(self, record) -> list[tuple[Any, int]]:
        records = [record]
        for kind, name, fn in self.pre:
            records = self._stage(kind, name, fn, records)
        out = []
        for r in records:
            ts = self.timestamp(r)
            rs = [r]
            for kind, name, fn in self.post:
                rs = self._stage(kind, name, fn, rs)
            out += [(x, ts) for x in rs]
        if len(out) > self.fanout:
            raise DataError(f"{self.where}: one source record became {len(out)} records through "
                            f"{', '.join(map(repr, self.names))}; eventual checkpoints number at most {self.fanout} "
                            "per source record")
        return out


class Mapped:
    """A :class:`~epochal.eventual.source.SeekableInput` with ``map`` / ``filter`` stages applied
    to its records; positions are the input's (no ``flat_map``: one record, one position)."""

    def __init__(self, input, chain: Chain):
        self.input, self.chain = input, chain

    def read_after(self, position) -> Iterator[tuple[Any, Any]]:
        for record, p in self.input.read_after(position):
            for r in self.chain.values(record):
                yield r, p


def input_chain(keyed, where: str):
    """``(source node, nodes taken in, the with_watermarks node, pre, post)`` for the keyed
    stream a CEC window reads: the single path ``source → (map | filter | flat_map)* →
    with_watermarks → (map | filter | flat_map)* → key_by``, or a
    :class:`~epochal.errors.PipelineDefinitionError` naming the operator in the way."""
    nodes = keyed.flow.nodes
    ports = keyed._ports
    if len(ports) != 1:
        names = ", ".join(repr(p.node) for p in ports)
        raise PipelineDefinitionError(
            f"{where}: eventual checkpoints read one source, as source(...).with_watermarks(...).key_by(...)"
            f".window(...); this window reads {names} (a union) — give each source its own window, or use epoch "
            "snapshots (no checkpoints=)")
    taken, pre, post, stamp = [], [], [], None
    node = nodes[ports[0].node]
    while node.kind is not NodeKind.SOURCE:
        if node.kind is not NodeKind.WATERMARKS and node.kind not in _STAGES:
            raise PipelineDefinitionError(
                f"{where}: eventual checkpoints replay their input from the source through map, filter, flat_map "
                f"and with_watermarks only; {node.kind.value} {node.name!r} stands between the source and key_by — "
                "move it after the window, or use epoch snapshots (no checkpoints=)")
        if node.dead_letters:
            raise PipelineDefinitionError(
                f"{where}: {node.kind.value} {node.name!r} has dead_letters=True; its rejected records would be sent "
                "again on every replay after T — drop dead_letters or move it after the window")
        if len(node.inputs) != 1:
            raise PipelineDefinitionError(
                f"{where}: {node.kind.value} {node.name!r} reads {len(node.inputs)} streams (a union); eventual "
                "checkpoints replay one source — give each source its own window")
        if node.inputs[0].partitioning.kind is not PartitionKind.FORWARD:
            raise PipelineDefinitionError(
                f"{where}: {node.kind.value} {node.name!r} reads its input by "
                f"{node.inputs[0].partitioning.kind.value}; between an eventual window's source and key_by only "
                "forward edges are replayed — drop the repartitioning")
        if node.kind is NodeKind.WATERMARKS:
            if stamp is not None:
                raise PipelineDefinitionError(f"{where}: with_watermarks {node.name!r} and {stamp.name!r} both "
                                              "assign timestamps; keep one")
            stamp = node
        else:
            (post if stamp is None else pre).insert(0, (node.kind, node.name, node.payload))
        taken.append(node)
        node = nodes[node.inputs[0].node]
    if stamp is None:
        raise PipelineDefinitionError(
            f"{where}: eventual checkpoints need event time: call with_watermarks(...) between the source "
            f"{node.name!r} and key_by")
    return node, taken, stamp, pre, post
