"""Windows on keyed streams: tumbling, sliding and session windows in event time (or
processing time), with allowed lateness and a side output of late records.

    events.key_by(lambda e: e.user).window(Tumbling("1min")).aggregate("per_min", Sum())

See :mod:`epochal.windows.operator` for how windows fire, recover and rescale.
"""
from epochal.windows.assigners import Session, Sliding, Tumbling
from epochal.windows.functions import AggregateFunction, Window, WindowResult

__all__ = ["AggregateFunction", "Count", "Session", "Sliding", "Sum", "Tumbling", "Window", "WindowResult"]


class Count(AggregateFunction):
    """The number of elements of each window."""

    def create(self):
        return 0

    def add(self, acc, value):
        return acc + 1

    def merge(self, a, b):
        return a + b


class Sum(AggregateFunction):
    """The sum of ``field(value)`` (the value itself by default) over each window."""

    def __init__(self, field=None):
        self.field = field

    def create(self):
        return 0

    def add(self, acc, value):
        return acc + (value if self.field is None else self.field(value))

    def merge(self, a, b):
        return a + b
