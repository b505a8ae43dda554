"""The job graph as a picture: operators in columns by depth, edges by partitioning.

:func:`graph_view` turns a physical plan's logical nodes into boxes with positions and
edges with a kind (``forward``, ``hash`` — by key group —, ``rebalance``, ``broadcast``),
``feedback`` for a loop's back-edge and the output ``port`` (a side output such as
``late`` or ``dead_letters``). Columns follow the longest path from a source over
non-feedback edges, so every forward edge points right and a back-edge points left; rows
keep the order in which the dataflow defined its operators. Pure; the page draws it.

>>> from epochal.graph import Input, Node, NodeKind, FORWARD
>>> nodes = {"src": Node("src", NodeKind.SOURCE, (), 1, None),
...          "out": Node("out", NodeKind.SINK, (Input("src", FORWARD),), 2, None)}
>>> v = graph_view(nodes)
>>> [(n["name"], n["column"]) for n in v["nodes"]], v["edges"][0]["kind"]
([('src', 0), ('out', 1)], 'forward')
"""
from __future__ import annotations

from epochal.graph import Node

__all__ = ["BOX_HEIGHT", "BOX_WIDTH", "graph_view"]

BOX_WIDTH, BOX_HEIGHT = 170, 64
COLUMN_GAP, ROW_GAP, MARGIN = 70, 34, 20
TOP = 44  # room above the first row for edges that skip columns (drawn as arcs over the boxes)


def _columns(nodes: dict[str, Node]) -> dict[str, int]:
    """Longest path from a source over non-feedback edges (the graph without back-edges is
    acyclic: :func:`epochal.loops.backedges.check_acyclic`)."""
    column: dict[str, int] = {}

    def depth(name: str, trail: tuple = ()) -> int:
        if name in column:
            return column[name]
        if name in trail:  # cannot happen in a checked plan; never loop on a bad one
            return 0
        parents = [i.node for i in nodes[name].inputs if not i.feedback and i.node in nodes]
        column[name] = 1 + max((depth(p, trail + (name,)) for p in parents), default=-1)
        return column[name]

    for name in nodes:
        depth(name)
    return column


def graph_view(nodes: dict[str, Node]) -> dict:
    """Boxes and edges of ``nodes`` (a ``PhysicalPlan.nodes`` or ``Dataflow.nodes`` dict),
    JSON-able: ``nodes`` (``name``, ``kind``, ``parallelism``, ``column``, ``row``, ``x``,
    ``y``, ``width``, ``height``), ``edges`` (``source``, ``target``, ``kind``,
    ``feedback``, ``port``), ``width``, ``height``."""
    column = _columns(nodes)
    rows: dict[int, int] = {}
    boxes = []
    for name, node in nodes.items():
        c = column[name]
        r = rows.get(c, 0)
        rows[c] = r + 1
        boxes.append({"name": name, "kind": node.kind.value, "parallelism": node.parallelism, "column": c, "row": r,
                      "x": MARGIN + c * (BOX_WIDTH + COLUMN_GAP), "y": TOP + r * (BOX_HEIGHT + ROW_GAP),
                      "width": BOX_WIDTH, "height": BOX_HEIGHT})
    edges = [{"source": i.node, "target": name, "kind": i.partitioning.kind.value, "feedback": i.feedback,
              "port": i.port}
             for name, node in nodes.items() for i in node.inputs]
    columns = max(column.values(), default=0) + 1
    height = max(rows.values(), default=1)
    return {"nodes": boxes, "edges": edges,
            "width": 2 * MARGIN + columns * BOX_WIDTH + (columns - 1) * COLUMN_GAP,
            "height": TOP + MARGIN + height * BOX_HEIGHT + (height - 1) * ROW_GAP + 30}
