"""``ctx.apply_to_keyed_state(name, fn)`` in ``process_broadcast_element``: a broadcast
element changes every key's state, exactly once (Flink's ``applyToKeyedState``).

System test against a plain-Python oracle through a crash (local runtime); the operator
alone for the contract's edges (ttl, where it may be called, unknown names)."""
from __future__ import annotations

import collections

import cloudpickle
import pytest

import epochal as ep
import test_broadcast
from epochal.backends.heap import HeapStateBackend
from epochal.broadcast import KeyedBroadcastProcessFunction
from epochal.broadcast.operator import KeyedBroadcastProcessOperator
from epochal.broadcast.state import BroadcastElement
from epochal.operators.base import OperatorContext
from epochal.testing import CrashAtRecord
from pipelines import canon, output, unique_dir
from test_broadcast import GatedSource, item

cloudpickle.register_pickle_by_value(test_broadcast)

CHANGES = {0: 2, 1500: 3, 3000: 5}
KEYS = 17


class ScaleTotals(KeyedBroadcastProcessFunction):
    """Counts events per key; a rule ("factor", f) multiplies every key's count by f."""

    def open(self, ctx):
        self.total = ctx.value_state("total", default=0)

    def process_broadcast_element(self, rule, ctx):
        factor = rule[1]
        ctx.apply_to_keyed_state("total", lambda key, state: state.update(state.value() * factor))

    def process_element(self, event, ctx):
        n = self.total.value() + 1
        self.total.update(n)
        yield [event[1], n]


def oracle(n: int) -> collections.Counter:
    totals: dict = {}
    out = []
    for i in range(n):
        kind, v = item(i, CHANGES)
        if kind == "rule":
            totals = {k: t * v for k, t in totals.items()}
        else:
            k = i % KEYS
            totals[k] = totals.get(k, 0) + 1
            out.append([i, totals[k]])
    return canon(out)


def test_a_rule_rescales_every_keys_state_exactly_once_through_a_crash(tmp_path):
    n = 4500
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    f = ep.Dataflow("bc-apply", parallelism=2)
    src = f.source("in", GatedSource(n, CHANGES, 3000.0), parallelism=1)
    rules = src.filter("rules", lambda r: r[0] == "rule")
    events = src.filter("events", lambda r: r[0] == "event")
    (events.key_by(lambda e: e[1] % KEYS).connect_broadcast(rules).process("scale", ScaleTotals(), parallelism=2)
        .sink("out", ep.sinks.FileSink(out, format="jsonl")))
    result = f.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, storage=url),
                   faults=[CrashAtRecord("scale", subtask=1, record=1000, how="exit", after_epoch=1)])
    assert result.attempts == 2, f"the crash did not fire: {result.failures}"
    want = oracle(n)
    assert want != oracle_without_rules(n)  # the rules really change the output
    assert output(out) == want


def oracle_without_rules(n: int) -> collections.Counter:
    totals: dict = {}
    out = []
    for i in range(n):
        if item(i, CHANGES)[0] == "event":
            totals[i % KEYS] = totals.get(i % KEYS, 0) + 1
            out.append([i, totals[i % KEYS]])
    return canon(out)


# ------------------------------------------------------------------ the operator alone
class Clock:
    def __init__(self):
        self.ns = 10 ** 18

    def __call__(self):
        return self.ns


class Apply(KeyedBroadcastProcessFunction):
    def __init__(self, ttl=None):
        self.ttl = ttl

    def open(self, ctx):
        self.ctx = ctx
        self.n = ctx.value_state("n", default=0, ttl=self.ttl)
        self.tags = ctx.map_state("tags")

    def process_broadcast_element(self, rule, ctx):
        if rule == "list":
            return ctx.apply_to_keyed_state("n", lambda key, s: [(key, s.value())])
        if rule == "clear-tags":
            ctx.apply_to_keyed_state("tags", lambda key, s: s.clear())
        if rule == "unknown":
            ctx.apply_to_keyed_state("nope", lambda key, s: None)
        return None

    def process_element(self, value, ctx):
        if value == "apply-here":
            ctx.apply_to_keyed_state("n", lambda key, s: None)
        self.n.update(self.n.value() + 1)
        self.tags.put(value, True)
        return None


def _op(function):
    b = HeapStateBackend(range(8), snapshot_mode="thread")
    ctx = OperatorContext("a", "a[0]", 0, 1, 0, "job", 8, b, range(8))
    return KeyedBroadcastProcessOperator(ctx, lambda v: v, function), b


def test_expired_keys_are_skipped_and_the_state_is_changed_in_place():
    clock = Clock()
    op, b = _op(Apply(ttl=ep.StateTtl(10)))
    op.function.n._now = op.function.n._at = clock  # the handle's processing-time clock (ns)
    op._sweeps = False  # the sweep (real clock) would delete the entries: expired ones must be skipped unswept
    op.process_batch(["x", "y"])
    clock.ns += 6 * 10 ** 9
    op.process_batch(["z", "z"])
    assert sorted(op.process_batch([BroadcastElement("list")])) == [("x", 1), ("y", 1), ("z", 2)]
    clock.ns += 5 * 10 ** 9  # x and y expired (11 s), z not (5 s)
    assert op.process_batch([BroadcastElement("list")]) == [("z", 2)]
    op.process_batch([BroadcastElement("clear-tags")])
    assert not any(b.map_keys("a/tags", kg) for kg in range(8))
    assert op.current.key is None  # the broadcast element leaves no key behind


def test_apply_to_keyed_state_errors():
    op, _ = _op(Apply())
    with pytest.raises(ep.OperatorError, match="only possible in process_broadcast_element"):
        op.process_batch(["apply-here"])
    with pytest.raises(ep.OperatorError, match=r"apply_to_keyed_state\('nope'\): no keyed state .*declared: \['n', 'tags'\]"):
        op.process_batch([BroadcastElement("unknown")])
