"""``aggregate(..., ttl=...)``: a columnar aggregate's keyed results expire after inactivity.

**Contract.** Processing time: a key's accumulators expire ``ttl`` of wall clock after the
last merge that updated the key — a merge happens before each barrier and when the buffer
reaches its budget, so a key's life starts at the merge of its newest rows, not at their
arrival (at most one epoch later). Event time (``StateTtl(d, time="event")``; the input
needs an event-time column, ``with_watermarks(name, timestamp="column")``): a key expires
once the operator's watermark reaches the newest event time of its rows + ``ttl`` (its
*deadline*): rows merged into it later start it afresh if their oldest event time is at
or after the deadline too — so a key's life does not depend on how far the watermark moved
while its rows waited in a buffer or in the pre-aggregation (an epoch may span more event
time than the ttl), nor on the end of a bounded input. Newest and oldest event time are
hidden ``max`` and ``min`` aggregations of the time column (:data:`STAMP`,
:data:`OLDEST`), combined in Arrow like the others (also by the local pre-aggregation):
two accumulator columns. Either way an
expired key is never merged into: its next rows start afresh (the emitted value counts
only them). Expiry itself emits nothing (the output is an update stream: no retraction).

**How.** Next to the accumulators (either layout of :mod:`epochal.columnar.state`) one
value state ``"<operator>/stamp"`` holds each key's last-merge time (ns; event time: its
newest event time, µs). Each merge
(:meth:`AggregateTtl.before_merge`) first reads the stamps of the epoch's keys (one
``get_many``) and removes the expired ones from the accumulators, so they start afresh;
after it (:meth:`AggregateTtl.after_merge`) stamps the merged keys (one ``put_many``) and
sweeps key groups round robin — each visit deletes the expired keys of one key group from
both states, a heap block filtered with one Arrow ``is_in`` — within a budget proportional
to the merged rows (:data:`~epochal.ttl.cleanup.ENTRIES_PER_RECORD`), skipping a key group
until its oldest key can have expired. State therefore stays bounded by the keys merged
within ``ttl`` (plus what the sweep has not reached).

Restores: the stamps are keyed state (snapshotted, restored and rescaled by key group with
the accumulators), and each key group's TTL record (:meth:`AggregateTtl.snapshot`: the
ttl and, for event time, the watermark at the cut) names them, so the offline reader hides
expired keys and a restored operator's event-time clock starts at the cut's watermark. A
processing-time ttl added since the checkpoint stamps the restored keys at their first
sweep visit (they live one more ttl); a ttl removed drops the stamps; a changed duration
applies to the restored stamps. Adding or removing an *event-time* ttl, or changing the
ttl's time domain, is refused on restore (:func:`check_restore`): the accumulators gain or
lose the hidden column, or the stamps are on the other clock. Task thread only.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochal.columnar.state import BlockState, KeyBlock, _take
from epochal.errors import ConfigError
from epochal.time.units import MIN_TIME
from epochal.ttl.cleanup import ENTRIES_PER_RECORD, MIN_BUDGET, SweepCursor
from epochal.ttl.expiry import EVENT, PROCESSING, StateTtl, clock_floor, key_group_floors
from epochal.ttl.registry import META_KEY, governs_record, meta_state, units

__all__ = ["OLDEST", "STAMP", "AggregateTtl", "check_restore", "drop_stamps"]

#: the hidden aggregations of an event-time ttl (never emitted): each key's newest event
#: time (the last aggregation) and the oldest of the rows merged (just before it)
STAMP = "\x00ttl"
OLDEST = "\x00ttl.oldest"


def restored_ttl(backend, operator: str, key_groups: range) -> tuple[tuple | None, list]:
    """``(the checkpoint's ttl description or None, the event-time clocks recorded)`` of
    the restored key groups. Stamps without a record are processing time (older versions
    recorded nothing)."""
    meta = meta_state(operator)
    if meta not in backend.state_names():
        has_stamps = stamp_state(operator) in backend.state_names() and any(
            backend.value_items(stamp_state(operator), kg) for kg in key_groups)
        return ((PROCESSING, None, None) if has_stamps else None), []
    records = [r for r in (backend.get(meta, kg, META_KEY) for kg in key_groups) if r]
    desc = next((tuple(r["governs"]["ttl"]) for r in records if r.get("governs")), None)
    return desc, [r.get("clock") for r in records]


def check_restore(backend, operator: str, key_groups: range, config: StateTtl | None, has_state: bool) -> None:
    """Refuse a restore that changes an event-time ttl (see the module docstring).

    Raises:
        ConfigError: naming the operator and the change.
    """
    old, _clocks = restored_ttl(backend, operator, key_groups)
    old_time = old[0] if old else None
    new_time = config.time if config is not None else None
    if old_time == new_time or not has_state or EVENT not in (old_time, new_time):
        return
    what = {(None, EVENT): "an event-time ttl added: the restored accumulators carry no event time",
            (EVENT, None): "the event-time ttl removed: the restored accumulators hold its hidden column",
            (PROCESSING, EVENT): "ttl time domain changed (processing -> event): the stamps are on the other clock",
            (EVENT, PROCESSING): "ttl time domain changed (event -> processing): the stamps are on the other clock"}
    raise ConfigError(f"aggregate {operator!r}: cannot restore: {what[(old_time, new_time)]}; keep the checkpoint's "
                      "ttl, or start the aggregate afresh under another name")


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
        config: its ``ttl``.
        wall_clock_ns: the processing-time clock (tests substitute one).
        watermark: the operator's watermark (µs), for an event-time ``config``.
    """

    def __init__(self, state, operator: str, config: StateTtl, wall_clock_ns: Callable[[], int] | None = None,
                 watermark: Callable[[], int] | None = None):
        self.state, self.backend = state, state.backend
        self.name = stamp_state(operator)
        self.event = config.time == EVENT
        self.ttl = config.ttl_us * units(config.time)  # in the stamps' unit
        self.meta, self.desc = meta_state(operator), config.describe()
        self._wall = wall_clock_ns or time.time_ns
        self._watermark = watermark or (lambda: MIN_TIME)
        # event time: a restored operator's watermark starts over; the cut's holds meanwhile
        self.floor = clock_floor(restored_ttl(self.backend, operator, state.key_groups)[1]) if self.event \
            else MIN_TIME
        #: each key group's own clock at the cut where they differ (a rescale from unaligned
        #: or at-least-once cuts, issue 46), else None: see :meth:`now_in`
        self.floors = key_group_floors(state.key_groups, [self.backend.get(self.meta, kg, META_KEY) for kg in
                                                          state.key_groups]) \
            if self.event and self.meta in self.backend.state_names() else None
        self.cursor = SweepCursor(max(1, len(state.key_groups)))
        self._due: dict[int, int] = {}  # key group -> clock before which nothing there expires
        self.expired = 0  # keys expired since the start (a metric)

    def now(self) -> int:
        """The clock keys expire against, in the stamps' unit: the wall clock (ns), or the
        watermark (µs, at least the restored cut's)."""
        if self.event:
            return max(self._watermark(), self.floor)
        return self._wall()

    def now_in(self, kg: int, now: int) -> int:
        """The clock of key group ``kg`` given :meth:`now`'s reading ``now``: the key
        group's own floor while the watermark is below the highest one (after a rescale from
        cuts whose old subtasks had seen different watermarks), else ``now``."""
        floors = self.floors
        if floors is None:
            return now
        watermark = self._watermark()
        if watermark >= self.floor:
            self.floors = None  # passed every floor: one clock again
            return now
        return max(watermark, floors.get(kg, MIN_TIME))

    def before_merge(self, partials: pa.Table, oldest_us=None) -> None:
        """Remove the epoch's keys whose accumulators expired, so the merge starts them
        afresh; event time: ``oldest_us``, per partial row its rows' oldest event time (an
        expired key's rows start it afresh only if they come after its deadline too)."""
        keys = partials.column(0).combine_chunks().to_pylist()
        kgs = self.state.groups.of_values(keys)
        stamps = self.backend.get_many(self.name, kgs, keys)
        now, ttl = self.now(), self.ttl
        gone: dict[int, list] = {}
        oldest = oldest_us.tolist() if self.event else [now] * len(keys)
        now_in = self.now_in if self.floors is not None else (lambda _kg, t: t)
        for key, kg, stamp, first in zip(keys, kgs, stamps, oldest):
            if stamp is not None and stamp + ttl <= min(now_in(kg, now), first):
                gone.setdefault(kg, []).append(key)
        for kg, dead in gone.items():
            self._remove(kg, dead)

    def after_merge(self, keys: pa.Array, newest_us=None) -> None:
        """Stamp the merged ``keys`` — now (processing time), or with ``newest_us``, their
        newest event times (the merged :data:`STAMP` accumulators, µs) — then one bounded
        sweep step."""
        pykeys = keys.to_pylist()
        kgs = self.state.groups.of_values(pykeys)
        now = self.now()
        stamps = newest_us.tolist() if self.event else [now] * len(pykeys)
        self.backend.put_many(self.name, kgs, pykeys, stamps)
        self.sweep(max(MIN_BUDGET, len(pykeys) * ENTRIES_PER_RECORD), now)

    def snapshot(self) -> None:
        """Record in every owned key group that ``"stamp"`` decides each key's life (the
        record of :mod:`epochal.ttl.registry`), so the offline state reader hides the keys
        expired at read time whose removal had not run yet. Task thread, in the operator's
        synchronous snapshot."""
        now = self.now() if self.event else None
        record = {"states": {}, "clock": now, "governs": governs_record("stamp", self.desc, stamped=False)}
        put = self.backend.put
        for kg in self.state.key_groups:
            put(self.meta, kg, META_KEY, record if self.floors is None else {**record, "clock": self.now_in(kg, now)})

    def sweep(self, budget: int, clock: int) -> int:
        """Visit key groups round robin until ``budget`` keys were looked at or each was
        visited once, each against its own clock (:meth:`now_in` of ``clock``); returns
        the keys expired."""
        groups, b, ttl = self.state.key_groups, self.backend, self.ttl
        scanned = removed = 0
        for _ in range(self.cursor.n):
            if scanned >= budget or not len(groups):
                break
            kg = groups[self.cursor.take()]
            now = self.now_in(kg, clock) if self.event else clock
            due = self._due.get(kg)  # processing time only: a late row stamps below the watermark
            if due is not None and now < due and not self.event:
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
