"""Building a columnar join node: ``interval_join`` / ``window_join`` / ``temporal_join`` of
two keyed streams of Arrow batches (:mod:`epochal.joins.api` calls :func:`build_column_join` when both inputs
carry batches) — the checks made at build time and the node's output stream. The operator
that runs it is :class:`epochal.columnar.joins.ColumnJoinOperator` (the temporal join:
:class:`epochal.columnar.temporal_join.ColumnTemporalJoinOperator`).
"""
from __future__ import annotations

from epochal.columnar.join_spec import ColumnJoinSpec
from epochal.columnar.keys import ColumnKey
from epochal.columnar.time import event_time_of
from epochal.errors import PipelineDefinitionError
from epochal.graph import FORWARD, Input, NodeKind
from epochal.joins.functions import pair
from epochal.streams import Stream
from epochal.windows.assigners import PaneSpec

__all__ = ["ColumnJoinOutput", "build_column_join", "join_operator"]

_SIDES = ("left", "right")


def build_column_join(join, name: str, fn, parallelism, right_suffix: str):
    """The node of ``join`` (an :class:`~epochal.joins.api.IntervalJoin`,
    :class:`~epochal.joins.api.WindowJoin` or :class:`~epochal.joins.api.TemporalJoin` over
    two streams of batches); returns its output.

    Raises:
        PipelineDefinitionError: a function other than the default pair, a key that is not a
            column, no event time, or a variant with no vectorized version (it names the
            record-path equivalent).
    """
    where = f"{join.kind} {name!r}"
    record_path = ("convert both inputs with to_records(name) and use the record-path " + join.kind)
    if fn is not pair:
        raise PipelineDefinitionError(
            f"{where}: on Arrow batches the join emits joined rows (the left columns, then the right ones) — drop "
            f"the function and follow it with map_batches(...), or {record_path} with your function")
    if not isinstance(right_suffix, str) or not right_suffix:
        raise PipelineDefinitionError(f"{where}: right_suffix must be a non-empty string, got {right_suffix!r}")
    left, right = join._left, join._right
    keys = []
    for s in (left, right):
        if not isinstance(s._key_fn, ColumnKey):
            raise PipelineDefinitionError(f"{where}: key both streams of batches by a column (key_by('column'))")
        keys.append(s._key_fn.column)
        if not s._timed(name):
            raise PipelineDefinitionError(
                f"{where} joins in event time but {', '.join(repr(p.node) for p in s._ports)} has no event time: "
                "call .with_watermarks(name, timestamp='column') on both inputs before key_by")
    times = (event_time_of(left, f"{where} (left input)"), event_time_of(right, f"{where} (right input)"))
    how = join._how
    outer = (how in ("left", "full"), how in ("right", "full"))
    if join.kind == "interval_join":
        spec = ColumnJoinSpec(tuple(keys), times, outer, lower=join._spec.lower, upper=join._spec.upper,
                              right_suffix=right_suffix)
    elif join.kind == "window_join" and isinstance(join._spec, PaneSpec):
        spec = ColumnJoinSpec(tuple(keys), times, outer, panes=join._spec, right_suffix=right_suffix)
    elif join.kind == "window_join":  # session windows
        spec = ColumnJoinSpec(tuple(keys), times, outer, gap=join._spec.gap, right_suffix=right_suffix)
    elif join.kind == "temporal_join":
        spec = ColumnJoinSpec(tuple(keys), times, outer, right_suffix=right_suffix, temporal=True,
                              deleted=_deletion_column(join, where, record_path))
    else:
        raise PipelineDefinitionError(f"{where}: not a join of batches")
    both = Stream(left.flow, left._ports + right._ports)
    node = both._then(NodeKind.KEYED_CO_PROCESS, name, spec, parallelism, (left._key_fn, right._key_fn),
                      (len(left._ports),), timed=False, accepts="batches")
    return ColumnJoinOutput(left.flow, (Input(node.name, FORWARD),), node.name)


def join_operator(spec: ColumnJoinSpec) -> type:
    """The operator class that runs a columnar join node of ``spec``."""
    if spec.temporal:
        from epochal.columnar.temporal_join import ColumnTemporalJoinOperator

        return ColumnTemporalJoinOperator
    if spec.gap is not None:
        from epochal.columnar.session_join import ColumnSessionJoinOperator

        return ColumnSessionJoinOperator
    from epochal.columnar.joins import ColumnJoinOperator

    return ColumnJoinOperator


def _deletion_column(join, where: str, record_path: str) -> str | None:
    """A temporal join's ``is_delete`` on batches: the name of a boolean column (or None).
    Its ``ttl`` has no vectorized version."""
    if join._ttl is not None:
        raise PipelineDefinitionError(f"{where}: ttl on Arrow batches is not vectorized — {record_path}")
    deleted = join._is_delete
    if deleted is not None and not isinstance(deleted, str):
        raise PipelineDefinitionError(
            f"{where}: on Arrow batches is_delete names the table's boolean column that marks a deletion "
            f"(is_delete='deleted'), got {deleted!r} — or {record_path} with a function")
    return deleted


class ColumnJoinOutput(Stream):
    """The joined batches; :meth:`late` holds each input's late rows."""

    def __init__(self, flow, ports, operator: str):
        super().__init__(flow, ports)
        self._operator = operator

    def late(self, side: str = "left") -> Stream:
        """The rows of input ``side`` (``"left"`` or ``"right"``) that arrived at or behind
        its watermark, unchanged (batches). Read them, or they are only counted."""
        if side not in _SIDES:
            raise PipelineDefinitionError(f"join {self._operator!r}: late(side) takes 'left' or 'right', got {side!r}")
        return Stream(self._flow, (Input(self._operator, FORWARD, port=f"late_{side}"),))
