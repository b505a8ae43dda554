"""The job graph as a picture: operators in columns by depth, edges by partitioning.

:func:`graph_view` turns a physical plan's logical nodes into boxes with positions and
edges with a kind (``forward``, ``hash`` — by key group —, ``rebalance``, ``broadcast``),
``feedback`` for a loop's back-edge and the output ``port`` (a side output such as
``late`` or ``dead_letters``). Columns follow the longest path from a source over
non-feedback edges, so every forward edge points right and a back-edge points left; rows
keep the order in which the dataflow defined its operators. A box is as wide as its longest
line of text needs (:func:`box_width`: the name and ``kind ×parallelism`` on the first
line, the figures the page writes below at most :data:`FIGURE_CHARS` characters), a column
as wide as its widest box, so no label overlaps another box. Pure; the page draws it.

>>> from epochal.graph import Input, Node, NodeKind, FORWARD
>>> nodes = {"src": Node("src", NodeKind.SOURCE, (), 1, None),
...          "out": Node("out", NodeKind.SINK, (Input("src", FORWARD),), 2, None)}
>>> v = graph_view(nodes)
>>> [(n["name"], n["column"]) for n in v["nodes"]], v["edges"][0]["kind"]
([('src', 0), ('out', 1)], 'forward')
"""
from __future__ import annotations

from epochal.graph import Node

__all__ = ["BOX_HEIGHT", "BOX_WIDTH", "box_width", "graph_view", "place"]

BOX_WIDTH, BOX_HEIGHT = 210, 64  # the narrowest box; every box's height
#: widths (px) of one character, generous for the page's sans-serif fonts: the bold 13 px name,
#: the 11 px figures; and the longest figure line the page writes (``back-pressure 0–100 % · CPU 100 %``)
NAME_CHAR, SMALL_CHAR, FIGURE_CHARS, PAD = 8.4, 6.6, 30, 8
COLUMN_GAP, ROW_GAP, MARGIN = 56, 34, 20
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


def box_width(name: str, kind: str, parallelism: int) -> int:
    """Pixels a box needs for ``name`` and ``kind ×parallelism`` on one line (a gap between)
    and for the figure lines below; at least :data:`BOX_WIDTH`."""
    first = PAD + NAME_CHAR * len(name) + 2 * PAD + SMALL_CHAR * len(f"{kind} ×{parallelism}") + PAD
    return int(max(BOX_WIDTH, first, 2 * PAD + SMALL_CHAR * FIGURE_CHARS) + 0.999)


def graph_view(nodes: dict[str, Node]) -> dict:
    """Boxes and edges of ``nodes`` (a ``PhysicalPlan.nodes`` or ``Dataflow.nodes`` dict),
    JSON-able: ``nodes`` (``name``, ``kind``, ``parallelism``, ``column``, ``row``, ``x``,
    ``y``, ``width``, ``height``), ``edges`` (``source``, ``target``, ``kind``,
    ``feedback``, ``port``), ``width``, ``height``."""
    column = _columns(nodes)
    edges = [{"source": i.node, "target": name, "kind": i.partitioning.kind.value, "feedback": i.feedback,
              "port": i.port}
             for name, node in nodes.items() for i in node.inputs]
    return place([(name, node.kind.value, node.parallelism, column[name]) for name, node in nodes.items()], edges)


def place(items: list[tuple[str, str, int, int]], edges: list[dict]) -> dict:
    """The picture of ``items`` — ``(name, kind, parallelism, column)`` in the order their rows
    follow — and ``edges`` (as :func:`graph_view` returns them): columns as wide as their
    widest box, boxes stacked in each column. Also used for a job read from storage
    (:mod:`epochal.ui.offline`), whose columns come from elsewhere."""
    columns = max((c for *_, c in items), default=0) + 1
    widths = [BOX_WIDTH] * columns
    for name, kind, parallelism, c in items:
        widths[c] = max(widths[c], box_width(name, kind, parallelism))
    lefts = [MARGIN + sum(widths[:c]) + c * COLUMN_GAP for c in range(columns)]
    rows: dict[int, int] = {}
    boxes = []
    for name, kind, parallelism, c in items:
        r = rows.get(c, 0)
        rows[c] = r + 1
        boxes.append({"name": name, "kind": kind, "parallelism": parallelism, "column": c, "row": r,
                      "x": lefts[c], "y": TOP + r * (BOX_HEIGHT + ROW_GAP),
                      "width": box_width(name, kind, parallelism), "height": BOX_HEIGHT})
    height = max(rows.values(), default=1)
    return {"nodes": boxes, "edges": edges,
            "width": 2 * MARGIN + sum(widths) + (columns - 1) * COLUMN_GAP,
            "height": TOP + MARGIN + height * BOX_HEIGHT + (height - 1) * ROW_GAP + 30}
