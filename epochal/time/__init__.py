"""Event time: timestamps, watermarks and timers (see :mod:`epochal.time.watermarks`,
:mod:`epochal.time.timers`, :mod:`epochal.time.units`)."""
from epochal.time.timers import EVENT_TIME, PROCESSING_TIME
from epochal.time.units import MAX_TIME, MIN_TIME, to_micros, to_seconds

__all__ = ["EVENT_TIME", "MAX_TIME", "MIN_TIME", "PROCESSING_TIME", "to_micros", "to_seconds"]
