"""The benchmarks' input: deterministic lines of words (standard library only).

One definition for every benchmark script and every peer runner (the peer runners also
run in PyFlink's own virtualenv, hence no other imports). ``tests/test_bench_cli.py``
checks it equals ``tests/pipelines.py`` ``line``, so benchmarks and golden-run tests count
the same input. Scripts that ship ``lines_from`` to epochal tasks register this module
with ``cloudpickle.register_pickle_by_value`` (task processes cannot import it).
"""
from __future__ import annotations

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]


def line(split: int, i: int) -> str:
    """Line ``i`` of split ``split``: 1–6 words, a pure function of its position."""
    x = (split * 1_000_003 + i * 7919 + 12345) * 1103515245 % (1 << 31)
    k = 1 + x % 6
    return " ".join(WORDS[(x >> (3 + j)) % len(WORDS)] for j in range(k))


def lines_from(split: int, offset: int):
    """The lines of ``split`` from ``offset`` on (a replayable GeneratorSource function)."""
    i = offset
    while True:
        yield line(split, i)
        i += 1


# ---------------------------------------------------------------------- timestamped events
# The input of benchmarks/event_windows.py: event g (a global index) is (key, t_us, value),
# its event time in integer microseconds. Event time advances EVENT_US per event, minus a
# jitter below the disorder bound, so windows close steadily while a job runs.
EVENT_T0_US = 1_700_000_000 * 1_000_000  # a multiple of 10 s: windows start on round numbers


def event(g: int, keys: int, event_us: int, disorder_us: int) -> tuple:
    """Event ``g``: ``(key, t_us, value)`` — key in ``0 .. keys-1``, value in 1..100,
    ``t_us = T0 + g * event_us - jitter`` with ``0 <= jitter < disorder_us``."""
    x = (g * 1103515245 + 12345) % (1 << 31)
    y = (g * 2654435761 + 97) % (1 << 32)
    return ((x >> 4) % keys, EVENT_T0_US + g * event_us - y % disorder_us, 1 + (x >> 16) % 100)


def events_of(split: int, offset: int, splits: int, per_split: int, keys: int, event_us: int, disorder_us: int):
    """Split ``split`` of ``splits``: events ``g = i * splits + split`` for ``offset <= i < per_split``
    (a replayable GeneratorSource function once the configuration is bound)."""
    for i in range(offset, per_split):
        yield event(i * splits + split, keys, event_us, disorder_us)
