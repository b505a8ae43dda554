"""Keyed operators in process: the batch path (keys and key groups computed per batch)
gives what the record-by-record path gives — outputs, state under each key's key group,
event time, and rejections (dead letters or the error naming the record)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.backends.keygroups import key_group_for
from epochal.errors import OperatorError
from epochal.operators.base import DeadLetter, OperatorContext
from epochal.operators.keyed import KeyedProcessOperator, ReduceOperator

MAXP = 16


def ctx(backend) -> OperatorContext:
    return OperatorContext(operator="op", task="op[0]", subtask=0, parallelism=1, generation=0, job="j",
                           max_parallelism=MAXP, keyed_backend=backend, key_groups=range(MAXP))


class RunningCount(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.ctx = ctx
        self.n = ctx.value_state("n", default=0)
        self.seen = ctx.map_state("seen")

    def process(self, key, value):
        if value[1] == "boom":
            raise ValueError("boom")
        n = self.n.value() + 1
        self.n.update(n)
        self.seen.put(value, n)
        yield (key, n, self.ctx.timestamp)


def reduce_op(timed=False, dead_letters=False, key_fn=None):
    op = ReduceOperator(ctx(HeapStateBackend(range(MAXP))), key_fn or (lambda r: r[0]),
                        lambda a, r: (r[0], a[1] + r[1]), timed=timed)
    if dead_letters:
        op.enable_dead_letters()
    return op


def process_op(timed=False, dead_letters=False, key_fn=None):
    op = KeyedProcessOperator(ctx(HeapStateBackend(range(MAXP))), key_fn or (lambda r: r[0]), RunningCount(),
                              timed=timed)
    if dead_letters:
        op.enable_dead_letters()
    return op


def run_batches(op, batches):
    return [op.process_batch(b) for b in batches]


def run_one_by_one(op, batches):
    return [op._process_one_by_one(b) for b in batches]


keys = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", "ü", 1.0, True, None, b"x"]),
                 st.tuples(st.integers(0, 2), st.sampled_from(["x", "y"])))


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(keys, st.integers(0, 9)), max_size=40), max_size=5),
       timed=st.booleans())
def test_batch_path_equals_record_by_record_path(batches, timed):
    if timed:
        batches = [[(1000 * i, r) for i, r in enumerate(b)] for b in batches]
    for make in (reduce_op, process_op):
        fast, slow = make(timed), make(timed)
        assert run_batches(fast, batches) == run_one_by_one(slow, batches)
        assert sorted(map(repr, fast.ctx.keyed_backend.entries())) == sorted(map(repr, slow.ctx.keyed_backend.entries()))


def test_state_lives_under_the_key_group_of_the_key():
    op = reduce_op()
    records = [(k, 1) for k in ["a", "b", 7, ("t", 1), "a", 7.0]]
    assert op.process_batch(records) == [("a", 1), ("b", 1), (7, 1), (("t", 1), 1), ("a", 2), (7, 2)]
    backend = op.ctx.keyed_backend
    for k, n in [("a", 2), ("b", 1), (7, 2), (("t", 1), 1)]:
        assert backend.get("op/acc", key_group_for(k, MAXP), k) == (k, n)


def test_process_sees_key_and_event_time_of_each_record():
    op = process_op(timed=True)
    out = op.process_batch([(5_000_000, ("a", 0)), (6_000_000, ("b", 0)), (7_000_000, ("a", 0))])
    assert out == [(5_000_000, ("a", 1, 5.0)), (6_000_000, ("b", 1, 6.0)), (7_000_000, ("a", 2, 7.0))]
    assert op.current.key == "a" and op.current.kg == key_group_for("a", MAXP)


@pytest.mark.parametrize("make", [reduce_op, process_op])
@pytest.mark.parametrize("timed", [False, True])
def test_a_failing_key_is_rejected_where_it_stands_and_the_batch_goes_on(make, timed):
    def key_fn(r):
        if r[0] == "bad":
            raise KeyError("no key")
        return r[0]

    records = [("a", 1), ("bad", 1), ("a", 1), (["list"], 1), ("b", 1)]  # a list key is not supported
    if timed:
        records = [(i, r) for i, r in enumerate(records)]
    op = make(timed, dead_letters=True, key_fn=key_fn)
    out = op.process_batch(records)
    assert [(o[1] if timed else o)[:2] for o in out] == [("a", 1), ("a", 2), ("b", 1)]
    letters = op.side_output["dead_letters"]
    assert [d.record for d in letters] == [("bad", 1), (["list"], 1)]
    assert all(isinstance(d, DeadLetter) and d.operator == "op" for d in letters)
    assert letters[0].error.startswith("KeyError") and letters[1].error.startswith("TypeError: key of type list")
    # the same batch again: the memo of key groups changes nothing
    assert len(op.process_batch(records)) == 3 and len(letters) == 4


@pytest.mark.parametrize("make", [reduce_op, process_op])
def test_without_dead_letters_a_failing_key_fails_naming_the_record(make):
    op = make()
    with pytest.raises(OperatorError) as err:
        op.process_batch([("a", 1), ({"unhashable": 1}, 2), ("b", 3)])
    assert err.value.record_repr == "({'unhashable': 1}, 2)" and "not supported by key_by" in err.value.cause


def test_a_failing_function_is_rejected_and_the_rest_of_the_batch_is_processed():
    op = process_op(dead_letters=True)
    out = op.process_batch([("a", "x"), ("a", "boom"), ("a", "y")])
    assert out == [("a", 1, None), ("a", 2, None)]
    assert [d.record for d in op.side_output["dead_letters"]] == [("a", "boom")]
