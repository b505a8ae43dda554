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
