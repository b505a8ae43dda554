"""Back-edge identification and the loop-expansion check (seed 004 §3.4.4.4).

Loops are strongly connected components of the process graph. ``Stream.iterate`` names
each loop's back-edges explicitly (the seed's "best case": loops defined by the
programming model), so detection here *verifies* instead of guessing an entry task:

* :func:`check_acyclic` — on the logical graph, every cycle must pass through a feedback
  input (otherwise a clear :class:`PipelineDefinitionError` naming the cycle);
* :func:`strongly_connected` / :func:`detect_back_edges` — Tarjan's SCCs on the physical
  task graph; the back-edges are the channels inside a cycle that enter a Loop Head;
* :func:`check_loop_expansion` — after replacing every back-edge by the phantom channel
  (Loop Tail → Loop Head, never aligned), the task graph is a DAG, so epochs progress.
"""
from __future__ import annotations

from epochal.errors import PipelineDefinitionError


def _find_cycle(vertices, edges_of) -> list | None:
    """A cycle (list of vertices) in the directed graph, or None. Iterative DFS."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {v: WHITE for v in vertices}
    for root in vertices:
        if color[root] != WHITE:
            continue
        stack = [(root, iter(edges_of(root)))]
        path = [root]
        color[root] = GREY
        while stack:
            v, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                color[v] = BLACK
            elif color[nxt] == GREY:
                return path[path.index(nxt):] + [nxt]
            elif color[nxt] == WHITE:
                color[nxt] = GREY
                path.append(nxt)
                stack.append((nxt, iter(edges_of(nxt))))
    return None


def check_acyclic(nodes: dict) -> None:
    """Raise if the logical graph has a cycle that does not use a feedback input."""
    consumers: dict[str, list[str]] = {n: [] for n in nodes}
    for node in nodes.values():
        for inp in node.inputs:
            if inp.node not in nodes:
                raise PipelineDefinitionError(f"operator {node.name!r} reads from unknown operator {inp.node!r}")
            if not inp.feedback:
                consumers[inp.node].append(node.name)
    cycle = _find_cycle(list(nodes), lambda v: consumers[v])
    if cycle:
        raise PipelineDefinitionError(
            "the dataflow has a cycle " + " -> ".join(map(repr, cycle)) + " that is not a loop built with "
            "Stream.iterate(name, body); cycles are only allowed through a loop's feedback stream, whose "
            "head takes part in checkpoints (seed 004 §3.4.4.4)")


def strongly_connected(vertices, edges_of) -> list[list]:
    """Tarjan's strongly connected components (iterative), in reverse topological order."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in vertices:
        if root in index:
            continue
        work = [(root, iter(edges_of(root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(edges_of(w))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                out.append(comp)
    return out


def detect_back_edges(plan) -> set[str]:
    """Back-edges of the physical task graph, outermost loops first (seed 004 §3.4.4.4).

    Each non-trivial strongly connected component is a loop; its entry tasks are the Loop
    Heads that receive input from outside the component (the seed's "entry task": the one
    with edges external to the loop); the channels from inside the component into an entry
    are back-edges. Removing them exposes nested loops, handled the same way until no
    cycle is left.
    """
    heads = set(plan.loop_head_tasks)
    found: set[str] = set()
    while True:
        live = [c for c in plan.channels.values() if c.id not in found]
        out_of: dict[str, list[str]] = {t.id: [] for t in plan.tasks}
        for ch in live:
            out_of[ch.producer].append(ch.consumer)
        new = set()
        for comp in strongly_connected([t.id for t in plan.tasks], lambda v: out_of[v]):
            inside = set(comp)
            if len(comp) == 1 and comp[0] not in out_of[comp[0]]:
                continue  # not a loop
            entered = {c.consumer for c in live if c.consumer in inside and c.producer not in inside}
            entries = (entered & heads) or entered or (inside & heads)
            new |= {c.id for c in live if c.producer in inside and c.consumer in entries}
        if not new:
            return found
        found |= new


def check_loop_expansion(plan) -> None:
    """Without the feedback channels the task graph must be a DAG, and every feedback
    channel must close a cycle (it is a real back-edge)."""
    forward: dict[str, list[str]] = {t.id: [] for t in plan.tasks}
    for ch in plan.channels.values():
        if not ch.feedback:
            forward[ch.producer].append(ch.consumer)
    cycle = _find_cycle([t.id for t in plan.tasks], lambda v: forward[v])
    if cycle:
        raise PipelineDefinitionError(
            "the physical task graph has a cycle " + " -> ".join(cycle) + " without a loop's feedback channel; "
            "build loops with Stream.iterate(name, body)")
    declared = {c.id for c in plan.channels.values() if c.feedback}
    found = detect_back_edges(plan)
    if declared - found:
        raise PipelineDefinitionError(
            f"feedback channel(s) {sorted(declared - found)[:3]} do not close a cycle into their loop head")
