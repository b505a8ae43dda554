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
* q4 average closing price per category: an auction's closing price is its highest bid
  between its start and its expiry (none: no price); per category and 10 s tumbling window
  of the closing (expiry) time ``(category, window start, auctions, total)`` — the average
  is ``total / auctions`` (integers, so every engine's output compares exactly; Nexmark's
  q4 keeps a running average per category instead of windows);
* q5 hot items: per sliding window of 10 s every 2 s, the auction with the most bids,
  ``(window start, auction, bids)`` — ties go to the highest auction id (Nexmark returns
  every tied auction; one row per window is what Spark's ``max(struct(count, auction))`` gives);
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
    if query == "q4":
        return _q4_oracle(auctions, bids)
    if query == "q5":
        counts = collections.Counter()
        for b in bids:
            last = b[4] - b[4] % Q5_SLIDE_MS
            for start in range(last, b[4] - Q5_SIZE_MS, -Q5_SLIDE_MS):
                counts[(start, b[1])] += 1
        top: dict = {}
        for (start, auction), n in counts.items():
            top[start] = max(top.get(start, (0, 0)), (n, auction))
        return collections.Counter((start, auction, n) for start, (n, auction) in top.items())
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


Q5_SIZE_MS, Q5_SLIDE_MS = 10_000, 2_000
Q4_MAX_OPEN_MS = 30_000  # an auction expires at most this long after it starts (the generator's)


def _q4_oracle(auctions: list, bids: list) -> collections.Counter:
    by_auction = collections.defaultdict(list)
    for b in bids:
        by_auction[b[1]].append(b)
    totals: dict = {}
    for a in auctions:
        prices = [b[3] for b in by_auction[a[1]] if a[6] <= b[4] <= a[5]]
        if prices:
            key = (a[3], a[5] - a[5] % WINDOW_MS)
            n, total = totals.get(key, (0, 0))
            totals[key] = (n + 1, total + max(prices))
    return collections.Counter((c, w, n, total) for (c, w), (n, total) in totals.items())


# ------------------------------------------------------------------------- epochal
def q4_function():
    import epochal as ep

    class Q4(ep.KeyedCoProcessFunction):
        """Auctions (input 1) and bids by auction (input 2): the highest bid between the
        auction's start and expiry; at the expiry (an event-time timer) the closing price
        comes out, stamped with the expiry time. A bid before its auction waits until the
        watermark passes its time (by then its auction, which starts no later, arrived)."""

        stamps_output = True

        def open(self, ctx):
            self.ctx = ctx
            self.auction = ctx.value_state("auction")  # (category, expires, start)
            self.best = ctx.value_state("best")
            self.pending = ctx.value_state("pending")

        def process1(self, aid, a):
            self.auction.update((a[3], a[5], a[6]))
            waiting = self.pending.value()
            if waiting:
                prices = [b[3] for b in waiting if a[6] <= b[4] <= a[5]]
                if prices:
                    self.best.update(max(prices))
                self.pending.clear()
            self.ctx.timers.register_event_time(a[5] / 1000)
            return None

        def process2(self, aid, b):
            a = self.auction.value()
            if a is None:
                self.pending.update((self.pending.value() or []) + [b])
                self.ctx.timers.register_event_time(b[4] / 1000)
            elif a[2] <= b[4] <= a[1]:
                best = self.best.value()
                if best is None or b[3] > best:
                    self.best.update(b[3])
            return None

        def on_timer(self, aid, timestamp, domain):
            now = round(timestamp * 1000)
            waiting = self.pending.value()
            if waiting:
                left = [b for b in waiting if b[4] > now]
                if left:
                    self.pending.update(left)
                else:
                    self.pending.clear()
            a = self.auction.value()
            if a is None or now < a[1]:
                return None
            best = self.best.value()
            self.auction.clear()
            self.best.clear()
            return [(a[1] * 1000, (a[0], 1, best))] if best is not None else None

    return Q4()


def _q5_count(a, b):
    return (a[0], a[1] + b[1])


def _q5_top(a, b):
    return a if (a[2], a[1]) >= (b[2], b[1]) else b


def _q4_sum(a, b):
    return (a[0], a[1] + b[1], a[2] + b[2])


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
    from epochal.windows import Sliding, Tumbling

    flow = ep.Dataflow(f"nexmark-{query}", parallelism=parallelism)
    events = flow.source("events", ep.sources.DirectorySource(indir, pattern="*.jsonl", format="jsonl"))
    if query in ("q4", "q5", "q7", "q8"):
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
    elif query == "q4":
        auctions = events.filter("auctions", lambda e: e[0] == 1).key_by(lambda a: a[1])
        bids = events.filter("bids", lambda e: e[0] == 2).key_by(lambda b: b[1])
        result = (auctions.connect(bids).process("q4-closing", q4_function())
                  .key_by(lambda c: c[0]).window(Tumbling(WINDOW_MS / 1000)).reduce("q4", _q4_sum)
                  .map("q4-row", lambda w: (w.key, round(w.start * 1000), w.value[1], w.value[2])))
    elif query == "q5":
        result = (events.filter("bids", lambda e: e[0] == 2).map("q5-one", lambda b: (b[1], 1))
                  .key_by(lambda b: b[0]).window(Sliding(Q5_SIZE_MS / 1000, Q5_SLIDE_MS / 1000))
                  .reduce("q5-counts", _q5_count)
                  .map("q5-count", lambda w: (round(w.start * 1000), w.key, w.value[1]))
                  .key_by(lambda c: c[0]).window(Tumbling(Q5_SLIDE_MS / 1000)).reduce("q5", _q5_top)
                  .map("q5-row", lambda w: w.value))
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
#: the queries epochal runs on Arrow batches too: vectorized filters and projections (q1,
#: q2), joins (q3: an interval join; q8: a window join; q4: an interval join, then windows),
#: window aggregates (q4, q5, q7)
COLUMNAR = ("q1", "q2", "q3", "q4", "q5", "q7", "q8")
DAY = "86400s"
#: the columns each columnar query reads from the Parquet files (the pruning Spark's scan does)
COLUMNS = {"q1": ("kind", "auction", "bidder", "price", "t"), "q2": ("kind", "auction", "price"),
           "q3": ("kind", "id", "name", "city", "state", "seller", "category", "t"),
           "q4": ("kind", "id", "category", "expires", "auction", "price", "t"), "q5": ("kind", "auction", "t"),
           "q7": ("kind", "price", "t"), "q8": ("kind", "id", "name", "seller", "t")}


def _q2_mask(batch):
    import pyarrow.compute as pc

    auction = batch["auction"]
    rest = pc.subtract(auction, pc.multiply(pc.divide(auction, 123), 123))  # integer division: auction % 123
    return pc.and_(pc.equal(batch["kind"], 2), pc.equal(rest, 0))


def _millis(column: str):
    """``fn(batch)``: a ``timestamp[us]`` column as epoch milliseconds (int64)."""
    def millis(batch):
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.divide(batch[column].cast(pa.int64()), 1000)
    return millis


def _q5_row(batch):
    """q5's output row: the window's start and its top auction (the ``arg_max`` struct)."""
    import pyarrow as pa

    top = batch["top"]
    return pa.record_batch({"start": batch["w"], "auction": top.field("auction"), "n": top.field("n")})


class _Kind:
    """``fn(batch)``: the mask of the rows of one event kind (and, with ``states``, of persons
    in those states) — an Arrow kernel per column, where a ``pyarrow.compute`` expression
    would run an Acero plan per batch (twice the CPU on 2 cores, more under load)."""

    def __init__(self, kind: int, states: tuple[str, ...] = (), category: int | None = None,
                 or_kind: int | None = None):
        self.kind, self.states, self.category, self.or_kind = kind, states, category, or_kind

    def __call__(self, batch):
        import pyarrow as pa
        import pyarrow.compute as pc

        mask = pc.equal(batch["kind"], self.kind)
        if self.or_kind is not None:
            mask = pc.or_(mask, pc.equal(batch["kind"], self.or_kind))
        if self.states:
            mask = pc.and_(mask, pc.is_in(batch["state"], value_set=pa.array(self.states)))
        if self.category is not None:
            mask = pc.and_(mask, pc.equal(batch["category"], self.category))
        return mask


def _q3_rows(batch):
    """q3's persons (in OR, ID or CA) and auctions (of category 10)."""
    import pyarrow.compute as pc

    return pc.or_kleene(_Kind(0, states=("OR", "ID", "CA"))(batch), _Kind(1, category=10)(batch))


def _q1_euros(batch):
    import pyarrow.compute as pc

    return pc.divide(pc.multiply(batch["price"], 908), 1000)


#: rows per batch read from the Parquet files (the source's default is 64k): fewer calls per
#: event into every kernel and the sink
BATCH_ROWS = 1 << 18


def epochal_columnar_flow(query: str, parquet_dir: str, out: str, parallelism: int = 2):
    """``query`` on Arrow batches read from the same Parquet files Spark reads (without the
    sentinel file), written as Parquet by the FileSink."""
    import pyarrow.compute as pc

    import epochal as ep
    from epochal.columnar import arg_max, count, max as amax, sum as asum
    from epochal.columnar.sources import ArrowFileSource
    from epochal.windows import Sliding, Tumbling

    flow = ep.Dataflow(f"nexmark-{query}-columnar", parallelism=parallelism)
    # q4 re-derives event time from the expiry after its join, with a bound of the longest
    # auction: a source at parallelism 1 reads the files in time order, so the join's output
    # is that far out of order at most (two source subtasks reading files 125 s of event
    # time apart, at 1M events, would make it more; its late rows are counted and fail the run)
    def read(name: str, columns: tuple[str, ...], timed: bool):
        source = ArrowFileSource(parquet_dir, pattern="part-0*.parquet", format="parquet", columns=columns,
                                 batch_rows=BATCH_ROWS)
        stream = flow.source(name, source, parallelism=1 if query == "q4" else None)
        if timed:
            stream = stream.with_watermarks(f"{name}-time", timestamp="t", timestamp_unit="ms",
                                            max_out_of_orderness="1s")
        return stream

    events = read("events", COLUMNS[query], query in ("q3", "q4", "q5", "q7", "q8"))
    window = Tumbling(WINDOW_MS / 1000)
    if query == "q1":
        result = (events.filter("bids", _Kind(2)).with_column("euros", "price", _q1_euros)
                  .select("q1", "auction", "bidder", "price", "t"))
    elif query == "q2":
        result = events.filter("q2-filter", _q2_mask).select("q2", "auction", "price")
    elif query == "q3":  # an auction with its seller, who joined before it (the generator's sellers are persons so far)
        # the files are read once; the filter chained into the source keeps q3's persons and
        # auctions (8% of the events), and only they go on to each side's task
        rows = events.filter("q3-rows", _q3_rows)
        persons = rows.filter("persons", _Kind(0)).select("person-columns", "id", "name", "city", "state", "t")
        auctions = rows.filter("auctions", _Kind(1)).select("auction-columns", "id", "seller", "t")
        result = (auctions.key_by("seller").interval_join(persons.key_by("id"), "-" + DAY, 0).apply("q3")
                  .select("q3-row", "name", "city", "state", "id"))
    elif query == "q4":
        auctions = (events.filter("auctions", pc.field("kind") == 1)
                    .select("auction-columns", "id", "category", "expires", "t"))
        bids = events.filter("bids", pc.field("kind") == 2).select("bid-columns", "auction", "price", "t")
        closing = (auctions.key_by("id").interval_join(bids.key_by("auction"), 0, f"{Q4_MAX_OPEN_MS}ms").apply("q4-join")
                   .filter("q4-open", pc.field("t_right") <= pc.field("expires"))
                   .with_watermarks("q4-expiry", timestamp="expires", timestamp_unit="ms",
                                    max_out_of_orderness=f"{Q4_MAX_OPEN_MS + 5000}ms")
                   .key_by("id").window(window).aggregate("q4-closing", price=amax("price"),
                                                          category=amax("category")))
        closing.late().sink("late", ep.sinks.FileSink(out + "-late", format="parquet"))
        result = (closing.with_watermarks("q4-closed", timestamp="window_start")
                  .key_by("category").window(window).aggregate("q4", n=count(), total=asum("price"))
                  .with_column("q4-start", "start", _millis("window_start"))
                  .select("q4-row", "category", "start", "n", "total"))
    elif query == "q5":
        counts = (events.filter("bids", pc.field("kind") == 2).select("bid-columns", "auction", "t")
                  .key_by("auction").window(Sliding(Q5_SIZE_MS / 1000, Q5_SLIDE_MS / 1000))
                  .aggregate("q5-counts", n=count())
                  .with_column("q5-window", "w", _millis("window_start"))
                  .select("q5-columns", "w", "auction", "n", "window_end"))
        # per window the auction with the most bids, ties to the highest auction id: the
        # largest (n, auction), as Spark's max(struct(count, auction))
        top = arg_max(("n", "auction"), ("auction", "n"))
        result = (counts.with_watermarks("q5-time", timestamp="window_end").key_by("w")
                  .window(Tumbling(Q5_SLIDE_MS / 1000)).aggregate("q5", top=top)
                  .map_batches("q5-row", _q5_row))
    elif query == "q7":
        # local=True: each batch's highest price per window, before the shuffle (Spark's partial aggregate)
        result = (events.filter("bids", _Kind(2))
                  .key_by("kind").window(window).aggregate("q7", price=amax("price"), local=True)
                  .with_column("q7-start", "start", _millis("window_start")).select("q7-row", "start", "price"))
    elif query == "q8":
        rows = events.filter("q8-rows", _Kind(0, or_kind=1))  # chained into the source: 8% of the events go on
        persons = rows.filter("persons", _Kind(0)).select("person-columns", "id", "name", "t")
        auctions = rows.filter("auctions", _Kind(1)).select("auction-columns", "id", "seller", "t")
        result = (persons.key_by("id").window_join(auctions.key_by("seller"), window).apply("q8")
                  .with_column("q8-start", "start", _millis("window_start"))
                  .select("q8-row", "id", "name", "start", "id_right"))
    else:
        raise ValueError(f"{query} has no columnar version")
    # no dictionary pages: the output columns are mostly distinct values (ids, prices, times),
    # where dictionary encoding costs pyarrow 2.4x the CPU of plain pages (q1 at 1M rows); no
    # compression on the local disk (Spark's JSON files are not compressed either): q1 at 16M
    # events took 2.57-2.64 CPU-s against 2.92-4.0 with snappy
    result.sink("out", ep.sinks.FileSink(out, format="parquet", parquet_options={"use_dictionary": False, "compression": "none"}))
    return flow


# ------------------------------------------------------------------------- Spark SS
SPARK_SCHEMA = ("kind INT, id LONG, name STRING, city STRING, state STRING, seller LONG, category INT, "
                "reserve LONG, expires LONG, auction LONG, bidder LONG, price LONG, t LONG")


def spark_row(e: tuple) -> dict:
    if e[0] == 0:
        return {"kind": 0, "id": e[1], "name": e[2], "city": e[3], "state": e[4], "t": e[5]}
    if e[0] == 1:
        return {"kind": 1, "id": e[1], "seller": e[2], "category": e[3], "reserve": e[4], "expires": e[5], "t": e[6]}
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
    if query == "q4":  # the auctions' event time is their expiry: the closing windows need it watermarked
        a = (events.where("kind = 1").select(F.col("id").alias("aid"), "category", F.col("t").alias("at"),
                                             F.expr("timestamp_millis(expires)").alias("ets"))
             .withWatermark("ets", f"{Q4_MAX_OPEN_MS // 1000 + 1} seconds"))
        b = (bids.select("auction", "price", F.col("t").alias("bt"), ts.alias("bts"))
             .withWatermark("bts", "1 second"))
        closing = (a.join(b, F.expr(f"aid = auction AND bt >= at AND bts <= ets AND "
                                    f"bts >= ets - interval {Q4_MAX_OPEN_MS // 1000} seconds"))
                   .groupBy(F.window("ets", f"{WINDOW_MS // 1000} seconds"), "aid", "category")
                   .agg(F.max("price").alias("price")))
        return (closing.groupBy(F.window(F.window_time("window"), f"{WINDOW_MS // 1000} seconds").alias("w"),
                                "category")
                .agg(F.count("*").alias("n"), F.sum("price").alias("total"))
                .select("category", F.expr("unix_millis(w.start)").alias("start"), "n", "total"))
    if query == "q5":
        counts = (bids.withColumn("ts", ts).withWatermark("ts", "1 second")
                  .groupBy(F.window("ts", f"{Q5_SIZE_MS // 1000} seconds", f"{Q5_SLIDE_MS // 1000} seconds"),
                           "auction").count())
        return (counts.groupBy(F.window(F.window_time("window"), f"{Q5_SLIDE_MS // 1000} seconds").alias("w"))
                .agg(F.max(F.struct("count", "auction")).alias("top"))
                .select(F.expr(f"unix_millis(w.end) - {Q5_SIZE_MS}").alias("start"), "top.auction", "top.count"))
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
