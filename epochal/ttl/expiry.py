"""State time-to-live: the configuration and the pure rules of expiry.

A keyed state declared with ``ttl=`` keeps, next to every value (every map entry of a map
state), the *stamp* of its last update: the wall clock (nanoseconds) for processing-time TTL, the
event time (microseconds) of the record (or event-time timer) that wrote it for event-time
TTL. The rules below take any one unit, as long as stamp, ttl and clock share it. An entry is
**expired** once the state's clock reaches ``stamp + ttl``:

* processing time: the clock is the wall clock;
* event time: the clock is the operator's watermark — a key expires when the watermark
  passes its last update + ttl, so a replay or a backfill of last year's data expires keys
  as they expired then, not all at once now.

Expired entries are never returned (a read treats them as absent and deletes them); a
bounded incremental sweep (:mod:`epochal.ttl.cleanup`) deletes the ones nobody reads.

Everything here is pure — integers in, decisions out — and property-tested
(``tests/test_ttl_expiry.py``), the way :mod:`epochal.time.watermarks` is. The caller's
loop, per access of a key::

    now = clock.now()
    stored = backend.get(...)                       # (value, stamp) or missing
    if stored is missing or expired(stored[1], ttl, now): ... absent ...   # ttl in the stamps' unit
    backend.put(..., (value, next_stamp(cfg.time, stored_stamp_or_None, at)))

Restores compare the checkpoint's TTL of a state with the new declaration through
:func:`ttl_change` (allowed, refused — never silently misread).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from epochal.errors import ConfigError
from epochal.time.units import MIN_TIME, duration_micros

__all__ = ["EVENT", "PROCESSING", "ON_READ_AND_WRITE", "ON_WRITE", "StateTtl", "TtlChange", "clock_floor",
           "key_group_floors", "expired", "next_stamp", "ttl_change"]

PROCESSING, EVENT = "processing", "event"
ON_WRITE, ON_READ_AND_WRITE = "write", "read_and_write"


@dataclass(frozen=True)
class StateTtl:
    """How long a keyed state's entries live after their last update (Flink's
    ``StateTtlConfig``, plus event time).

    Args:
        ttl: a duration (seconds as a number, or ``"30s"``, ``"10min"``, ``"30d"`` ...) > 0.
        time: ``"processing"`` (wall clock, default) or ``"event"`` (the watermark: the
            operator's input needs event time, ``with_watermarks``).
        update: ``"write"`` (default: an entry's clock restarts when it is written) or
            ``"read_and_write"`` (also when it is read).

    >>> StateTtl("10s").ttl_us, StateTtl(30, time="event").time
    (10000000, 'event')
    """

    ttl: object
    time: str = PROCESSING
    update: str = ON_WRITE

    def __post_init__(self):
        if self.time not in (PROCESSING, EVENT):
            raise ConfigError(f"StateTtl time: expected 'processing' or 'event', got {self.time!r}")
        if self.update not in (ON_WRITE, ON_READ_AND_WRITE):
            raise ConfigError(f"StateTtl update: expected 'write' or 'read_and_write', got {self.update!r}")
        if duration_micros(self.ttl, "StateTtl ttl") <= 0:
            raise ConfigError(f"StateTtl ttl: must be > 0, got {self.ttl!r}")

    @property
    def ttl_us(self) -> int:
        return duration_micros(self.ttl, "StateTtl ttl")

    def describe(self) -> tuple:
        """What a checkpoint records of this config: ``(time, ttl_us, update)``."""
        return (self.time, self.ttl_us, self.update)

    @classmethod
    def coerce(cls, value, where: str) -> "StateTtl | None":
        """``ttl=`` as users give it: ``None``, a :class:`StateTtl`, or a bare duration
        (processing time, update on write)."""
        if value is None or isinstance(value, StateTtl):
            return value
        if isinstance(value, bool):
            raise ConfigError(f"{where}: ttl expects a duration or StateTtl, got {value!r}")
        try:
            return cls(value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def expired(stamp: int, ttl: int, now: int) -> bool:
    """Whether an entry stamped ``stamp`` has expired at clock ``now`` (one unit for all
    three): its life ``[stamp, stamp + ttl)`` is over once the clock reaches its end."""
    return stamp + ttl <= now


def next_stamp(time: str, old: int | None, at: int) -> int:
    """The stamp an update at ``at`` gives an entry whose live stamp is ``old`` (``None``:
    absent or expired). Processing time: ``at`` (the wall clock). Event time: the latest
    event time that touched the entry — an out-of-order (older) record never shortens a
    key's life, so a key lives ``ttl`` past its newest activity."""
    if time == EVENT and old is not None and old > at:
        return old
    return at


class TtlChange(enum.Enum):
    """How a state's TTL changed between a checkpoint and the restoring dataflow, and
    whether the restore may proceed (``allowed``)."""

    UNCHANGED = ("unchanged", True)
    ENABLED = ("ttl added: restored entries are stamped at the restore", True)
    DISABLED = ("ttl removed: restored entries are kept without expiry", True)
    RETUNED = ("ttl duration or update kind changed: applies to the restored stamps", True)
    DOMAIN = ("ttl time domain changed (processing <-> event): restored stamps are on the other clock", False)
    ENABLED_EVENT = ("event-time ttl added to restored entries that carry no event time", False)

    def __init__(self, text: str, allowed: bool):
        self.text = text
        self.allowed = allowed


def ttl_change(old: tuple | None, new: tuple | None, has_entries: bool) -> TtlChange:
    """Classify the change of one state's TTL on restore. ``old`` / ``new``: the
    :meth:`StateTtl.describe` tuples (``None``: no TTL); ``has_entries``: the checkpoint
    holds entries of the state. Pure; the rule table:

    ==========================  ==========================================  ========
    old → new                   effect                                      allowed
    ==========================  ==========================================  ========
    same                        nothing                                     yes
    none → processing           entries stamped "now" (live one more ttl)    yes
    none → event, entries       they carry no event time                    no
    ttl → none                  entries unwrapped, never expire             yes
    duration / update changed   new ttl applies to the restored stamps      yes
    processing ↔ event          stamps are on the other clock               no
    ==========================  ==========================================  ========
    """
    if old == new:
        return TtlChange.UNCHANGED
    if old is None:
        if not has_entries:
            return TtlChange.UNCHANGED
        return TtlChange.ENABLED_EVENT if new[0] == EVENT else TtlChange.ENABLED
    if new is None:
        return TtlChange.DISABLED
    if old[0] != new[0]:
        return TtlChange.DOMAIN
    return TtlChange.RETUNED


def clock_floor(restored_clocks) -> int:
    """The event-time clock a restored operator starts from: the highest watermark any
    old subtask recorded for the key groups it now owns (``MIN_TIME`` if none), so an entry
    expired at the checkpoint stays expired before the first watermark after a restore.
    Where the key groups' clocks differ (:func:`key_group_floors`), each key group keeps its
    own until the watermark passes this one."""
    return max((c for c in restored_clocks if c is not None), default=MIN_TIME)


def key_group_floors(key_groups, restored: list) -> dict[int, int] | None:
    """``{key group: its clock at the cut}`` from the restored TTL records (one per owned key
    group, ``None`` where there is none), or None when the recorded clocks are all equal
    (every aligned cut; a restore without a rescale): then one floor serves them all."""
    clocks = {kg: r["clock"] for kg, r in zip(key_groups, restored) if r and r.get("clock") is not None}
    return clocks if len(set(clocks.values())) > 1 else None
