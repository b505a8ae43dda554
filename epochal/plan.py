"""Logical graph → physical task graph (DESIGN.md "graph" layer).

Chaining: an operator joins its producer's task when it has exactly one input, that input
is FORWARD with equal parallelism, and the producer feeds nothing else. A **fan-out** is
chained too (the task's operators then form a tree, see
:mod:`epochal.runtime.task.chain`) when the producer's output is Arrow batches (immutable:
its consumers can share them), every consumer of its main output could chain (one FORWARD
input of equal parallelism) and no operator reachable from it by such edges generates
watermarks (so every output of the task carries one event time). Every other edge
becomes channels between tasks: FORWARD i→i (REBALANCE when parallelisms differ), HASH
by key group, REBALANCE round-robin, BROADCAST to all.

Task ids (``"<head operator>[<subtask>]"``) and channel ids are deterministic functions
of the graph, so every attempt and every process computes the same plan.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from epochal.backends.keygroups import key_group_range
from epochal.errors import PipelineDefinitionError
from epochal.graph import Node, NodeKind, PartitionKind, Partitioning
from epochal.loops.backedges import check_acyclic, check_loop_expansion


@dataclass(frozen=True)
class OutputGate:
    """The channels one task uses for one consumer edge.

    ``channels[j]`` is the channel to consumer subtask ``j`` (a single channel for
    FORWARD). ``partitioning`` decides which ones a record goes to.
    """

    consumer: str
    partitioning: Partitioning
    channels: tuple[str, ...]
    #: the operator of the task's chain whose output ``port`` feeds this edge: the chain's
    #: last operator and ``"main"``, or any operator's side output (e.g. late records)
    producer: str = ""
    port: str = "main"
    #: the edge carries Arrow batches (each element one pyarrow.RecordBatch, sent at once)
    columnar: bool = False


@dataclass(frozen=True)
class TaskSpec:
    """One physical task: a chain of operators at one subtask index."""

    id: str
    index: int
    chain: tuple[str, ...]
    subtask: int
    parallelism: int
    inputs: tuple[str, ...]  # channel ids; position = barrier-handler channel index
    outputs: tuple[OutputGate, ...]
    source_splits: tuple = ()
    key_groups: range = range(0)
    is_source: bool = False
    #: loop heads only: the feedback (phantom) channels, the last entries of ``inputs``;
    #: they are never aligned (seed 004 Alg. 7) and get unbounded credit
    feedback_inputs: tuple[str, ...] = ()

    @property
    def is_loop_head(self) -> bool:
        return bool(self.feedback_inputs)

    @property
    def aligned_inputs(self) -> int:
        """How many input channels the barrier handler sees (all but the feedback ones)."""
        return len(self.inputs) - len(self.feedback_inputs)


@dataclass(frozen=True)
class Channel:
    id: str
    producer: str
    consumer: str
    feedback: bool = False


@dataclass(frozen=True)
class PhysicalPlan:
    job: str
    max_parallelism: int
    nodes: dict
    tasks: tuple[TaskSpec, ...]
    channels: dict = field(default_factory=dict)

    def task(self, task_id: str) -> TaskSpec:
        """The task ``task_id``; raises ``KeyError``. Constant time: the coordinator asks for
        every task of every completed epoch (a scan made each completion quadratic, issue 50)."""
        return self._task_index[task_id]

    @functools.cached_property
    def _task_index(self) -> dict[str, TaskSpec]:
        return {t.id: t for t in self.tasks}

    @property
    def source_tasks(self) -> list[str]:
        return [t.id for t in self.tasks if t.is_source]

    @property
    def loop_head_tasks(self) -> list[str]:
        return [t.id for t in self.tasks if t.is_loop_head]

    def fingerprint(self) -> dict:
        """Operator names, kinds and parallelism — checked when restoring a checkpoint."""
        return {n.name: {"kind": n.kind.value, "parallelism": n.parallelism} for n in self.nodes.values()}


def _check_exclusive_outputs(job: str, nodes: dict) -> None:
    """Two sinks writing one location (or one inside the other) would overwrite each
    other's output: refuse the graph, naming both."""
    seen: list[tuple[str, str]] = []
    for node in nodes.values():
        if node.kind is not NodeKind.SINK:
            continue
        for loc in node.payload.exclusive_locations():
            for other, other_loc in seen:
                if loc == other_loc or loc.startswith(other_loc.rstrip("/") + "/") \
                        or other_loc.startswith(loc.rstrip("/") + "/"):
                    raise PipelineDefinitionError(
                        f"dataflow {job!r}: sinks {other!r} and {node.name!r} both write {other_loc}"
                        + ("" if loc == other_loc else f" (and {loc} inside it)")
                        + ": their output files would overwrite each other; give each sink its own location")
            seen.append((node.name, loc))


def _check_dead_letters_read(job: str, nodes: dict[str, Node]) -> None:
    """An operator built with ``dead_letters=True`` whose ``.dead_letters()`` nothing reads
    would drop the records its function fails on (each with a warning, where nobody looks):
    refused, naming the operators and both fixes."""
    read = {inp.node for n in nodes.values() for inp in n.inputs if inp.port == "dead_letters"}
    unread = [n.name for n in nodes.values() if n.dead_letters and n.name not in read]
    if unread:
        names = ", ".join(map(repr, unread))
        raise PipelineDefinitionError(
            f"dataflow {job!r}: {names} {'is' if len(unread) == 1 else 'are'} built with dead_letters=True but nothing "
            f"reads {'its' if len(unread) == 1 else 'their'} .dead_letters(): the records the function fails on would "
            f"be dropped. Sink them (e.g. stream.dead_letters().sink('dlq', FileSink(...))) or build the operator "
            "without dead_letters, so that such a record fails the job naming it")


def compile_plan(flow) -> PhysicalPlan:
    """Validate ``flow`` and build its physical plan.

    Raises:
        PipelineDefinitionError: empty graph, a stream nobody consumes, a source-less graph,
            dead letters nobody reads.
    """
    nodes: dict[str, Node] = flow.nodes
    if not nodes:
        raise PipelineDefinitionError(f"dataflow {flow.name!r} has no operators")
    consumers: dict[str, list[tuple[str, int]]] = {n: [] for n in nodes}  # of the main output
    side_consumers: dict[str, list[str]] = {n: [] for n in nodes}
    for node in nodes.values():
        for i, inp in enumerate(node.inputs):
            if inp.port == "main":
                consumers[inp.node].append((node.name, i))
            else:
                side_consumers[inp.node].append(node.name)
    dangling = [n.name for n in nodes.values()
                if n.kind != NodeKind.SINK and not consumers[n.name] and not side_consumers[n.name]]
    if dangling:
        raise PipelineDefinitionError(
            f"dataflow {flow.name!r}: the output of {', '.join(map(repr, dangling))} is not consumed by any "
            "operator or sink (add a .sink(...) or remove the operator)"
        )
    if not any(n.kind == NodeKind.SINK for n in nodes.values()):
        raise PipelineDefinitionError(f"dataflow {flow.name!r} has no sink")
    _check_dead_letters_read(flow.name, nodes)

    check_acyclic(nodes)
    _check_exclusive_outputs(flow.name, nodes)

    # Chains: follow chainable forward edges from each chain head (a tree when fan-outs chain).
    def forward_edge(node: Node) -> bool:
        """One FORWARD main input of equal parallelism: the edge could be chained."""
        if len(node.inputs) != 1 or node.kind in (NodeKind.SOURCE, NodeKind.LOOP_HEAD):
            return False
        inp = node.inputs[0]
        return (inp.port == "main" and not inp.feedback and inp.partitioning.kind == PartitionKind.FORWARD
                and nodes[inp.node].parallelism == node.parallelism)

    def generates_below(name: str) -> bool:
        """An operator reachable from ``name``'s consumers over chainable edges generates watermarks."""
        todo, seen = [c for c, _ in consumers[name]], set()
        while todo:
            n = todo.pop()
            if n in seen or not forward_edge(nodes[n]):
                continue
            seen.add(n)
            if nodes[n].kind is NodeKind.WATERMARKS:
                return True
            todo.extend(c for c, _ in consumers[n])
        return False

    fans_out: dict[str, bool] = {}

    def chains_fan_out(producer: Node) -> bool:
        if producer.name not in fans_out:
            fans_out[producer.name] = (producer.columnar
                                       and all(forward_edge(nodes[c]) for c, _ in consumers[producer.name])
                                       and not generates_below(producer.name))
        return fans_out[producer.name]

    def chains_into_producer(node: Node) -> bool:
        if not forward_edge(node):
            return False
        producer = nodes[node.inputs[0].node]
        return len(consumers[producer.name]) == 1 or chains_fan_out(producer)

    heads = [n for n in nodes.values() if not chains_into_producer(n)]
    chain_of: dict[str, tuple[str, ...]] = {}
    for head in heads:
        chain, todo = [], [head.name]
        while todo:  # depth first, consumers in the order they were declared
            name = todo.pop()
            chain.append(name)
            todo.extend(reversed([c for c, _ in consumers[name] if chains_into_producer(nodes[c])]))
        for name in chain:
            chain_of[name] = tuple(chain)

    def task_id(head: str, subtask: int) -> str:
        return f"{head}[{subtask}]"

    # Channels per (consumer node, input index).
    inputs_of: dict[str, list[str]] = {}
    gates_of: dict[str, list[OutputGate]] = {}
    channels: dict[str, Channel] = {}
    for node in nodes.values():
        for i, inp in enumerate(node.inputs):
            producer = nodes[inp.node]
            if chain_of[node.name] == chain_of[producer.name] and not inp.feedback and inp.port == "main":
                continue  # chained (a feedback edge is always a channel, even to its own task)
            kind = inp.partitioning.kind
            if kind == PartitionKind.FORWARD and producer.parallelism != node.parallelism:
                partitioning = Partitioning(PartitionKind.REBALANCE)
            else:
                partitioning = inp.partitioning
            p_head = chain_of[producer.name][0]
            c_head = chain_of[node.name][0]
            for up in range(producer.parallelism):
                if partitioning.kind == PartitionKind.FORWARD:
                    targets = [up]
                else:
                    targets = list(range(node.parallelism))
                gate_channels = []
                for down in targets:
                    cid = f"{producer.name}>{node.name}.{i}:{up}>{down}"  # restore.edge_of parses it
                    channels[cid] = Channel(cid, task_id(p_head, up), task_id(c_head, down), inp.feedback)
                    inputs_of.setdefault(task_id(c_head, down), []).append(cid)
                    gate_channels.append(cid)
                gates_of.setdefault(task_id(p_head, up), []).append(
                    OutputGate(node.name, partitioning, tuple(gate_channels), producer.name, inp.port,
                               producer.columnar and inp.port != "dead_letters")
                )

    tasks = []
    for head in heads:
        chain = chain_of[head.name]
        # a source's splits, asked once per source (once per subtask made planning quadratic
        # in the parallelism: 19 s at 10,000 tasks, issue 50); subtask s reads every p-th one
        all_splits = list(head.payload.splits()) if head.kind == NodeKind.SOURCE else []
        for s in range(head.parallelism):
            tid = task_id(head.name, s)
            splits = ()
            if head.kind == NodeKind.SOURCE:
                splits = tuple(all_splits[s::head.parallelism])
            keyed = any(nodes[n].is_keyed for n in chain)
            kgs = key_group_range(s, head.parallelism, flow.max_parallelism) if keyed else range(0)
            ins = inputs_of.get(tid, [])
            feedback = tuple(c for c in ins if channels[c].feedback)
            tasks.append(
                TaskSpec(
                    id=tid,
                    index=len(tasks),
                    chain=chain,
                    subtask=s,
                    parallelism=head.parallelism,
                    inputs=tuple(c for c in ins if not channels[c].feedback) + feedback,
                    feedback_inputs=feedback,
                    outputs=tuple(gates_of.get(tid, ())),
                    source_splits=splits,
                    key_groups=kgs,
                    is_source=head.kind == NodeKind.SOURCE,
                )
            )
    plan = PhysicalPlan(flow.name, flow.max_parallelism, nodes, tuple(tasks), channels)
    check_loop_expansion(plan)
    return plan
