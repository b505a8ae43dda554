"""Property tests: random small topologies under random faults, compared with the plain-Python
oracle of each topology (its golden output).

Hypothesis draws a dataflow — one or two throttled generator sources, then 2–5 steps out
of map / flat_map / filter / keyed count (reduce) / keyed process (value or map state) /
rebalance / union with the second source's branch, each operator with parallelism 1–3 —
ending in a transactional ``FileSink``. Every operator is a pure function of its input
multiset (keyed state only counts or de-duplicates), so a failure-free run's committed
output is a deterministic multiset however records interleave.

It then draws faults aimed at that graph (crash at a record, during alignment, during a
snapshot upload, during the sink's asynchronous durability step, during a sink commit) and
checks:

* exactly-once: the faulty run's committed output equals the oracle's as a multiset;
* at-least-once (some examples): the faulty output contains every oracle record at least
  as often as the oracle has it.

A fault whose condition never occurs (e.g. a record index past the operator's input) does
not fire: that run is failure-free and must equal the oracle too. (A failure-free engine
run per example, compared with the oracle before the faulty run, took a third of the
test's time and asserted nothing the faulty run does not: equal to the oracle, no
attempt beyond one per fault generation.)
"""
from __future__ import annotations

import functools
import itertools
import os
import sys
from dataclasses import dataclass

import cloudpickle
from hypothesis import HealthCheck, event, given, note, reject, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.sinks import FileSink
from epochal.testing import (CrashAtRecord, CrashDuringAlignment, CrashDuringCommit, CrashDuringDurability,
                             CrashDuringSnapshotUpload)

from pipelines import contains_all, output, unique_dir

# Task processes cannot import this module: ship its functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RESTART = ep.RestartStrategy(max_attempts=4, delay=0)
CHANNELS = ep.ChannelConfig(batch_size=16, linger="2ms")
RUN_TIMEOUT_S = 90.0  # a hang becomes a test failure instead of a stuck test run

MOD = 100_003


# ---------------------------------------------------------------------------- pure functions
def mix(r, salt: int = 0) -> int:
    """Deterministic 32-bit hash of an int or a (nested) tuple of ints (never ``hash()``:
    string hashing differs between processes, and records here are ints and tuples)."""
    if isinstance(r, (tuple, list)):
        x = 0x345678 ^ salt
        for e in r:
            x = (x * 1_000_003) ^ mix(e, salt)
            x &= 0xFFFFFFFF
    else:
        x = (int(r) ^ (salt * 0x9E3779B1)) & 0xFFFFFFFF
    x = (x * 0x85EBCA6B + 0xC2B2AE35) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0x27D4EB2F) & 0xFFFFFFFF
    x ^= x >> 16
    return x


def gen(seed: int, split: int, offset: int):
    """Records of one generator split: a pure function of (seed, split, position)."""
    i = offset
    while True:
        yield mix((seed, split, i)) % MOD
        i += 1


def map_fn(salt: int, r) -> int:
    return (mix(r, salt) + salt) % MOD


def flat_map_fn(salt: int, r) -> list:
    """0, 1 or 2 records, decided by the record itself."""
    h = mix(r, salt)
    return [(h + 7 * j) % MOD for j in range(h % 3)]


def filter_fn(salt: int, modulus: int, r) -> bool:
    return mix(r, salt) % modulus != 0


def key_fn(salt: int, keys: int, r) -> int:
    return mix(r, salt) % keys


def count_fn(salt: int, keys: int, acc, r):
    """Reduce with ``initial=(None, 0)``: the running count per key → (key, n)."""
    return (key_fn(salt, keys, r), acc[1] + 1)


class CountPerKey(ep.KeyedProcessFunction):
    """Value state: emits (key, n) for the n-th record of a key (every ``every``-th one)."""

    def __init__(self, every: int):
        self.every = every

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, key, value):
        n = self.n.value() + 1
        self.n.update(n)
        if n % self.every == 0:
            yield (key, n)


class DistinctPerKey(ep.KeyedProcessFunction):
    """Map state: emits each distinct record of a key once (the set is order-insensitive)."""

    def open(self, ctx):
        self.seen = ctx.map_state("seen")

    def process(self, key, value):
        if value not in self.seen:
            self.seen.put(value, True)
            yield (key, value)


class BucketCounts(ep.KeyedProcessFunction):
    """Map state: counts per (key, sub-bucket of the record) → (key, bucket, n)."""

    def __init__(self, salt: int):
        self.salt = salt

    def open(self, ctx):
        self.counts = ctx.map_state("counts")

    def process(self, key, value):
        b = mix(value, self.salt) % 3
        n = self.counts.get(b, 0) + 1
        self.counts.put(b, n)
        yield (key, b, n)


# ---------------------------------------------------------------------------- topology spec
@dataclass(frozen=True)
class SourceSpec:
    name: str
    seed: int
    splits: int
    limit: int  # per split
    rate: float  # records/s per split
    parallelism: int


@dataclass(frozen=True)
class Step:
    kind: str  # map flat_map filter count process_count process_distinct process_buckets rebalance union
    parallelism: int = 1
    salt: int = 0
    param: int = 1


@dataclass(frozen=True)
class DagSpec:
    sources: tuple[SourceSpec, ...]
    branch: tuple[Step, ...]  # stateless steps on the second source before the union
    steps: tuple[Step, ...]
    sink_parallelism: int
    interval: float


def _apply(stream, step: Step, name: str):
    p = step.parallelism
    if step.kind == "map":
        return stream.map(name, functools.partial(map_fn, step.salt), parallelism=p)
    if step.kind == "flat_map":
        return stream.flat_map(name, functools.partial(flat_map_fn, step.salt), parallelism=p)
    if step.kind == "filter":
        return stream.filter(name, functools.partial(filter_fn, step.salt, step.param), parallelism=p)
    if step.kind == "rebalance":
        return stream.rebalance()
    keyed = stream.key_by(functools.partial(key_fn, step.salt, step.param))
    if step.kind == "count":
        return keyed.reduce(name, functools.partial(count_fn, step.salt, step.param), initial=(None, 0),
                            parallelism=p)
    if step.kind == "process_count":
        return keyed.process(name, CountPerKey(1 + step.salt % 3), parallelism=p)
    if step.kind == "process_distinct":
        return keyed.process(name, DistinctPerKey(), parallelism=p)
    if step.kind == "process_buckets":
        return keyed.process(name, BucketCounts(step.salt), parallelism=p)
    raise AssertionError(step.kind)


def build(spec: DagSpec, out: str, job: str = "dag") -> ep.Dataflow:
    flow = ep.Dataflow(job, parallelism=2)
    streams = [
        flow.source(s.name, ep.sources.GeneratorSource(functools.partial(gen, s.seed), num_splits=s.splits,
                                                       limit=s.limit, records_per_second=s.rate),
                    parallelism=s.parallelism)
        for s in spec.sources
    ]
    main = streams[0]
    branch = streams[1] if len(streams) > 1 else None
    if branch is not None:
        for i, step in enumerate(spec.branch):
            branch = _apply(branch, step, f"b{i}_{step.kind}")
    for i, step in enumerate(spec.steps):
        if step.kind == "union":
            main = main.union(branch)
        else:
            main = _apply(main, step, f"s{i}_{step.kind}")
    main.sink("out", FileSink(out), parallelism=spec.sink_parallelism)
    return flow


# ---------------------------------------------------------------------------- the oracle
def oracle(spec: DagSpec):
    """The committed output of ``build(spec)`` in plain Python, over multisets: every
    operator is a pure function of its input multiset (see the module docstring)."""
    import collections

    from pipelines import canon

    def records(src: SourceSpec) -> list:
        return [x for split in range(src.splits)
                for x in itertools.islice(gen(src.seed, split, 0), src.limit)]

    def apply(recs: list, step: Step) -> list:
        k = step.kind
        if k == "map":
            return [map_fn(step.salt, r) for r in recs]
        if k == "flat_map":
            return [x for r in recs for x in flat_map_fn(step.salt, r)]
        if k == "filter":
            return [r for r in recs if filter_fn(step.salt, step.param, r)]
        if k == "rebalance":
            return recs
        groups: dict = collections.defaultdict(list)
        for r in recs:
            groups[key_fn(step.salt, step.param, r)].append(r)
        if k == "count":
            return [(key, n) for key, rs in groups.items() for n in range(1, len(rs) + 1)]
        if k == "process_count":
            every = 1 + step.salt % 3
            return [(key, n) for key, rs in groups.items() for n in range(1, len(rs) + 1) if n % every == 0]
        if k == "process_distinct":
            return [(key, v) for key, rs in groups.items() for v in set(rs)]
        if k == "process_buckets":
            out = []
            for key, rs in groups.items():
                per = collections.Counter(mix(v, step.salt) % 3 for v in rs)
                out += [(key, b, n) for b, c in per.items() for n in range(1, c + 1)]
            return out
        raise AssertionError(k)

    main = records(spec.sources[0])
    branch = records(spec.sources[1]) if len(spec.sources) > 1 else []
    for step in spec.branch:
        branch = apply(branch, step)
    for step in spec.steps:
        main = main + branch if step.kind == "union" else apply(main, step)
    return canon(list(r) if isinstance(r, tuple) else r for r in main)


# ---------------------------------------------------------------------------- strategies
PAR = st.integers(1, 3)
SALT = st.integers(0, 10_000)
STATELESS = ("map", "flat_map", "filter")
KEYED = ("count", "process_count", "process_distinct", "process_buckets")
HOW = st.sampled_from(["raise", "exit"])


@st.composite
def steps(draw, kinds):
    kind = draw(st.sampled_from(kinds))
    if kind == "rebalance":
        return Step("rebalance")
    param = draw(st.integers(2, 4)) if kind == "filter" else draw(st.integers(2, 24))
    return Step(kind, draw(PAR), draw(SALT), param)


@st.composite
def dag_specs(draw) -> DagSpec:
    n_sources = draw(st.integers(1, 2))
    total = draw(st.integers(300, 1500))
    duration = draw(st.floats(0.25, 0.6))  # seconds each split takes at its throttled rate
    sources = []
    for k in range(n_sources):
        splits = draw(st.integers(1, 3))
        limit = max(1, total // n_sources // splits)
        sources.append(SourceSpec(f"src{k}", draw(SALT), splits, limit, limit / duration, draw(PAR)))
    n_ops = draw(st.integers(2, 5))
    body = [draw(steps(STATELESS + KEYED + ("rebalance",))) for _ in range(n_ops)]
    branch: tuple = ()
    if n_sources == 2:
        body.insert(draw(st.integers(0, n_ops)), Step("union"))
        branch = tuple(draw(st.lists(steps(STATELESS), max_size=1)))
    body = _without_replaced_partitionings(body)
    return DagSpec(tuple(sources), branch, tuple(body), draw(PAR), draw(st.floats(0.03, 0.05)))


def _without_replaced_partitionings(body: list) -> list:
    """Drop a rebalance that the next repartitioning (a keyed step or another rebalance,
    past a union) would replace: epochal refuses such graphs when they are built."""
    kept = []
    for i, step in enumerate(body):
        if step.kind == "rebalance":
            nxt = next((s for s in body[i + 1:] if s.kind != "union"), None)
            if nxt is not None and nxt.kind in KEYED + ("rebalance",):
                continue
        kept.append(step)
    return kept


@st.composite
def faults_for(draw, spec: DagSpec) -> list:
    """1–2 faults aimed at the operators and tasks of ``spec``'s physical plan (a second
    fault sometimes fires in the restarted attempt)."""
    plan = build(spec, "/nonexistent").plan()
    nodes = plan.nodes
    sources = {s.name for s in spec.sources}
    operators = [n for n in nodes if n not in sources]  # CrashAtRecord never wraps a source
    aligning = [(op, t.subtask) for t in plan.tasks if len(t.inputs) > 1 for op in t.chain]
    kinds = ["record", "upload", "commit", "durability"] + (["alignment"] if aligning else [])
    faults = []
    for k in range(draw(st.integers(1, 2))):
        common = dict(generation=0 if k == 0 else draw(st.integers(0, 1)), after_epoch=draw(st.integers(0, 2)))
        kind = draw(st.sampled_from(kinds))
        if kind == "record":
            op = draw(st.sampled_from(operators))
            faults.append(CrashAtRecord(op, subtask=draw(st.integers(0, nodes[op].parallelism - 1)),
                                        record=draw(st.integers(1, 200)), how=draw(HOW), **common))
        elif kind == "alignment":
            op, subtask = draw(st.sampled_from(aligning))
            faults.append(CrashDuringAlignment(op, subtask=subtask, epoch=draw(st.integers(1, 5)), how=draw(HOW),
                                               **common))
        elif kind == "upload":
            op = draw(st.sampled_from(sorted(nodes)))
            faults.append(CrashDuringSnapshotUpload(op, subtask=draw(st.integers(0, nodes[op].parallelism - 1)),
                                                    epoch=draw(st.integers(1, 5)), how="exit", **common))
        elif kind == "durability":  # the sink's asynchronous durability step (exactly-once only)
            faults.append(CrashDuringDurability("out", subtask=draw(st.integers(0, spec.sink_parallelism - 1)),
                                                epoch=draw(st.integers(1, 5)), how=draw(HOW), **common))
        else:
            faults.append(CrashDuringCommit("out", subtask=draw(st.integers(0, spec.sink_parallelism - 1)),
                                            epoch=draw(st.integers(1, 5)), how=draw(HOW), **common))
    return faults


# ---------------------------------------------------------------------------- runs
def _run(spec: DagSpec, tmp_path, guarantee: str, faults=()):
    out = unique_dir(tmp_path, "out")
    cfg = ep.CheckpointConfig(interval=spec.interval, storage="file://" + unique_dir(tmp_path, "ckpt"))
    handle = build(spec, out).start(guarantee=guarantee, checkpoint=cfg, restart=RESTART, channels=CHANNELS,
                                    runtime="local", faults=list(faults))
    try:
        result = handle.wait(RUN_TIMEOUT_S)
    except TimeoutError:
        handle.cancel()
        raise AssertionError(f"{guarantee} run with faults {list(faults)} hung for {RUN_TIMEOUT_S} s")
    return result, output(out)


def _describe(result, label: str, faults=()) -> None:
    failures = [f.splitlines()[0] for f in result.failures]
    note(f"{label}: attempts={result.attempts} restored_from={result.restored_from} "
         f"epochs={len(result.completed_epochs)} failures={failures}")
    event(f"{label} attempts: {result.attempts}")
    # Each fault fires at most once, in its own generation: no spurious restarts.
    assert result.attempts <= 1 + len({f.generation for f in faults}), failures


# EPOCHAL_RANDOM_DAG_EXAMPLES=200 for a longer bug hunt (the default run keeps the suite under 30 minutes).
EXAMPLES = int(os.environ.get("EPOCHAL_RANDOM_DAG_EXAMPLES", "8"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


@SETTINGS
@given(data=st.data())
def test_random_dag_with_faults_equals_golden(tmp_path, data):
    spec = data.draw(dag_specs(), label="dag")
    faults = data.draw(faults_for(spec), label="faults")
    also_at_least_once = data.draw(st.integers(0, 2), label="also at-least-once") == 0

    golden = oracle(spec)  # plain Python: the engine's output must equal it, faults or not
    event(f"golden records: {'<100' if sum(golden.values()) < 100 else '>=100'}")

    result, got = _run(spec, tmp_path, "exactly-once", faults)
    _describe(result, "exactly-once", faults)
    if got != golden:
        missing, extra = golden - got, got - golden
        raise AssertionError(
            f"exactly-once output differs from the oracle: {sum(missing.values())} missing "
            f"(e.g. {list(missing)[:5]}), {sum(extra.values())} extra (e.g. {list(extra)[:5]})")

    if also_at_least_once:
        result, got = _run(spec, tmp_path, "at-least-once", faults)
        _describe(result, "at-least-once", faults)
        missing = golden - got
        assert contains_all(got, golden), (
            f"at-least-once output lacks {sum(missing.values())} golden records (e.g. {list(missing)[:5]})")
    fired.append(result.attempts > 1)
    if result.attempts == 1:  # no fault fired: the example proves nothing about recovery
        reject()


fired: list[bool] = []  # per passing example of the test above: did a fault fire?


def test_most_random_dag_faults_fired():
    """Runs after the property test (file order): faults that never fire would make it pass
    vacuously. ``reject()`` already keeps those examples from counting; here at least half
    of all drawn examples must have had a fault fire."""
    if not fired:
        import pytest

        pytest.skip("the random-DAG property test did not run in this session")
    assert sum(fired) >= len(fired) / 2, f"only {sum(fired)} of {len(fired)} examples had a fault fire"
