"""Queryable windows: a key's open windows, read from a committed version (seed 004 §4.3.1).

``.window(...).reduce/aggregate/process(name, ..., queryable=True)`` serves state
``"windows"`` of operator ``name``: a lookup of a key returns ``{Window(start, end): value}``
(seconds, ``end`` exclusive, in start order) for every window of the key that holds state
and has not expired at the version's watermark (``end - 1 µs + allowed_lateness >
watermark``): the windows still open, and those that fired but still take late records.
``value`` is what the window would emit if it fired now: the reduced value (``reduce``),
``function.result(acc)`` (``aggregate``), or the list of its elements (``process``: its
function is not called — it may emit any number of values, or have effects).

The readers (:class:`~epochal.query.readers.StateReader`) rebuild each window from the
operator's own state (:mod:`epochal.windows.operator`): the panes a window is made of
(tumbling, sliding), or the session entries; the watermark is the operator's at the
version's barrier (:meth:`~epochal.query.readers.StateReader.mark`, task thread). A version
pinned at a restore has no watermark yet (it is regenerated): it lists every window that
holds state, including, for sliding windows, expired windows whose panes later windows still
need — until the next epoch completes.

Merging runs the user's ``merge`` on a query thread, on a deep copy of the first pane (a
pinned version's objects are shared and must not change).
"""
from __future__ import annotations

import copy
from typing import Callable

from epochal.query.readers import StateReader
from epochal.windows.assigners import PaneSpec
from epochal.windows.functions import Combiner, Window

__all__ = ["PaneWindowsReader", "SessionWindowsReader", "window_value"]


def window_value(combiner: Combiner, acc):
    """What a window with accumulator ``acc`` reads as (see the module docstring)."""
    if combiner.kind == "aggregate":
        return combiner.agg.result(acc)  # type: ignore[attr-defined]
    if combiner.kind == "process":
        return list(acc)
    return acc


class _WindowsReader(StateReader):
    kind = "windows"
    whole_maps = True

    task_side = ("_watermark",)

    def __init__(self, state: str, combiner: Combiner, lateness: int, watermark: Callable[[], int]):
        self.states = (state,)
        self.combiner, self.lateness, self._watermark = combiner, lateness, watermark

    def mark(self) -> int:
        return self._watermark()


class PaneWindowsReader(_WindowsReader):
    """Tumbling and sliding windows: each window combines its panes (``<op>/panes``)."""

    def __init__(self, state: str, spec: PaneSpec, combiner: Combiner, lateness: int,
                 watermark: Callable[[], int]):
        super().__init__(state, combiner, lateness, watermark)
        self.spec = spec

    def read(self, source, kg, key, mark) -> dict:
        panes = dict(source.map_items(self.states[0], kg, key))
        spec, combiner = self.spec, self.combiner
        starts = sorted({s for p in panes for s in spec.window_starts(p)})
        out = {}
        for start in starts:
            end = start + spec.size
            if end - 1 + self.lateness <= mark:  # expired: its state is (partly) gone or only held for others
                continue
            parts = [panes[p] for p in spec.panes(start) if p in panes]
            acc = parts[0]
            if len(parts) > 1:
                acc = copy.deepcopy(acc)  # merge may modify its first argument
                for part in parts[1:]:
                    acc = combiner.merge(acc, part)
            out[Window(start / 1e6, end / 1e6)] = window_value(combiner, acc)
        return out


class SessionWindowsReader(_WindowsReader):
    """Session windows: one entry per session (``<op>/sessions``: start → (end, acc))."""

    def read(self, source, kg, key, mark) -> dict:
        out = {}
        for start, (end, acc) in sorted(dict(source.map_items(self.states[0], kg, key)).items()):
            if end - 1 + self.lateness > mark:
                out[Window(start / 1e6, end / 1e6)] = window_value(self.combiner, acc)
        return out
