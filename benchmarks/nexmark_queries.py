"""Nexmark: the generator, the queries on epochal's record path and on Spark Structured
Streaming, and the plain-Python oracles (used by ``benchmarks/nexmark.py``).

The generator follows the Nexmark specification (Tucker et al., "NEXMark – A Benchmark for
Queries over Data Streams"; the Beam/Flink generator's defaults): events come in blocks of
50 — 1 person, 3 auctions, 46 bids —; an
auction's seller is a recent person, a bid's auction a recent auction (hot auctions get
most bids: the Beam generator's 1/HOT_RATIO skew), its bidder a recent person. Event ``g``
(0, 1, 2, ...) is a pure function of ``(seed, g)``, so every engine reads the same events.

Events are tuples, the kind first, the event time (ms) last:

* person ``(0, id, name, city, state, t)``
* auction ``(1, id, seller, category, reserve, expires, t)``
* bid ``(2, auction, bidder, price, t)``

Queries (output rows are tuples; the oracles give them as multisets):

* q1 currency conversion: every bid ``(auction, bidder, price * 908 // 1000, t)``;
* q2 selection: ``(auction, price)`` of bids with ``auction % 123 == 0``;
* q3 local item suggestion: persons in OR/ID/CA joined with their auctions of category 10,
  ``(name, city, state, auction id)`` — an unbounded keyed join (a KeyedCoProcessFunction);
* q7 highest bid: per 10 s tumbling window, ``(window start, max price)``;
* q8 monitor new users: persons and auctions (by seller) in the same 10 s tumbling window
  — a window join, ``(person id, name, window start, auction id)`` (one row per pair; the
  Flink SQL version deduplicates sellers first).
"""
from __future__ import annotations

import collections
import random

FIRST_PERSON, FIRST_AUCTION = 1000, 1000
T0_MS = 1_700_000_000_000
EVENTS_PER_S = 1_000  # event time per event: 1 ms (the Nexmark generator's rate, a parameter)
HOT_RATIO = 2
STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
          "Cheyenne")
NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
WINDOW_MS = 10_000


def event(g: int, seed: int = 7) -> tuple:
    """Event number ``g``."""
    rng = random.Random(seed * 1_000_003 + g)
    t = T0_MS + g * 1000 // EVENTS_PER_S
    block, r = divmod(g, 50)
    if r == 0:  # the block's person
        pid = FIRST_PERSON + block
        return (0, pid, f"{rng.choice(NAMES)} {rng.choice(NAMES)}", rng.choice(CITIES), rng.choice(STATES), t)
    persons = block + 1  # persons so far
    if r <= 3:  # the block's auctions
        aid = FIRST_AUCTION + block * 3 + r - 1
        seller = FIRST_PERSON + max(0, persons - 1 - rng.randrange(min(persons, 20)))
        return (1, aid, seller, 10 + rng.randrange(5), 100 + rng.randrange(10_000), t + 10_000 + rng.randrange(20_000), t)
    auctions = block * 3 + min(r, 3)
    if rng.randrange(HOT_RATIO):  # hot: one of the last few auctions
        auction = FIRST_AUCTION + auctions - 1 - rng.randrange(min(auctions, 4))
    else:
        auction = FIRST_AUCTION + rng.randrange(auctions)
    bidder = FIRST_PERSON + rng.randrange(persons)
    return (2, auction, bidder, 100 + rng.randrange(100_000), t)


def events_of(split: int, offset: int, *, splits: int, n: int, seed: int = 7):
    """Split ``split``'s events from its ``offset``-th: ``g = split, split + splits, ...``."""
    return (event(g, seed) for g in range(split + offset * splits, n, splits))


# ------------------------------------------------------------------------- oracles
def oracle(query: str, n: int, seed: int = 7) -> collections.Counter:
    evs = [event(g, seed) for g in range(n)]
    bids = [e for e in evs if e[0] == 2]
    if query == "q1":
        return collections.Counter((b[1], b[2], b[3] * 908 // 1000, b[4]) for b in bids)
    if query == "q2":
        return collections.Counter((b[1], b[3]) for b in bids if b[1] % 123 == 0)
    persons = {e[1]: e for e in evs if e[0] == 0}
    auctions = [e for e in evs if e[0] == 1]
    if query == "q3":
        return collections.Counter((persons[a[2]][2], persons[a[2]][3], persons[a[2]][4], a[1]) for a in auctions
                                   if a[3] == 10 and persons[a[2]][4] in ("OR", "ID", "CA"))
    if query == "q7":
        best = {}
        for b in bids:
            w = b[4] - b[4] % WINDOW_MS
            best[w] = max(best.get(w, 0), b[3])
        return collections.Counter(best.items())
    if query == "q8":
        return collections.Counter((p[1], p[2], p[5] - p[5] % WINDOW_MS, a[1]) for a in auctions
                                   for p in [persons[a[2]]] if p[5] // WINDOW_MS == a[6] // WINDOW_MS)
    raise ValueError(query)


# ------------------------------------------------------------------------- epochal
def q3_function():
    import epochal as ep

    class Q3(ep.KeyedCoProcessFunction):
        """Persons (input 1) and auctions by seller (input 2): a person's row is kept; an
        auction before its seller's row waits for it."""

        def open(self, ctx):
            self.person = ctx.value_state("person")
            self.waiting = ctx.value_state("waiting")

        def process1(self, pid, p):
            self.person.update(p)
            waiting = self.waiting.value()
            if waiting:
                self.waiting.clear()
                return [(p[2], p[3], p[4], aid) for aid in waiting]
            return None

        def process2(self, seller, a):
            p = self.person.value()
            if p is None:
                self.waiting.update((self.waiting.value() or []) + [a[1]])
                return None
            return [(p[2], p[3], p[4], a[1])]

    return Q3()


def _max_price(a, b):
    return a if a[3] >= b[3] else b


def write_jsonl(directory: str, n: int, splits: int, seed: int = 7) -> str:
    """The events as JSON lines of arrays, one file per split (split ``s``: events ``s, s +
    splits, ...``, in time order), for :func:`epochal_flow`; written once per directory."""
    import json
    import os

    if not os.path.isdir(directory):
        os.makedirs(directory + ".tmp", exist_ok=True)
        for s in range(splits):
            with open(os.path.join(directory + ".tmp", f"events-{s:03d}.jsonl"), "w") as f:
                f.writelines(json.dumps(e) + "\n" for e in events_of(s, 0, splits=splits, n=n, seed=seed))
        os.rename(directory + ".tmp", directory)
    return directory


def epochal_flow(query: str, indir: str, out: str, parallelism: int = 2):
    """The Dataflow of ``query`` over the event files in ``indir`` (:func:`write_jsonl`),
    written to ``out`` (FileSink). Records are JSON arrays (lists) indexed like the tuples."""
    import epochal as ep
    from epochal.windows import Tumbling

    flow = ep.Dataflow(f"nexmark-{query}", parallelism=parallelism)
    events = flow.source("events", ep.sources.DirectorySource(indir, pattern="*.jsonl", format="jsonl"))
    if query in ("q7", "q8"):
        events = events.with_watermarks("event-time", timestamp=lambda e: e[-1], timestamp_unit="ms",
                                        max_out_of_orderness="1s")
    if query == "q1":
        result = events.flat_map("q1", lambda e: [(e[1], e[2], e[3] * 908 // 1000, e[4])] if e[0] == 2 else [])
    elif query == "q2":
        result = events.flat_map("q2", lambda e: [(e[1], e[3])] if e[0] == 2 and e[1] % 123 == 0 else [])
    elif query == "q3":
        persons = events.filter("persons", lambda e: e[0] == 0 and e[4] in ("OR", "ID", "CA"))
        auctions = events.filter("auctions", lambda e: e[0] == 1 and e[3] == 10)
        result = (persons.key_by(lambda p: p[1]).connect(auctions.key_by(lambda a: a[2]))
                  .process("q3", q3_function()))
    elif query == "q7":
        result = (events.filter("bids", lambda e: e[0] == 2).key_by(lambda b: 0)
                  .window(Tumbling(WINDOW_MS / 1000)).reduce("q7", _max_price)
                  .map("q7-row", lambda w: (round(w.start * 1000), w.value[3])))
    elif query == "q8":
        persons = events.filter("persons", lambda e: e[0] == 0).key_by(lambda p: p[1])
        auctions = events.filter("auctions", lambda e: e[0] == 1).key_by(lambda a: a[2])
        result = (persons.window_join(auctions, Tumbling(WINDOW_MS / 1000))
                  .apply("q8", lambda p, a: (p[1], p[2], p[5] - p[5] % WINDOW_MS, a[1])))
    else:
        raise ValueError(query)
    result.sink("out", ep.sinks.FileSink(out))
    return flow


# ------------------------------------------------------------------------- epochal, columnar
#: the queries epochal runs on Arrow batches too (stateless: vectorized filter / project)
COLUMNAR = ("q1", "q2")


def _q2_mask(batch):
    import pyarrow.compute as pc

    auction = batch["auction"]
    rest = pc.subtract(auction, pc.multiply(pc.divide(auction, 123), 123))  # integer division: auction % 123
    return pc.and_(pc.equal(batch["kind"], 2), pc.equal(rest, 0))


def epochal_columnar_flow(query: str, parquet_dir: str, out: str, parallelism: int = 2):
    """``query`` (q1, q2) on Arrow batches read from the same Parquet files Spark reads
    (without the sentinel file), written as Parquet by the FileSink."""
    import pyarrow.compute as pc

    import epochal as ep
    from epochal.columnar.sources import ArrowFileSource

    flow = ep.Dataflow(f"nexmark-{query}-columnar", parallelism=parallelism)
    events = flow.source("events", ArrowFileSource(parquet_dir, pattern="part-0*.parquet", format="parquet"))
    if query == "q1":
        result = (events.filter("bids", pc.field("kind") == 2)
                  .with_column("euros", "price", lambda b: pc.divide(pc.multiply(b["price"], 908), 1000))
                  .select("q1", "auction", "bidder", "price", "t"))
    elif query == "q2":
        result = events.filter("q2-filter", _q2_mask).select("q2", "auction", "price")
    else:
        raise ValueError(f"{query} has no columnar version")
    result.sink("out", ep.sinks.FileSink(out, format="parquet"))
    return flow


# ------------------------------------------------------------------------- Spark SS
SPARK_SCHEMA = ("kind INT, id LONG, name STRING, city STRING, state STRING, seller LONG, category INT, "
                "reserve LONG, auction LONG, bidder LONG, price LONG, t LONG")


def spark_row(e: tuple) -> dict:
    if e[0] == 0:
        return {"kind": 0, "id": e[1], "name": e[2], "city": e[3], "state": e[4], "t": e[5]}
    if e[0] == 1:
        return {"kind": 1, "id": e[1], "seller": e[2], "category": e[3], "reserve": e[4], "t": e[6]}
    return {"kind": 2, "auction": e[1], "bidder": e[2], "price": e[3], "t": e[4]}


def spark_query(query: str, events):
    """The streaming DataFrame of ``query`` over ``events`` (SPARK_SCHEMA) and its columns."""
    from pyspark.sql import functions as F

    ts = F.expr("timestamp_millis(t)")
    bids = events.where("kind = 2")
    if query == "q1":
        return bids.select("auction", "bidder", F.expr("price * 908 div 1000").alias("price"), "t")
    if query == "q2":
        return bids.where("auction % 123 = 0").select("auction", "price")
    persons = events.where("kind = 0").select(F.col("id").alias("pid"), "name", "city", "state",
                                               F.col("t").alias("pt"))
    auctions = events.where("kind = 1").select(F.col("id").alias("aid"), "seller", "category", F.col("t").alias("at"))
    if query == "q3":
        p = persons.where("state in ('OR', 'ID', 'CA')")
        a = auctions.where("category = 10")
        return p.join(a, F.expr("pid = seller")).select("name", "city", "state", "aid")
    if query == "q7":
        return (bids.withColumn("ts", ts).withWatermark("ts", "1 second")
                .groupBy(F.window("ts", f"{WINDOW_MS // 1000} seconds")).agg(F.max("price").alias("price"))
                .select(F.expr("unix_millis(window.start)").alias("start"), "price"))
    if query == "q8":
        win = f"{WINDOW_MS // 1000} seconds"
        p = (persons.withColumn("pts", F.expr("timestamp_millis(pt)")).withWatermark("pts", "1 second")
             .withColumn("pw", F.window("pts", win)))
        a = (auctions.withColumn("ats", F.expr("timestamp_millis(at)")).withWatermark("ats", "1 second")
             .withColumn("aw", F.window("ats", win)))
        return (p.join(a, F.expr("pid = seller AND pw = aw"))
                .select("pid", "name", F.expr("unix_millis(pw.start)").alias("start"), "aid"))
    raise ValueError(query)


SENTINEL_MS = 10 ** 9  # the sentinel events are this far past the input (Spark's watermark must pass it)
