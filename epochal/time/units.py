"""Event time in epochal: integer microseconds inside, seconds (or ``datetime``) outside.

Every timestamp, watermark and timer travels and is stored as an ``int`` of microseconds
since the Unix epoch (Spark's ``TimestampType`` resolution), so window boundaries, timer
keys and watermark comparisons are exact. Users give seconds (``int``/``float``) or
``datetime`` and get seconds back as ``float``:

    >>> to_micros(12.3), to_micros(7), to_seconds(12_300_000)
    (12300000, 7000000, 12.3)
    >>> import datetime as dt
    >>> to_micros(dt.datetime(1970, 1, 1, 0, 0, 1, 5))   # naive datetimes are UTC
    1000005
    >>> duration_micros("5s", "max_out_of_orderness"), duration_micros(0.25, "slide")
    (5000000, 250000)

``MIN_TIME`` is the watermark before any event; ``MAX_TIME`` the watermark at the end of a
bounded input (every event-time timer and window fires).
"""
from __future__ import annotations

import datetime as _dt
import math
import time

from epochal.config import parse_duration
from epochal.errors import ConfigError

__all__ = ["MAX_TIME", "MIN_TIME", "duration_micros", "now_micros", "to_micros", "to_seconds"]

MIN_TIME = -(1 << 63)
MAX_TIME = (1 << 63) - 1
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_US = _dt.timedelta(microseconds=1)


def to_micros(ts, where: str = "timestamp") -> int:
    """Microseconds of ``ts``: seconds as ``int``/``float``, or a ``datetime`` (naive ones
    are taken as UTC, so a job gives the same answer on every host).

    Raises:
        TypeError: ``ts`` is not a number or a datetime, or is NaN/infinite; the message
            names ``where`` (e.g. ``"timestamp of operator 'wm'"``).
    """
    t = type(ts)
    if t is int:
        return ts * 1_000_000
    if t is float:
        if not math.isfinite(ts):
            raise TypeError(f"{where}: {ts!r} is not a finite timestamp")
        return round(ts * 1_000_000)
    if isinstance(ts, _dt.datetime):
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=_dt.timezone.utc)
        return (ts - _EPOCH) // _US
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):  # numpy scalars, IntEnum, ...
        return to_micros(float(ts) if isinstance(ts, float) else int(ts), where)
    raise TypeError(f"{where}: expected seconds (int/float) or a datetime, got {type(ts).__name__} {ts!r}")


def to_seconds(us: int) -> float:
    """Seconds of ``us`` microseconds; ``MIN_TIME`` / ``MAX_TIME`` become ∓infinity."""
    if us <= MIN_TIME:
        return -math.inf
    if us >= MAX_TIME:
        return math.inf
    return us / 1_000_000


def duration_micros(value, key: str, *, positive: bool = False) -> int:
    """Microseconds of a duration: seconds (``5``, ``0.25``) or a string (``"200ms"``,
    ``"5s"``, ``"2min"``).

    Raises:
        ConfigError: naming ``key`` for an unparseable, negative or (with ``positive``) zero
            duration.
    """
    us = round(parse_duration(value, key) * 1_000_000)
    if positive and us <= 0:
        raise ConfigError(f"{key}: must be a positive duration, got {value!r}")
    return us


def now_micros() -> int:
    """Processing time: the wall clock in microseconds."""
    return time.time_ns() // 1000
