"""Stateless record-at-a-time operators: map, flat_map, filter (and their event-time
variants, whose records are ``(timestamp, value)`` pairs: the function sees the value and
outputs inherit the timestamp).

A record whose function raises goes to :meth:`~RuntimeOperator.reject`: the job fails
naming the operator and the record, or — with ``dead_letters=True`` — the record goes to the
operator's dead-letter output and the batch goes on. (A ``try`` per record costs nothing
until something raises, CPython ≥ 3.11.)
"""
from __future__ import annotations

from epochal.operators.base import RuntimeOperator


def _check_iterable(produced):
    """``produced`` as a list: a ``str``/``bytes`` is an error, not its characters (almost
    always a function that returns one record where an iterable was meant); a generator is
    run to the end first, so one that raises half-way emits nothing."""
    if type(produced) is list:
        return produced
    if isinstance(produced, (str, bytes)):
        raise TypeError(f"flat_map returned a {type(produced).__name__} ({produced[:40]!r}); it "
                        "must return an iterable of records — wrap one record in a list, or use map")
    return list(produced)


class MapOperator(RuntimeOperator):
    """``fn(record) -> record``."""

    def __init__(self, ctx, fn):
        super().__init__(ctx)
        self.fn = fn

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        append = out.append
        for record in records:
            try:
                append(fn(record))
            except Exception as exc:
                self.reject(record, exc)
        return out


class FlatMapOperator(RuntimeOperator):
    """``fn(record) -> iterable of records`` (``None`` counts as empty)."""

    def __init__(self, ctx, fn):
        super().__init__(ctx)
        self.fn = fn

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        extend = out.extend
        for record in records:
            try:
                produced = fn(record)
                if produced is not None:
                    extend(_check_iterable(produced))
            except Exception as exc:
                self.reject(record, exc)
        return out


class FilterOperator(RuntimeOperator):
    """Keeps records for which ``fn(record)`` is truthy."""

    def __init__(self, ctx, fn):
        super().__init__(ctx)
        self.fn = fn

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        append = out.append
        for record in records:
            try:
                if fn(record):
                    append(record)
            except Exception as exc:
                self.reject(record, exc)
        return out


class TimedMapOperator(MapOperator):
    """``map`` on a stream with event time: ``(ts, v)`` → ``(ts, fn(v))``."""

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        append = out.append
        for ts, value in records:
            try:
                append((ts, fn(value)))
            except Exception as exc:
                self.reject(value, exc)
        return out


class TimedFlatMapOperator(FlatMapOperator):
    """``flat_map`` on a stream with event time: outputs inherit the input's timestamp."""

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        extend = out.extend
        for ts, value in records:
            try:
                produced = fn(value)
                if produced is not None:
                    extend([(ts, v) for v in _check_iterable(produced)])
            except Exception as exc:
                self.reject(value, exc)
        return out


class TimedFilterOperator(FilterOperator):
    """``filter`` on a stream with event time: the predicate sees the value."""

    def process_batch(self, records: list) -> list:
        fn = self.fn
        out = []
        append = out.append
        for record in records:
            try:
                if fn(record[1]):
                    append(record)
            except Exception as exc:
                self.reject(record[1], exc)
        return out
