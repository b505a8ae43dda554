"""The offline view of TTL state: which entries a reader of a checkpoint may return.

A key group's TTL record (:mod:`epochal.ttl.registry`) says which of the operator's states
are stamped and with what TTL; the reader (:mod:`epochal.state.reader`, the ``epochal
state`` CLI, savepoint reads) unwraps live entries and leaves out expired ones, judged
against the wall clock at read time for processing-time TTL and against the event-time
clock recorded at the cut for event-time TTL — so expired values are never returned,
whether or not the sweep had deleted them before the checkpoint.

Some operators decide a key's life as a whole by one state (a window's ``"active"``, a
columnar aggregate's ``"stamp"``): their record names it (``"governs"``), and a key whose
entry there expired is hidden entirely (:meth:`KeyGroupTtl.hidden_keys`) — its panes,
timers or accumulators included, though the operator's expiry had not run at the cut.

A temporal join with a processing-time ttl keeps its stamp inside the value (``[probes,
versions, arrival_us]``, :mod:`epochal.joins.temporal`): its record names that state
(``"table"``, :func:`~epochal.ttl.registry.record_table_ttl`), and the reader shows a
table whose newest version arrived ``ttl`` or more before the read without its versions —
and hides the key entirely (timers included) when no probe is pending either, as the
operator's timer would have left it.
"""
from __future__ import annotations

import time as _time

from epochal.joins.temporal import expire_table
from epochal.ttl.expiry import EVENT, expired
from epochal.ttl.registry import META, META_KEY, units

__all__ = ["KeyGroupTtl"]


class KeyGroupTtl:
    """TTL of one key group's states as recorded in a checkpoint section.

    Args:
        values: the section's value states (``{backend name: {key: value}}``).
        prefix: ``"<operator>/"``.
        wall_now: the processing-time clock (ns, as ``time.time_ns``) to judge against;
            default: now.
    """

    def __init__(self, values: dict, prefix: str, wall_now: int | None = None):
        record = (values.get(prefix + META) or {}).get(META_KEY)
        self._states = dict(record["states"]) if record else {}
        self._clock = record.get("clock") if record else None
        self._wall = _time.time_ns() if wall_now is None else wall_now
        self._governs = record.get("governs") if record else None
        self._table = record.get("table") if record else None
        self._panes = record.get("panes") if record else None
        self._values, self._prefix = values, prefix

    def hidden_keys(self) -> set:
        """The keys of this key group whose governing entry (if the record names one)
        expired: none of their entries may be returned."""
        gov = self._governs
        if not gov:
            return self._gone_tables()
        time, ttl_us = gov["ttl"][0], gov["ttl"][1]
        now = self._clock if time == EVENT else self._wall
        if now is None:
            return set()
        life = ttl_us * units(time)
        stamped = gov["stamped"]
        entries = self._values.get(self._prefix + gov["state"]) or {}
        return {key for key, stored in entries.items() if expired(stored[1] if stamped else stored, life, now)}

    def _gone_tables(self) -> set:
        """Keys of a temporal join whose table expired with no probe pending."""
        table = self._table
        if not table:
            return set()
        entries = self._values.get(self._prefix + table["state"]) or {}
        return {key for key, stored in entries.items() if self._expired_table(stored) and not stored[0]}

    def _expired_table(self, stored) -> bool:
        return expire_table(list(stored), self._table["ttl"][1], self._wall // 1000)

    def judges_panes(self, short: str) -> bool:
        """Whether state ``short`` holds a columnar window's key blocks with a processing-time ttl."""
        return bool(self._panes) and short == self._panes["state"]

    def expired_pane_keys(self, short: str, entries: list) -> set:
        """Keys of a columnar window's key blocks (``entries``: ``(key, row)``, the row's last
        accumulator the wall clock in µs of the key's rows) whose newest stamp is ``ttl``
        old at read time (processing time, :func:`~epochal.ttl.registry.panes_record`): none
        of their panes may be returned."""
        if not self.judges_panes(short):
            return set()
        newest: dict = {}
        for key, row in entries:
            newest[key] = max(newest.get(key, row[-1]), row[-1])
        now_us = self._wall // 1000
        return {key for key, stamp in newest.items() if stamp + self._panes["ttl_us"] <= now_us}

    @staticmethod
    def is_meta(short: str) -> bool:
        """``short`` is the reserved TTL record, not user state."""
        return short == META

    def live(self, short: str, stored):
        """``(True, value)`` for a live entry of state ``short`` (unwrapped when the state
        is stamped), ``(False, None)`` for an expired one; a temporal join's table without
        its versions once they expired (``(False, None)`` if no probe is pending)."""
        table = self._table
        if table is not None and short == table["state"]:
            if not self._expired_table(stored):
                return True, stored
            return (True, [stored[0], [], None]) if stored[0] else (False, None)
        desc = self._states.get(short)
        if desc is None:
            return True, stored
        time, ttl_us = desc[0], desc[1]
        now = self._clock if time == EVENT else self._wall
        if now is not None and expired(stored[1], ttl_us * units(time), now):
            return False, None
        return True, stored[0]
