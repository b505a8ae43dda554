"""Dataflows and plain-Python oracles of the TTL system tests (tests/test_ttl_system.py)
and the soak benchmark.

Event-time sessions over a growing key space: record ``i`` has event time ``i`` seconds and
key ``phase_keys(i)``; a phase lasts :data:`PHASE` records, during which its :data:`WIDTH`
keys each recur every ``WIDTH`` seconds (well inside ``TTL``); a key set comes back
``REUSE`` phases later, long after every key of it expired. So the count a key reaches
is the same whatever the batching and watermark cadence (the watermark lags the records by
at most a batch, far less than ``REUSE * PHASE - TTL`` seconds): the oracle is exact.
"""
from __future__ import annotations

import collections
import os

import epochal as ep

PHASE, WIDTH, REUSE, TTL = 2000, 100, 3, 500


def key_of(i: int) -> str:
    phase = i // PHASE
    return f"k{phase % (REUSE * 2)}-{i % WIDTH}"  # key sets recur every 2*REUSE phases


def events(split: int, offset: int):
    i = offset
    while True:
        yield (key_of(i), i)
        i += 1


class Sessions(ep.KeyedProcessFunction):
    """Counts a key's events since its state last expired (event-time ttl)."""

    def __init__(self, ttl, pid_dir: str | None = None):
        self.ttl, self.pid_dir = ttl, pid_dir

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0, ttl=self.ttl)
        self.seen = ctx.map_state("seen", ttl=self.ttl)
        if self.pid_dir:
            open(os.path.join(self.pid_dir, str(os.getpid())), "w").close()

    def process(self, key, event):
        n = self.n.value() + 1
        self.n.update(n)
        first = self.seen.get("first", event[1])  # the session's first event time
        self.seen.put("first", first)
        yield (key, n, first)


def sessions(name: str, out: str, n: int, *, ttl=None, parallelism: int = 2, rate: float | None = None,
             pid_dir: str | None = None) -> ep.Dataflow:
    ttl = ttl or ep.StateTtl(TTL, time="event")
    flow = ep.Dataflow(name, parallelism=parallelism)
    (flow.source("events", ep.sources.GeneratorSource(events, num_splits=1, limit=n, records_per_second=rate),
                 parallelism=1)
         .with_watermarks("wm", timestamp=lambda e: e[1], parallelism=1)
         .key_by(lambda e: e[0])
         .process("sessions", Sessions(ttl, pid_dir), parallelism=parallelism)
         .sink("out", ep.sinks.FileSink(out, format="jsonl")))
    return flow


def sessions_oracle(n: int, ttl: int = TTL) -> collections.Counter:
    """The output of :func:`sessions` over records ``0 .. n-1``, computed in plain Python:
    a key's state expires once event time passes its last update + ttl."""
    last, count, first = {}, {}, {}
    out = collections.Counter()
    for i in range(n):
        k = key_of(i)
        if k in last and last[k] + ttl <= i - 1:  # expired well before (the gaps are huge)
            del last[k], count[k], first[k]
        count[k] = count.get(k, 0) + 1
        first.setdefault(k, i)
        last[k] = i
        out[(k, count[k], first[k])] += 1
    return out


def _add(a, b):
    return (a[0], a[1] + b[1])


def reduce_sessions(name: str, out: str, n: int, parallelism: int = 2) -> ep.Dataflow:
    """The same events counted by ``reduce(..., ttl=...)``: emits ``[key, count]``."""
    flow = ep.Dataflow(name, parallelism=parallelism)
    (flow.source("events", ep.sources.GeneratorSource(events, num_splits=1, limit=n), parallelism=1)
         .with_watermarks("wm", timestamp=lambda e: e[1], parallelism=1)
         .map("one", lambda e: (e[0], 1), parallelism=1)
         .key_by(lambda e: e[0])
         .reduce("count", _add, ttl=ep.StateTtl(TTL, time="event"), parallelism=parallelism)
         .sink("out", ep.sinks.FileSink(out, format="jsonl")))
    return flow
