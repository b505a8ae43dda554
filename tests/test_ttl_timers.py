"""Timers and TTL (docs/ttl-broadcast.md, "Timers and TTL"): a key's timers outlive its
expired state and fire; an event-time ``on_timer(t)`` sees event-time TTL state as at ``t``,
whatever the watermark cadence. The operator alone, against a plain-Python model."""
from __future__ import annotations

import collections
import random

import pytest

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.operators.base import OperatorContext
from epochal.operators.keyed import KeyedProcessOperator

KGS = range(8)
TTL = 15  # seconds of event time


class Remind(ep.KeyedProcessFunction):
    """Per record: count, and a timer ``delay`` seconds later that reports the count."""

    def open(self, ctx):
        self.ctx = ctx
        self.n = ctx.value_state("n", default=0, ttl=ep.StateTtl(TTL, time="event"))

    def process(self, key, value):
        self.n.update(self.n.value() + 1)
        self.ctx.timers.register_event_time(self.ctx.timestamp + value)
        return None

    def on_timer(self, key, timestamp, domain):
        yield (key, timestamp, self.n.value())


def _op(kind):
    b = HeapStateBackend(KGS, snapshot_mode="thread") if kind == "heap" else RocksDBStateBackend(KGS)
    ctx = OperatorContext("r", "r[0]", 0, 1, 0, "job", len(KGS), b, KGS)
    return KeyedProcessOperator(ctx, lambda v: v[0], _Unwrap(Remind()), timed=True), b


class _Unwrap(ep.KeyedProcessFunction):
    """Records are ``(key, delay)``; Remind sees the delay."""

    def __init__(self, inner):
        self.inner = inner

    def open(self, ctx):
        self.inner.open(ctx)

    def process(self, key, value):
        return self.inner.process(key, value[1])

    def on_timer(self, key, timestamp, domain):
        return self.inner.on_timer(key, timestamp, domain)


def _script(seed: int):
    """Records ``(ts s, key, delay s)`` in time order in [0, 20] s, each with a timer 21..40 s
    later: every timer comes after every record."""
    rng = random.Random(seed)
    return sorted((rng.randrange(0, 21), f"k{rng.randrange(6)}", rng.randrange(21, 41)) for _ in range(40))


def model(script) -> collections.Counter:
    """What every timer reports: its key's count of records since its state last expired,
    judged at the timer's time (an entry updated at s is live at t iff s + TTL > t); a timer
    fires whether or not the state expired (then it reports 0)."""
    out = collections.Counter()
    for when_key in sorted({(ts + d, k) for ts, k, d in script}):
        when, key = when_key
        n, last = 0, None
        for ts, k, _d in script:
            if k == key:
                if last is not None and last + TTL <= ts:
                    n = 0  # expired before this record: it starts afresh
                n, last = n + 1, ts
        out[(key, float(when), 0 if last + TTL <= when else n)] += 1
    return out


def run(op, script, steps: list) -> collections.Counter:
    """The records, a watermark at each record's time; then the watermark through ``steps``."""
    got = []
    for ts, key, delay in script:
        got += op.process_batch([(ts * 10 ** 6, (key, delay))])
        got += op.on_watermark(ts * 10 ** 6)
    for wm in steps:
        got += op.on_watermark(int(wm * 10 ** 6))
    return collections.Counter((v[0], v[1], v[2]) for _ts, v in got)


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_timers_fire_after_expiry_and_see_state_as_at_their_time(kind):
    script = _script(4)
    want = model(script)
    assert any(n == 0 for _k, _t, n in want)  # some timers fire after their key expired
    assert any(n > 1 for _k, _t, n in want)  # ... some before, with a count
    cadences = [[t + 0.5 for t in range(20, 62)],  # step by step: the sweep runs between timers
                [1000]]  # one jump past every timer
    for steps in cadences:
        op, b = _op(kind)
        try:
            assert run(op, script, steps) == want, steps[:3]
        finally:
            b.close()
