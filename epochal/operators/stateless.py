"""Stateless record-at-a-time operators: map, flat_map, filter."""
from __future__ import annotations

from epochal.operators.base import RuntimeOperator


class MapOperator(RuntimeOperator):
    """``fn(record) -> record``."""

    def __init__(self, ctx, fn):
        super().__init__(ctx)
        self.fn = fn

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        append = out.append
        record = None
        try:
            for record in records:
                append(fn(record))
        except Exception as exc:
            raise self.fail(record, exc) from exc
        return out


class FlatMapOperator(RuntimeOperator):
    """``fn(record) -> iterable of records`` (``None`` counts as empty). A ``str`` or
    ``bytes`` result is an error, not its characters: it is almost always a function that
    returns one record where an iterable of records was meant."""

    def __init__(self, ctx, fn):
        super().__init__(ctx)
        self.fn = fn

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        extend = out.extend
        record = None
        try:
            for record in records:
                produced = fn(record)
                if produced is not None:
                    _check_iterable(produced)
                    extend(produced)
        except Exception as exc:
            raise self.fail(record, exc) from exc
        return out


def _check_iterable(produced) -> None:
    if isinstance(produced, (str, bytes)):
        raise TypeError(f"flat_map returned a {type(produced).__name__} ({produced[:40]!r}); it "
                        "must return an iterable of records — wrap one record in a list, or use map")


class FilterOperator(RuntimeOperator):
    """Keeps records for which ``fn(record)`` is truthy."""

    def __init__(self, ctx, fn):
        super().__init__(ctx)
        self.fn = fn

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        append = out.append
        record = None
        try:
            for record in records:
                if fn(record):
                    append(record)
        except Exception as exc:
            raise self.fail(record, exc) from exc
        return out


class TimedMapOperator(MapOperator):
    """``map`` on a stream with event time: ``(ts, v)`` → ``(ts, fn(v))``."""

    def process_batch(self, records: list) -> list:
        fn = self.fn
        record = None
        try:
            return [(record[0], fn(record[1])) for record in records]
        except Exception as exc:
            raise self.fail(record, exc) from exc


class TimedFlatMapOperator(FlatMapOperator):
    """``flat_map`` on a stream with event time: outputs inherit the input's timestamp."""

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        append = out.append
        record = None
        try:
            for record in records:
                produced = fn(record[1])
                if produced is not None:
                    _check_iterable(produced)
                    ts = record[0]
                    for value in produced:
                        append((ts, value))
        except Exception as exc:
            raise self.fail(record, exc) from exc
        return out


class TimedFilterOperator(FilterOperator):
    """``filter`` on a stream with event time: the predicate sees the value."""

    def process_batch(self, records: list) -> list:
        fn = self.fn
        record = None
        try:
            return [record for record in records if fn(record[1])]
        except Exception as exc:
            raise self.fail(record, exc) from exc
