"""Pipelines the golden-run tests share, and the golden-run comparison helpers.

Every pipeline's output is a deterministic multiset in a failure-free run (running
counts emit (key, 1..n) whatever the arrival order), so a faulty run can be compared
with a golden run record for record.
"""
from __future__ import annotations

import collections
import json
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
