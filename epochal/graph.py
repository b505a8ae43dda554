"""Logical graph value objects: nodes, inputs and partitioning. Pure, immutable, picklable."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable


class PartitionKind(enum.Enum):
    """How records of one edge are routed from producer subtasks to consumer subtasks."""

    FORWARD = "forward"  # subtask i → subtask i (rebalance if parallelisms differ)
    HASH = "hash"  # by key group of key_fn(record) (seed 004 §4.2.1)
    REBALANCE = "rebalance"  # round-robin
    BROADCAST = "broadcast"  # every consumer subtask


@dataclass(frozen=True)
class Partitioning:
    kind: PartitionKind
    key_fn: Callable | None = None


FORWARD = Partitioning(PartitionKind.FORWARD)


@dataclass(frozen=True)
class Input:
    """One input edge of a node: records of ``node`` routed by ``partitioning``."""

    node: str
    partitioning: Partitioning
    #: a back-edge of a loop (``Stream.iterate``): records flow from the loop's tail back
    #: to its head. The only way a cycle may appear in the graph (seed 004 §3.4.4.4).
    feedback: bool = False
    #: which output of ``node`` this edge reads: ``"main"``, or a side output such as a
    #: window's ``"late"`` records. Side outputs are never chained (always channels).
    port: str = "main"
    #: an autonomous channel (``Stream.autonomous``, seed 000 §3.2): it joins no region —
    #: its two ends may be in different regions, which it never merges or coordinates
    #: (:mod:`epochal.regions.relay`)
    autonomous: bool = False


class NodeKind(enum.Enum):
    SOURCE = "source"
    MAP = "map"
    FLAT_MAP = "flat_map"
    FILTER = "filter"
    REDUCE = "reduce"
    PROCESS = "process"
    SINK = "sink"
    LOOP_HEAD = "loop_head"  # entry of a loop (Stream.iterate); see epochal/loops
    WATERMARKS = "watermarks"  # Stream.with_watermarks: timestamps + watermarks (epochal/time)
    WINDOW = "window"  # KeyedStream.window(...): keyed windows (epochal/windows)
    MAP_BATCHES = "map_batches"  # Arrow batches → batches (epochal/columnar)
    TO_RECORDS = "to_records"  # Arrow batches → Python records
    TO_BATCHES = "to_batches"  # Python records → Arrow batches
    AGGREGATE = "aggregate"  # keyed vectorized aggregation of Arrow batches
    LOCAL_AGGREGATE = "local_aggregate"  # its pre-aggregation before the shuffle (stateless)
    BROADCAST_PROCESS = "broadcast_process"  # stream.connect_broadcast(rules).process (epochal/broadcast)
    KEYED_BROADCAST_PROCESS = "keyed_broadcast_process"  # the same on a keyed stream
    CO_PROCESS = "co_process"  # Stream.connect(...).process: two inputs (epochal/coprocess)
    KEYED_CO_PROCESS = "keyed_co_process"  # KeyedStream.connect(...).process and the joins (epochal/joins)


@dataclass(frozen=True)
class Node:
    """A logical operator. ``name`` is stable and keys the operator's state.

    ``payload`` is the user object: the Source, the function, the KeyedProcessFunction
    or the Sink; ``key_fn`` is set for keyed operators (reduce, process, window); ``extra``
    holds operator options (e.g. the reduce's initial value).

    Event time (:mod:`epochal.time`): records of a stream with timestamps travel as
    ``(timestamp_us, value)`` pairs; operators see and produce values, the pairs are the
    runtime's business. ``timed_in``: this node's input records carry timestamps;
    ``timed``: its output records do (decided when the graph is built).
    """

    name: str
    kind: NodeKind
    inputs: tuple[Input, ...]
    parallelism: int
    payload: Any
    key_fn: Callable | None = None
    extra: tuple = ()
    timed_in: bool = False
    timed: bool = False
    #: records its user function fails on go to the ``"dead_letters"`` side output
    dead_letters: bool = False
    #: its output elements are ``pyarrow.RecordBatch``es (a columnar stream, epochal/columnar)
    columnar: bool = False

    @property
    def is_keyed(self) -> bool:
        return self.kind in KEYED_KINDS


KEYED_KINDS = frozenset({NodeKind.REDUCE, NodeKind.PROCESS, NodeKind.WINDOW, NodeKind.AGGREGATE,
                         NodeKind.KEYED_BROADCAST_PROCESS, NodeKind.KEYED_CO_PROCESS})
