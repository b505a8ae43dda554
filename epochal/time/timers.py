"""Keyed timers: event time and processing time, kept as keyed state (per key group).

A timer is ``(key, timestamp)`` in one time domain of one operator. It lives in the task's
keyed backend as map state ``"<operator>/$timers.<domain>"``: under the timer's *user key's*
key group, map key = the timestamp as 8 order-preserving bytes, map entry = the user key.
So timers are snapshotted with the rest of the keyed state, restored by any backend, and
move with their key group when a job is rescaled (seed 004 §4.2.2) — nothing else to do.

Finding due timers needs their order across keys. A :class:`TimerQueue` gives it:

* :class:`IndexedTimerQueue` (heap backend): an in-memory heap of ``(timestamp, key group)``
  over the timers, rebuilt from the state at restore;
* :class:`ScanTimerQueue` (RocksDB, whose keys are sorted): only the earliest timestamp of
  every key group is kept in memory, found by one seek — a million timers cost
  ``O(key groups)`` memory (Flink's key-group-partitioned priority queue).

Both fire timers in timestamp order; timers of one timestamp fire in an unspecified order.
Registering a timer that exists is a no-op (a key has at most one timer per timestamp and
domain); deleting one that does not exist too. A timer deleted by a callback before its
turn does not fire, even when it was due in the same advance.
"""
from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from epochal.time.units import MAX_TIME, MIN_TIME, now_micros, to_micros, to_seconds

__all__ = ["EVENT_TIME", "PROCESSING_TIME", "IndexedTimerQueue", "ScanTimerQueue", "TimerQueue",
           "TimerService", "decode_time", "encode_time", "timer_state"]

EVENT_TIME = "event"
PROCESSING_TIME = "processing"
_BIAS = 1 << 63


def encode_time(us: int) -> bytes:
    """8 big-endian bytes that sort like the signed timestamp ``us``."""
    return (us + _BIAS).to_bytes(8, "big")


def decode_time(raw: bytes) -> int:
    return int.from_bytes(raw, "big") - _BIAS


def timer_state(operator: str, domain: str) -> str:
    """The keyed-state name holding ``operator``'s timers of ``domain``."""
    return f"{operator}/$timers.{domain}"


class TimerQueue(ABC):
    """The timers of one state, ordered by time across keys; task thread only."""

    def __init__(self, backend, state: str, key_groups: range):
        self.backend, self.state, self.key_groups = backend, state, key_groups

    def add(self, kg: int, ts: int, key) -> None:
        """Register ``key``'s timer at ``ts`` (µs); idempotent."""
        self.backend.map_put(self.state, kg, encode_time(ts), key, None)
        self._added(kg, ts)

    def remove(self, kg: int, ts: int, key) -> None:
        """Delete ``key``'s timer at ``ts``; idempotent."""
        raw = encode_time(ts)
        if self.backend.map_contains(self.state, kg, raw, key):
            self.backend.map_delete(self.state, kg, raw, key)
            self._removed(kg, ts)

    def pop_due(self, limit: int) -> Iterator[tuple[int, int, object]]:
        """Yield and delete ``(ts, kg, key)`` of every timer with ``ts <= limit``, in
        timestamp order, including timers added (or not yet deleted) while iterating."""
        backend, state = self.backend, self.state
        while True:
            head = self.peek()
            if head is None or head[0] > limit:
                return
            ts, kg = head
            raw = encode_time(ts)
            for key, _ in backend.map_items(state, kg, raw):
                if backend.map_contains(state, kg, raw, key):  # a callback may have deleted it
                    backend.map_delete(state, kg, raw, key)
                    yield ts, kg, key
            self._drained(kg, ts)

    @abstractmethod
    def peek(self) -> tuple[int, int] | None:
        """``(ts, kg)`` of the earliest timer, or ``None``."""

    @abstractmethod
    def _added(self, kg: int, ts: int) -> None: ...

    @abstractmethod
    def _removed(self, kg: int, ts: int) -> None: ...

    @abstractmethod
    def _drained(self, kg: int, ts: int) -> None:
        """Every timer of ``(kg, ts)`` seen by :meth:`pop_due` fired (new ones may exist)."""


class IndexedTimerQueue(TimerQueue):
    """Every ``(ts, kg)`` with timers in an in-memory heap (lazy deletion)."""

    def __init__(self, backend, state: str, key_groups: range):
        super().__init__(backend, state, key_groups)
        self._heap: list[tuple[int, int]] = []
        self._queued: set[tuple[int, int]] = set()
        for kg in key_groups:
            for raw in backend.map_keys(state, kg):
                self._added(kg, decode_time(raw))

    def _added(self, kg: int, ts: int) -> None:
        if (ts, kg) not in self._queued:
            self._queued.add((ts, kg))
            heapq.heappush(self._heap, (ts, kg))

    def _removed(self, kg: int, ts: int) -> None:
        pass  # the heap entry is dropped by peek once its map is empty

    def peek(self) -> tuple[int, int] | None:
        heap = self._heap
        while heap:
            ts, kg = heap[0]
            if self.backend.map_items(self.state, kg, encode_time(ts)):
                return ts, kg
            heapq.heappop(heap)
            self._queued.discard((ts, kg))
        return None

    def _drained(self, kg: int, ts: int) -> None:
        self.peek()  # drops the entry if no timer was re-added meanwhile


class ScanTimerQueue(TimerQueue):
    """Keeps only each key group's earliest timestamp in memory; the backend's key order
    (:attr:`~epochal.backends.base.KeyedStateBackend.ordered_map_keys`) finds the next."""

    def __init__(self, backend, state: str, key_groups: range):
        super().__init__(backend, state, key_groups)
        self._head: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []
        for kg in key_groups:
            self._reload(kg)

    def _reload(self, kg: int) -> None:
        raw = self.backend.map_first_key(self.state, kg)
        if raw is None:
            self._head.pop(kg, None)
        else:
            ts = decode_time(raw)
            if self._head.get(kg) != ts:
                self._head[kg] = ts
                heapq.heappush(self._heap, (ts, kg))

    def _added(self, kg: int, ts: int) -> None:
        head = self._head.get(kg)
        if head is None or ts < head:
            self._head[kg] = ts
            heapq.heappush(self._heap, (ts, kg))

    def _removed(self, kg: int, ts: int) -> None:
        if self._head.get(kg) == ts:
            self._reload(kg)

    def peek(self) -> tuple[int, int] | None:
        heap = self._heap
        while heap:
            ts, kg = heap[0]
            if self._head.get(kg) == ts:
                return ts, kg
            heapq.heappop(heap)  # stale: the key group's head moved
        return None

    def _drained(self, kg: int, ts: int) -> None:
        if self._head.get(kg) == ts:
            self._reload(kg)

    @property
    def heads(self) -> int:
        """Timestamps held in memory (one per key group with timers): for tests."""
        return len(self._head)


def make_queue(backend, state: str, key_groups: range) -> TimerQueue:
    cls = ScanTimerQueue if backend.ordered_map_keys else IndexedTimerQueue
    return cls(backend, state, key_groups)


Fire = Callable[[object, int, int, str], None]  # (key, kg, ts_us, domain)


class TimerService:
    """The timers of one keyed operator, as its user function sees them (``ctx.timers``).

    The user-facing methods act on the key of the record (or timer) being processed —
    the operator's current key, like keyed state. Timestamps are seconds (or datetimes)
    outside, microseconds inside (:mod:`epochal.time.units`).

    Operator contract: :meth:`advance_watermark` when the task's event-time clock moved
    (fires event-time timers ``<= watermark``); :meth:`next_processing_time` to know when
    to wake up and :meth:`fire_processing_time` then (fires processing-time timers
    ``<= now``). Both call ``fire(key, kg, ts_us, domain)`` with the current key already set
    to the timer's key by the caller's ``fire``.
    """

    def __init__(self, backend, operator: str, current, key_groups: range):
        self._current = current  # has .key and .kg (the operator's current key)
        self._operator = operator
        self._event = make_queue(backend, timer_state(operator, EVENT_TIME), key_groups)
        self._processing = make_queue(backend, timer_state(operator, PROCESSING_TIME), key_groups)
        self.watermark_us = MIN_TIME

    # -- user API (current key) ----------------------------------------------------------
    def _ts(self, t) -> int:
        return to_micros(t, f"timer of operator {self._operator!r}")

    def register_event_time(self, t) -> None:
        """Call ``on_timer`` once the watermark reaches ``t`` (at the end of a bounded input at
        the latest). A timer at or before the current watermark fires at the next advance."""
        self._event.add(self._current.kg, self._ts(t), self._current.key)

    def delete_event_time(self, t) -> None:
        self._event.remove(self._current.kg, self._ts(t), self._current.key)

    def register_processing_time(self, t) -> None:
        """Call ``on_timer`` once the wall clock reaches ``t`` (seconds since the epoch); a
        timer due while the job was down fires right after the restore."""
        self._processing.add(self._current.kg, self._ts(t), self._current.key)

    def delete_processing_time(self, t) -> None:
        self._processing.remove(self._current.kg, self._ts(t), self._current.key)

    @property
    def watermark(self) -> float:
        """The operator's current event time (seconds; ``-inf`` before the first watermark)."""
        return to_seconds(self.watermark_us)

    @staticmethod
    def processing_time() -> float:
        return now_micros() / 1_000_000

    # -- operator API ----------------------------------------------------------------------
    def advance_watermark(self, watermark: int, fire: Fire) -> None:
        """Fire event-time timers ``<= watermark``; at the end of a bounded input
        (``MAX_TIME``) every pending processing-time timer fires too, so no state waits
        for a wall-clock time the job will not live to see."""
        self.watermark_us = max(self.watermark_us, watermark)
        for ts, kg, key in self._event.pop_due(watermark):
            fire(key, kg, ts, EVENT_TIME)
        if watermark >= MAX_TIME:
            self.fire_processing_time(MAX_TIME, fire)

    def next_processing_time(self) -> int | None:
        head = self._processing.peek()
        return None if head is None else head[0]

    def fire_processing_time(self, now: int, fire: Fire) -> None:
        for ts, kg, key in self._processing.pop_due(now):
            fire(key, kg, ts, PROCESSING_TIME)
