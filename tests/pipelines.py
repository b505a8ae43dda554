"""Pipelines the golden-run tests share, and the golden-run comparison helpers.

Every pipeline's output is a deterministic multiset in a failure-free run (running
counts emit (key, 1..n) whatever the arrival order), so a faulty run can be compared
with a golden run record for record.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import threading
import time
import uuid

import epochal as ep
from epochal.sinks import FileSink, read_committed

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"]


def line(split: int, i: int) -> str:
    """Line ``i`` of split ``split``: 1–6 words, a pure function of its position."""
    x = (split * 1_000_003 + i * 7919 + 12345) * 1103515245 % (1 << 31)
    k = 1 + x % 6
    return " ".join(WORDS[(x >> (3 + j)) % len(WORDS)] for j in range(k))


def lines_from(split: int, offset: int):
    i = offset
    while True:
        yield line(split, i)
        i += 1


def wordcount(name: str, out: str, n_lines: int = 4000, parallelism: int = 2, source_splits: int = 4,
              rate: float | None = 1000.0) -> ep.Dataflow:
    """Keyed word count with two shuffles: words → (word, n) → count per n-bucket.

    The source is throttled (``rate`` lines/s per split) so runs span several epochs.
    """
    flow = ep.Dataflow(name, parallelism=parallelism)
    source = ep.sources.GeneratorSource(lines_from, num_splits=source_splits, limit=n_lines // source_splits,
                                        records_per_second=rate)
    text = flow.source("lines", source)
    counts = (
        text.flat_map("split", str.split)
        .map("pair", lambda w: (w, 1))
        .key_by(lambda p: p[0])
        .reduce("count", lambda a, b: (a[0], a[1] + b[1]))
    )
    buckets = (
        counts.key_by(lambda wc: wc[1] % 5)
        .process("bucket", BucketCount(), parallelism=max(1, parallelism - 1) if parallelism > 2 else parallelism)
    )
    counts.union(buckets).sink("out", FileSink(out))
    return flow


def running_counts(n_lines: int = 4000, source_splits: int = 4) -> list:
    """Plain Python: ``[w, k]`` for k = 1..count(w) of every word of the generated lines —
    what a keyed running count of :func:`lines_from` emits, in any order."""
    words = collections.Counter(w for s in range(source_splits) for i in range(n_lines // source_splits)
                                for w in line(s, i).split())
    return [[w, k] for w, c in words.items() for k in range(1, c + 1)]


def wordcount_oracle(n_lines: int = 4000, source_splits: int = 4) -> collections.Counter:
    """The committed output of :func:`wordcount`, computed in plain Python (no engine): a
    running count ``[w, k]`` for k = 1..count(w) of every word, and ``["bucket", b, n]`` for
    n = 1..(how many of those counts k have k % 5 == b)."""
    out = running_counts(n_lines, source_splits)
    buckets = collections.Counter(k % 5 for _, k in out)
    out += [["bucket", b, n] for b, c in buckets.items() for n in range(1, c + 1)]
    return canon(out)


class BucketCount(ep.KeyedProcessFunction):
    """Counts records per bucket; emits ("bucket", b, n)."""

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, key, value):
        n = self.n.value() + 1
        self.n.update(n)
        yield ("bucket", key, n)


class Join(ep.KeyedProcessFunction):
    """Joins orders and payments by id (map state holds the side that came first)."""

    def open(self, ctx):
        self.seen = ctx.map_state("seen")

    def process(self, key, value):
        side, payload = value[0], value[2]
        other = "payment" if side == "order" else "order"
        if other in self.seen:
            theirs = self.seen.get(other)
            self.seen.remove(other)
            order, payment = (payload, theirs) if side == "order" else (theirs, payload)
            yield {"id": key, "order": order, "payment": payment}
        else:
            self.seen.put(side, payload)


def join(name: str, out: str, n: int = 2000, parallelism: int = 2) -> ep.Dataflow:
    """Two sources (orders, payments) unioned and joined by id with keyed map state."""
    flow = ep.Dataflow(name, parallelism=parallelism)
    orders = flow.source("orders", ep.sources.GeneratorSource(
        _orders, num_splits=3, limit=n // 3, records_per_second=1000.0))
    payments = flow.source("payments", ep.sources.GeneratorSource(
        _payments, num_splits=2, limit=n // 4, records_per_second=1000.0), parallelism=1)
    joined = orders.union(payments).key_by(lambda r: r[1]).process("join", Join(), parallelism=3)
    joined.filter("paid", lambda r: r["payment"] is not None).sink("out", FileSink(out))
    return flow


def join_oracle(n: int = 2000) -> collections.Counter:
    """The committed output of :func:`join` in plain Python: one joined record per id that
    has both an order (3 splits of n // 3) and a payment (2 splits of n // 4)."""
    orders = {s + 3 * i for s in range(3) for i in range(n // 3)}
    payments = {2 * (s + 2 * i) for s in range(2) for i in range(n // 4)}
    return canon({"id": oid, "order": f"o{oid}", "payment": oid * 10} for oid in orders & payments)


def _orders(split: int, offset: int):
    i = offset
    while True:
        oid = split + 3 * i
        yield ("order", oid, f"o{oid}")
        i += 1


def _payments(split: int, offset: int):
    i = offset
    while True:
        oid = 2 * (split + 2 * i)  # even order ids, from both ends of the id range
        yield ("payment", oid, oid * 10)
        i += 1


def no_count_lost(got: collections.Counter, oracle: collections.Counter) -> str:
    """What an at-least-once running count promises, checked against the exactly-once oracle
    (both multisets of ``(key, n)``); "" if kept, else what is wrong.

    At-least-once lets a snapshot hold records from after its barrier (the tracker never
    blocks a channel); they are counted again after a restore. So intermediate ``(key, n)``
    whose sink epoch died with the crash may never reappear, and counts may overshoot. No
    input is lost: every key is there and its final count reaches at least the true one.
    """
    final, truth = collections.Counter(), collections.Counter()
    for (key, n), _ in got.items():
        final[key] = max(final[key], n)
    for (key, n), _ in oracle.items():
        truth[key] = max(truth[key], n)
    if set(final) != set(truth):
        return f"keys missing {sorted(set(truth) - set(final))[:5]}, unexpected {sorted(set(final) - set(truth))[:5]}"
    short = {k: (final[k], truth[k]) for k in truth if final[k] < truth[k]}
    return f"final counts below the truth (got, true): {dict(list(short.items())[:5])}" if short else ""


def canon(records) -> collections.Counter:
    """Multiset of records, made hashable (JSON lists/dicts → canonical strings)."""
    return collections.Counter(json.dumps(r, sort_keys=True) for r in records)


def output(path: str) -> collections.Counter:
    return canon(read_committed(path))


def unique_dir(tmp_path, name: str) -> str:
    return str(tmp_path / f"{name}-{uuid.uuid4().hex[:8]}")


def contains_all(big: collections.Counter, small: collections.Counter) -> bool:
    """At-least-once: every golden record appears at least as often as in the golden run."""
    return all(big[k] >= v for k, v in small.items())


# ---------------------------------------------------------------------------------- loops
def collatz_step(r):
    """(n, current, steps) → one Collatz step (1 stays 1)."""
    n, c, k = r
    if c == 1:
        return r
    return (n, c // 2 if c % 2 == 0 else 3 * c + 1, k + 1)


def _numbers(split: int, offset: int, splits: int = 2):
    i = offset
    while True:
        yield 1 + split + splits * i
        i += 1


def collatz(name: str, out: str, n: int = 300, parallelism: int = 2, body_parallelism: int = 2,
            rate: float | None = 400.0, log_memory_records: int = 100_000) -> ep.Dataflow:
    """Collatz step counts: each number loops a data-dependent number of times.

    The body's step runs with ``body_parallelism``; the feedback is key-partitioned by the
    number. Output: (n, 1, steps) per number.
    """
    flow = ep.Dataflow(name, parallelism=parallelism)
    src = flow.source("numbers", ep.sources.GeneratorSource(_numbers, num_splits=2, limit=n // 2,
                                                            records_per_second=rate))

    def body(s):
        step = s.map("step", collatz_step, parallelism=body_parallelism)
        return (step.filter("more", lambda r: r[1] != 1).key_by(lambda r: r[0]),
                step.filter("done", lambda r: r[1] == 1))

    (src.map("init", lambda x: (x, x, 0))
        .iterate("collatz", body, log_memory_records=log_memory_records)
        .sink("out", FileSink(out)))
    return flow


def collatz_golden(n: int) -> collections.Counter:
    out = []
    for x in range(1, 2 * (n // 2) + 1):
        r = (x, x, 0)
        while r[1] != 1:
            r = collatz_step(r)
        out.append(list(r))
    return canon(out)


class Components(ep.KeyedProcessFunction):
    """Label propagation: a vertex keeps its neighbours and the smallest label seen; an
    improvement is emitted ("label", v, l) and sent to every neighbour ("msg", w, l)."""

    def open(self, ctx):
        self.label = ctx.value_state("label", default=None)
        self.nbrs = ctx.map_state("nbrs")

    def process(self, key, rec):
        lab = self.label.value()
        if lab is None:
            lab = key
            self.label.update(lab)
            yield ("label", key, lab)
        if rec[0] == "edge":
            other = rec[2]
            if other not in self.nbrs:
                self.nbrs.put(other, True)
                yield ("msg", other, lab)
        elif rec[2] < lab:
            lab = rec[2]
            self.label.update(lab)
            yield ("label", key, lab)
            for w in self.nbrs.keys():
                yield ("msg", w, lab)


def random_edges(vertices: int, edges: int, seed: int = 7) -> list:
    import random

    rnd = random.Random(seed)
    return [(rnd.randrange(vertices), rnd.randrange(vertices)) for _ in range(edges)]


def components(name: str, out: str, edges: list, parallelism: int = 2, rate: float | None = 300.0) -> ep.Dataflow:
    """Connected components by label propagation over ``edges`` (keyed state in the loop)."""
    flow = ep.Dataflow(name, parallelism=parallelism)
    src = flow.source("edges", ep.sources.GeneratorSource(_edge_gen(edges), num_splits=2, limit=len(edges) // 2,
                                                          records_per_second=rate))

    def body(s):
        labels = s.key_by(lambda r: r[1]).process("cc", Components())
        return (labels.filter("msgs", lambda r: r[0] == "msg").key_by(lambda r: r[1]),
                labels.filter("labels", lambda r: r[0] == "label"))

    (src.flat_map("both", lambda e: [("edge", e[0], e[1]), ("edge", e[1], e[0])])
        .iterate("propagate", body)
        .sink("out", FileSink(out)))
    return flow


def _edge_gen(edges):
    def gen(split: int, offset: int):
        i = offset
        while 2 * i + split < len(edges):
            yield edges[2 * i + split]
            i += 1
    return gen


def components_golden(edges: list) -> dict:
    """Final label (smallest vertex id of its component) of every vertex with an edge."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, v in edges[: 2 * (len(edges) // 2)]:
        a, b = find(u), find(v)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return {v: find(v) for v in list(parent)}


def final_labels(records) -> dict:
    labels: dict = {}
    for _, v, lab in records:
        labels[v] = min(lab, labels.get(v, lab))
    return labels


def nested(name: str, out: str, n: int = 120, rounds: int = 3, parallelism: int = 2,
           rate: float | None = 300.0) -> ep.Dataflow:
    """Nested loops: an outer loop runs ``rounds`` rounds; each round runs the inner
    Collatz loop on (n + sum of previous step counts)."""
    flow = ep.Dataflow(name, parallelism=parallelism)
    src = flow.source("numbers", ep.sources.GeneratorSource(_numbers, num_splits=2, limit=n // 2,
                                                            records_per_second=rate))

    def inner_body(s):
        step = s.map("istep", lambda r: (r[0], *collatz_step((0, r[1], r[2]))[1:]))
        return (step.filter("imore", lambda r: r[1] != 1).key_by(lambda r: r[0][0]),
                step.filter("idone", lambda r: r[1] == 1))

    def outer_body(s):
        done = s.map("prep", lambda r: (r, r[1], 0)).iterate("inner", inner_body)
        nxt = done.map("advance", lambda r: (r[0][0], r[0][1] + r[2], r[0][2] + 1))
        return (nxt.filter("again", lambda r: r[2] < rounds).rebalance(),
                nxt.filter("finished", lambda r: r[2] >= rounds))

    src.map("init", lambda x: (x, x, 0)).iterate("outer", outer_body).sink("out", FileSink(out))
    return flow


def nested_golden(n: int, rounds: int = 3) -> collections.Counter:
    out = []
    for x in range(1, 2 * (n // 2) + 1):
        r = (x, x, 0)
        while r[2] < rounds:
            c = (0, r[1], 0)
            while c[1] != 1:
                c = collatz_step(c)
            r = (r[0], r[1] + c[2], r[2] + 1)
        out.append(list(r))
    return canon(out)


class Visits(ep.KeyedProcessFunction):
    """Counts a record's passes through the loop in keyed state: (n, c, k, r) → (n, c, visits, r)."""

    def open(self, ctx):
        self.visits = ctx.value_state("visits", default=0)

    def process(self, key, r):
        v = self.visits.value() + 1
        self.visits.update(v)
        yield (r[0], r[1], v, r[3])


def _step_only(r):
    return r if r[1] == 1 else (r[0], collatz_step(r[:3])[1], r[2] + 1, r[3])


def random_loop(name: str, out: str, topo: dict, n: int = 120) -> ep.Dataflow:
    """A loop-containing topology drawn by the Hypothesis test (see test_loops_hypothesis).

    Records are (n, current, steps, round). ``topo``: head parallelism, body stages
    (``("map"|"keyed", parallelism)``; keyed stages count visits in keyed state), feedback
    partitioning (``"hash" | "rebalance" | "forward"``), ``nested`` (an outer loop runs the
    loop twice, the second time from n + steps). Output is a deterministic multiset.
    """
    flow = ep.Dataflow(name, parallelism=2)
    src = flow.source("numbers", ep.sources.GeneratorSource(_numbers, num_splits=2, limit=n // 2,
                                                            records_per_second=400.0))

    def body(s):
        for k, (kind, p) in enumerate(topo["stages"]):
            if kind == "map":
                s = s.map(f"stage{k}", _step_only, parallelism=p)
            else:
                s = s.key_by(lambda r: (r[0], r[3])).process(f"stage{k}", Visits(), parallelism=p)
        if not any(kind == "map" for kind, _ in topo["stages"]):
            s = s.map("stepx", _step_only)
        more = s.filter("more", lambda r: r[1] != 1)
        fb = topo["feedback"]
        more = more.key_by(lambda r: r[0]) if fb == "hash" else more.rebalance() if fb == "rebalance" else more
        return more, s.filter("done", lambda r: r[1] == 1)

    def inner(s):
        return s.iterate("loop", body, parallelism=topo["head_parallelism"])

    def outer(s):
        nxt = inner(s).map("round", lambda r: (r[0], r[0] + r[2], r[2], r[3] + 1))
        return nxt.filter("again", lambda r: r[3] < 2).rebalance(), nxt.filter("last", lambda r: r[3] >= 2)

    start = src.map("init", lambda x: (x, x, 0, 0))
    (start.iterate("outer", outer) if topo["nested"] else inner(start)).sink("out", FileSink(out))
    return flow


def random_loop_oracle(topo: dict, n: int = 120) -> collections.Counter:
    """The committed output of :func:`random_loop` in plain Python: every number's record
    walks the body stage by stage (a keyed stage counts the passes of its (number, round)
    key), back through the feedback while not at 1, and through the outer loop's rounds."""
    stages = topo["stages"]

    def inner(r, visits):
        while True:
            for k, (kind, _p) in enumerate(stages):
                if kind == "map":
                    r = _step_only(r)
                else:
                    key = (k, r[0], r[3])
                    visits[key] = visits.get(key, 0) + 1
                    r = (r[0], r[1], visits[key], r[3])
            if not any(kind == "map" for kind, _ in stages):
                r = _step_only(r)
            if r[1] == 1:
                return r

    out = []
    for x in range(1, 2 * (n // 2) + 1):
        r, visits = (x, x, 0, 0), {}
        if not topo["nested"]:
            out.append(list(inner(r, visits)))
            continue
        while True:
            r = inner(r, visits)
            r = (r[0], r[0] + r[2], r[2], r[3] + 1)
            if r[3] >= 2:
                out.append(list(r))
                break
    return canon(out)


class CollatzVisits(ep.KeyedProcessFunction):
    """One Collatz step per pass, counting the number's passes in keyed state:
    (n, current, steps, visits) → (n, next, steps + 1, passes so far)."""

    def open(self, ctx):
        self.passes = ctx.value_state("passes", default=0)

    def process(self, key, r):
        v = self.passes.value() + 1
        self.passes.update(v)
        yield (*collatz_step(r[:3]), v)


def visits_loop(name: str, out: str, loop_parallelism: int, n: int = 400, rate: float | None = 80.0,
                log_memory_records: int = 100_000) -> ep.Dataflow:
    """A rescalable loop with keyed state in its body (the rescale tests of test_loop_rescale).

    The loop head and the keyed body operator ``visit`` run with ``loop_parallelism``;
    the source and the sink keep parallelism 2, so changing ``loop_parallelism`` between
    runs rescales exactly the loop. The feedback is key-partitioned. Output: (n, 1, steps, passes) per number, where
    ``passes`` comes from keyed state, so lost or doubled state shows in the output.
    """
    flow = ep.Dataflow(name, parallelism=loop_parallelism)
    src = flow.source("numbers", ep.sources.GeneratorSource(_numbers, num_splits=2, limit=n // 2,
                                                            records_per_second=rate), parallelism=2)

    def body(s):
        stepped = s.key_by(lambda r: r[0]).process("visit", CollatzVisits(), parallelism=loop_parallelism)
        return (stepped.filter("more", lambda r: r[1] != 1).key_by(lambda r: r[0]),
                stepped.filter("done", lambda r: r[1] == 1))

    (src.map("init", lambda x: (x, x, 0, 0), parallelism=2)
        .iterate("loop", body, parallelism=loop_parallelism, log_memory_records=log_memory_records)
        .sink("out", FileSink(out), parallelism=2))
    return flow


def visits_golden(n: int) -> collections.Counter:
    out = []
    for x in range(1, 2 * (n // 2) + 1):
        r, passes = (x, x, 0), 0
        while True:
            r, passes = collatz_step(r), passes + 1
            if r[1] == 1:
                break
        out.append([*r, passes])
    return canon(out)


def run_until_checkpoints(flow, url: str, epochs: int, resume: bool, backend="heap", interval: float = 0.05):
    """Run ``flow`` locally until ``epochs`` checkpoints completed, then cancel it (a job
    stopped mid-way, to resume from its storage ``url``)."""
    import time

    import pytest

    handle = flow.start(runtime="local", resume=resume, backend=backend,
                        checkpoint=ep.CheckpointConfig(interval=interval, storage=url))
    deadline = time.monotonic() + 60
    while len(handle.completed_epochs) < epochs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(handle.completed_epochs) >= epochs
    handle.cancel()
    with pytest.raises(ep.JobFailedError, match="cancelled"):
        handle.wait(60)
    return handle


def cancel_after_epoch(handle, holds, timeout: float = 120.0) -> dict | None:
    """Trigger epochs on the running ``handle`` (a job started with ``interval=None``) one
    at a time until a completed one satisfies ``holds(epoch)`` — e.g. it has channel state —
    then cancel the job. No epoch is triggered or pending at the cancel, so the epoch
    returned is the newest checkpoint: the restore point of a resumed run, chosen by the
    test rather than by timing. ``None`` when no epoch held within ``timeout`` seconds."""
    import time

    import pytest

    deadline, held = time.monotonic() + timeout, None
    try:
        while held is None and time.monotonic() < deadline and handle.running:
            seen = len(handle.completed_epochs)
            handle.trigger_epoch()
            wait_until = min(deadline, time.monotonic() + 30)
            while len(handle.completed_epochs) == seen and time.monotonic() < wait_until and handle.running:
                time.sleep(0.005)
            if len(handle.completed_epochs) > seen and holds(handle.completed_epochs[-1]):
                held = handle.completed_epochs[-1]
    finally:
        handle.cancel()
        with pytest.raises(ep.JobFailedError, match="cancelled"):
            handle.wait(60)
    return held


class PidFileKiller(threading.Thread):
    """SIGKILLs one task process from outside the engine (not an :mod:`epochal.testing`
    hook). The processes to choose from left a file in ``pid_dir`` named by their process id
    (``<pid>`` or ``<pid>-<suffix>``). Started at once: waits until ``ready()`` (e.g. a
    checkpoint completed; at most ``timeout`` seconds), then kills the first process, in
    file-name order, that is still alive while ``running()`` holds. ``killed`` holds the
    pid it killed — empty if it killed none, which the test asserts against. ``only(name)``
    narrows the files to choose from."""

    def __init__(self, pid_dir, ready, running=lambda: True, timeout: float = 120.0, only=lambda name: True):
        super().__init__(daemon=True)
        self.pid_dir, self.ready, self.running, self.timeout = pid_dir, ready, running, timeout
        self.only = only  # which files (processes) may be chosen
        self.killed: list[int] = []
        self.start()

    def run(self):
        deadline = time.monotonic() + self.timeout
        while not self.ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        for name in sorted(n for n in os.listdir(self.pid_dir) if self.only(n)):
            if self.running():
                pid = int(name.split("-")[0])
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                    return
                except ProcessLookupError:
                    continue
