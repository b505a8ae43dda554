"""``aggregate(..., ttl=...)``: a columnar aggregate's keyed results expire after inactivity.

**Contract.** A key's accumulators expire ``ttl`` of wall clock (processing time; event
time is refused at build time: the aggregate merges whole epochs, not rows in event time)
after the last merge that updated the key — a merge happens before each barrier and when
the buffer reaches its budget, so a key's life starts at the merge of its newest rows,
not at their arrival (at most one epoch later). An expired key is never merged into: its
next rows start afresh (the emitted value counts only them). Expiry itself emits nothing
(the output is an update stream: no retraction).

**How.** Next to the accumulators (either layout of :mod:`epochal.columnar.state`) one
value state ``"<operator>/stamp"`` holds each key's last-merge time (ns). Each merge
(:meth:`AggregateTtl.before_merge`) first reads the stamps of the epoch's keys (one
``get_many``) and removes the expired ones from the accumulators, so they start afresh;
after it (:meth:`AggregateTtl.after_merge`) stamps the merged keys (one ``put_many``) and
sweeps key groups round robin — each visit deletes the expired keys of one key group from
both states, a heap block filtered with one Arrow ``is_in`` — within a budget proportional
to the merged rows (:data:`~epochal.ttl.cleanup.ENTRIES_PER_RECORD`), skipping a key group
until its oldest key can have expired. State therefore stays bounded by the keys merged
within ``ttl`` (plus what the sweep has not reached).

Restores: the stamps are keyed state (snapshotted, restored and rescaled by key group with
the accumulators). A ttl added since the checkpoint stamps the restored keys at their
first sweep visit (they live one more ttl); a ttl removed drops the stamps; a changed
duration applies to the restored stamps. Task thread only.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.columnar.state import BlockState, KeyBlock, _take
from epochal.ttl.cleanup import ENTRIES_PER_RECORD, MIN_BUDGET, SweepCursor
from epochal.ttl.expiry import StateTtl
from epochal.ttl.registry import META_KEY, governs_record, meta_state

__all__ = ["AggregateTtl", "drop_stamps"]


def stamp_state(operator: str) -> str:
    return f"{operator}/stamp"


def drop_stamps(backend, operator: str) -> None:
    """The aggregate has no ttl (any more): forget the stamps a checkpoint may hold."""
    for name in (stamp_state(operator), meta_state(operator)):
        if name in backend.state_names():
            backend.drop_state(name)


class AggregateTtl:
    """The TTL of one columnar aggregate's keys (see the module docstring).

    Args:
        state: the aggregate's :class:`~epochal.columnar.state.BlockState` or
            :class:`~epochal.columnar.state.EntryState` (restored).
        operator: the operator's name.
        config: its ``ttl`` (processing time).
        wall_clock_ns: the clock (tests substitute one).
    """

    def __init__(self, state, operator: str, config: StateTtl, wall_clock_ns: Callable[[], int] | None = None):
        self.state, self.backend = state, state.backend
        self.name = stamp_state(operator)
        self.ttl = config.ttl_us * 1000
        self.meta, self.desc = meta_state(operator), config.describe()
        self._wall = wall_clock_ns or time.time_ns
        self.cursor = SweepCursor(max(1, len(state.key_groups)))
        self._due: dict[int, int] = {}  # key group -> clock before which nothing there expires
        self.expired = 0  # keys expired since the start (a metric)

    def before_merge(self, partials: pa.Table) -> None:
        """Remove the epoch's keys whose accumulators expired, so the merge starts them afresh."""
        keys = partials.column(0).combine_chunks().to_pylist()
        kgs = self.state.groups.of_values(keys)
        stamps = self.backend.get_many(self.name, kgs, keys)
        now, ttl = self._wall(), self.ttl
        gone: dict[int, list] = {}
        for key, kg, stamp in zip(keys, kgs, stamps):
            if stamp is not None and stamp + ttl <= now:
                gone.setdefault(kg, []).append(key)
        for kg, dead in gone.items():
            self._remove(kg, dead)

    def after_merge(self, keys: pa.Array) -> None:
        """Stamp the merged ``keys`` now, then one bounded sweep step."""
        pykeys = keys.to_pylist()
        kgs = self.state.groups.of_values(pykeys)
        now = self._wall()
        self.backend.put_many(self.name, kgs, pykeys, [now] * len(pykeys))
        self.sweep(max(MIN_BUDGET, len(pykeys) * ENTRIES_PER_RECORD), now)

    def snapshot(self) -> None:
        """Record in every owned key group that ``"stamp"`` decides each key's life (the
        record of :mod:`epochal.ttl.registry`), so the offline state reader hides the keys
        expired at read time whose removal had not run yet. Task thread, in the operator's
        synchronous snapshot."""
        record = {"states": {}, "clock": None, "governs": governs_record("stamp", self.desc, stamped=False)}
        put = self.backend.put
        for kg in self.state.key_groups:
            put(self.meta, kg, META_KEY, record)

    def sweep(self, budget: int, now: int) -> int:
        """Visit key groups round robin until ``budget`` keys were looked at or each was
        visited once; returns the keys expired."""
        groups, b, ttl = self.state.key_groups, self.backend, self.ttl
        scanned = removed = 0
        for _ in range(self.cursor.n):
            if scanned >= budget or not len(groups):
                break
            kg = groups[self.cursor.take()]
            due = self._due.get(kg)
            if due is not None and now < due:
                scanned += 1
                continue
            stamps = b.value_items(self.name, kg)
            unstamped = self._unstamped(kg, stamps)
            if unstamped:  # a ttl added since the checkpoint: restored keys live from now
                b.put_many(self.name, [kg] * len(unstamped), unstamped, [now] * len(unstamped))
            dead = [key for key, stamp in stamps if stamp + ttl <= now]
            live = [stamp for _, stamp in stamps if stamp + ttl > now]
            self._due[kg] = min(live + [now]) + ttl
            if dead:
                self._remove(kg, dead)
                removed += len(dead)
            scanned += len(stamps) + 1
        return removed

    def _unstamped(self, kg: int, stamps: list) -> list:
        """Keys with accumulators but no stamp (only after a restore that added the ttl)."""
        st = self.state
        if isinstance(st, BlockState):
            block = st.blocks.get(kg)
            n = len(block) if block is not None else 0
            if n == len(stamps):
                return []
            have = {k for k, _ in stamps}
            return [k for k in block.keys.to_pylist() if k not in have]
        if self._due.get(kg) is not None:  # entries: checked once per key group
            return []
        have = {k for k, _ in stamps}
        return [k for k, _ in self.backend.value_items(st.entries_state, kg) if k not in have]

    def _remove(self, kg: int, dead: list) -> None:
        """Delete ``dead`` keys of ``kg`` from the accumulators and the stamps."""
        b, st = self.backend, self.state
        for key in dead:
            b.delete(self.name, kg, key)
        self.expired += len(dead)
        if isinstance(st, BlockState):
            block = st.blocks.get(kg)
            if block is None:
                return
            keep = np.flatnonzero(~pc.is_in(block.keys, value_set=pa.array(dead, block.keys.type))
                                  .to_numpy(zero_copy_only=False))
            new = KeyBlock(_take(block.keys, keep), [_take(c, keep) for c in block.accs], block.widths)
            st.blocks[kg] = new
            b.put(st.blocks_state, kg, kg, new)
            return
        for key in dead:
            b.delete(st.entries_state, kg, key)
