"""The campaign's topologies and sinks (issue 46; the histories are ``tests/campaign.py``).

Each topology is a dataflow and plain-Python oracles of its committed output:

* :attr:`Topology.oracle` — the exactly-once output of a whole run;
* :attr:`Topology.drained` — the output of a run stopped with a drained savepoint whose
  sources had read ``{split: offset}`` (every window of those events fired); ``None`` where
  a drain is refused (loops);
* :attr:`Topology.cut` — the output committed up to a savepoint with those source offsets,
  when the offsets alone decide it (``count``: a running count depends only on the lines
  read); ``None`` when they do not (``windows``: what fired also depends on the watermark).

A :class:`Target` is one sink and its independent reader (``read()`` → multiset of rows).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
from typing import Callable

import cloudpickle

import epochal as ep
import joindata
import pipelines
import campaign_columnar
import campaign_regions
import test_columnar_time
import test_event_time
from test_event_time import SumCount, event  # shipped by value: never the module object itself
from epochal.sinks import FileSink, LogSink, read_committed

cloudpickle.register_pickle_by_value(joindata)
cloudpickle.register_pickle_by_value(pipelines)
cloudpickle.register_pickle_by_value(test_event_time)
cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPLITS = 4


class Count(ep.KeyedProcessFunction):
    """A running count per word: ``(word, n)``."""

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, word, value):
        self.n.update(self.n.value() + 1)
        yield (word, self.n.value())


# ------------------------------------------------------------------------ count
def _count_flow(history, target, parallelism: int) -> ep.Dataflow:
    f = ep.Dataflow("campaign", parallelism=parallelism)
    source = ep.sources.GeneratorSource(pipelines.lines_from, num_splits=SPLITS, limit=history.n_lines // SPLITS,
                                        records_per_second=history.rate * history.speed)
    target.into(f.source("lines", source).flat_map("split", str.split).key_by(lambda w: w)
                .process("count", Count()))
    return f


def _count_oracle(history) -> collections.Counter:
    return collections.Counter(tuple(r) for r in pipelines.running_counts(history.n_lines, SPLITS))


def _count_cut(history, read: dict) -> collections.Counter:
    """``(w, k)`` for k = 1..count(w) over the lines below ``read`` (plain Python)."""
    words = collections.Counter(w for s, n in read.items() for i in range(n) for w in pipelines.line(s, i).split())
    return collections.Counter((w, k) for w, c in words.items() for k in range(1, c + 1))


# ---------------------------------------------------------------------- windows
#: events per split of the ``windows`` topology, and its rate (events/s per split): ≈ 5 s a run
WINDOW_EVENTS, WINDOW_RATE, WINDOW_SIZE = 1500, 300.0, 1.0


def _window_events(split: int, offset: int):
    return (event(split, i) for i in range(offset, WINDOW_EVENTS))


def _event_time(e) -> float:
    return e[1]


def _as_row(r) -> tuple:
    return (r.key, r.start, r.end, r.value[0], r.value[1])


def _windows_flow(history, target, parallelism: int) -> ep.Dataflow:
    """Event-time tumbling windows of out-of-order events (bounded disorder, so none late):
    ``(key, start, end, count, sum)`` per key and window."""
    from epochal.windows import Tumbling

    f = ep.Dataflow("campaign", parallelism=parallelism)
    splits, bound = test_event_time.SPLITS, test_event_time.BOUND
    source = ep.sources.GeneratorSource(_window_events, num_splits=splits, limit=WINDOW_EVENTS,
                                        records_per_second=WINDOW_RATE * history.speed)
    target.into(f.source("events", source, parallelism=splits)
                .with_watermarks("ts", timestamp=_event_time, max_out_of_orderness=bound)
                .key_by(lambda e: e[0]).window(Tumbling(WINDOW_SIZE)).aggregate("win", SumCount())
                .map("row", _as_row))
    return f


def _windows_of(events) -> collections.Counter:
    return collections.Counter((k, s, e, c, total) for k, s, e, (c, total)
                               in test_event_time.pane_oracle(WINDOW_SIZE, WINDOW_SIZE, events))


def _windows_oracle(history) -> collections.Counter:
    return _windows_of([event(s, i) for s in range(test_event_time.SPLITS) for i in range(WINDOW_EVENTS)])


def _windows_drained(history, read: dict) -> collections.Counter:
    """A drain ends event time: every window of the events read fires (tests/test_drain.py)."""
    return _windows_of([event(s, i) for s, n in read.items() for i in range(n)])


# -------------------------------------------------------------------------- join
#: the interval join's bounds (seconds, as tests/test_joins.py) and its rows' rate (rows/s): ≈ 5 s a run
JOIN_LOWER, JOIN_UPPER, JOIN_ROWS, JOIN_RATE = -0.3, 0.2, 3000, 600.0


def _join_flow(history, target, parallelism: int) -> ep.Dataflow:
    """An inner interval join of two sides of one out-of-order stream (tests/joindata.py):
    ``(left id, right id)`` per pair; the certainly-late rows go to the late output, not here."""
    f = ep.Dataflow("campaign", parallelism=parallelism)
    left, right = joindata.sides(f, JOIN_ROWS, JOIN_RATE * history.speed)
    joined = left.interval_join(right, JOIN_LOWER, JOIN_UPPER, how="inner").apply("join", joindata.ids)
    target.into(joined)
    return f


def _join_cut(history, read: dict) -> collections.Counter:
    """The pairs among the rows below the offset: an inner interval join emits a pair when
    its later row arrives, so the rows read decide the output (and a drain adds nothing)."""
    rows = joindata.all_rows(JOIN_ROWS)[:read.get(0, 0)]
    prefix = joindata._prefix_max(rows)
    on_time = [r for i, r in enumerate(rows) if joindata.category(i, rows, prefix) == "on time"]
    return joindata.interval_oracle([r for r in on_time if r[0] == "L"], [r for r in on_time if r[0] == "R"],
                                    JOIN_LOWER, JOIN_UPPER, "inner")


def _join_oracle(history) -> collections.Counter:
    return _join_cut(history, {0: JOIN_ROWS})


# -------------------------------------------------------------------------- loop
#: numbers through the Collatz loop (two splits) and their rate (numbers/s per split): ≈ 2.5 s a run
LOOP_NUMBERS, LOOP_RATE = 400, 80.0


def _loop_flow(history, target, parallelism: int) -> ep.Dataflow:
    """A loop with keyed state in its body (pipelines.visits_loop): one Collatz step per pass;
    ``(n, 1, steps, passes)`` per number, ``passes`` counted in keyed state (lost or doubled
    state shows in the output)."""
    f = ep.Dataflow("campaign", parallelism=parallelism)
    src = f.source("numbers", ep.sources.GeneratorSource(pipelines._numbers, num_splits=2, limit=LOOP_NUMBERS // 2,
                                                         records_per_second=LOOP_RATE * history.speed), parallelism=2)

    def body(s):
        stepped = s.key_by(lambda r: r[0]).process("visit", pipelines.CollatzVisits())
        return (stepped.filter("more", lambda r: r[1] != 1).key_by(lambda r: r[0]),
                stepped.filter("done", lambda r: r[1] == 1))

    target.into(src.map("init", lambda x: (x, x, 0, 0), parallelism=2).iterate("loop", body))
    return f


def _loop_oracle(history) -> collections.Counter:
    return collections.Counter(tuple(json.loads(r)) for r in pipelines.visits_golden(LOOP_NUMBERS).elements())


# --------------------------------------------------------------------- failover
#: records per split of the four forward-only pipelines, and their rate (records/s per split)
PIPELINE_RECORDS, PIPELINE_RATE = 600, 120.0


def _tagged(split: int, offset: int):
    return ((f"s{split}-{i}",) for i in range(offset, PIPELINE_RECORDS))


def _failover_flow(history, target, parallelism: int) -> ep.Dataflow:
    """Four forward-only pipelines (source subtask j → map → sink subtask j, no shuffle): each
    a failover region of its own, restarted alone (``RestartStrategy(failover="region")``);
    ``(f"s{split}-{i}",)`` per record. Always at parallelism 4: a pipeline per split."""
    f = ep.Dataflow("campaign", parallelism=SPLITS)
    source = ep.sources.GeneratorSource(_tagged, num_splits=SPLITS, limit=PIPELINE_RECORDS,
                                        records_per_second=PIPELINE_RATE * history.speed)
    target.into(f.source("gen", source).map("pass", _same))
    return f


def _same(r):
    return r


def _failover_cut(history, read: dict) -> collections.Counter:
    return collections.Counter((f"s{s}-{i}",) for s, n in read.items() for i in range(n))


@dataclasses.dataclass(frozen=True)
class Topology:
    flow: Callable
    oracle: Callable
    columns: str  # PostgreSQL columns of its rows
    source: str  # the source operator's name (its offsets are read from savepoints)
    splits: int
    limit: Callable  # history → records per split
    drained: Callable
    cut: Callable | None
    restart: dict = dataclasses.field(default_factory=dict)  # RestartStrategy options it needs
    #: progress is the committed output, not the input read: a loop reads its input at once
    #: and works on it for a long while after
    by_output: bool = False
    #: the source's checkpoints under the job's storage (a job of regions: its region's)
    checkpoints: str = "campaign"
    #: a topology's own model, ``(got, expected, truth, guarantees, loose, crossing) → (outcome,
    #: detail)``; None: :func:`campaign.check`'s
    check: Callable | None = None
    #: an autonomous channel: what a kill in each region, and a resume (``"resume"``), does
    #: to the records crossing it (docs/regions.md) — ``"at-least"`` or ``"at-most"``
    crossing: dict = dataclasses.field(default_factory=dict)
    #: actions never drawn for it → why
    excluded: dict = dataclasses.field(default_factory=dict)


TOPOLOGIES = {
    "count": Topology(_count_flow, _count_oracle, "word text NOT NULL, n bigint NOT NULL", "lines", SPLITS,
                      lambda h: h.n_lines // SPLITS, _count_cut, _count_cut),
    "windows": Topology(_windows_flow, _windows_oracle,
                        "k text NOT NULL, s double precision, e double precision, c bigint, total bigint",
                        "events", test_event_time.SPLITS, lambda h: WINDOW_EVENTS, _windows_drained, None),
    # a loop's output at a cut also depends on what circulates in it: no cut; a drain is refused for loops
    "loop": Topology(_loop_flow, _loop_oracle, "n bigint, c bigint, steps bigint, passes bigint", "numbers", 2,
                     lambda h: LOOP_NUMBERS // 2, None, None, by_output=True),
    "failover": Topology(_failover_flow, lambda h: _failover_cut(h, {s: PIPELINE_RECORDS for s in range(SPLITS)}),
                         "r text NOT NULL", "gen", SPLITS, lambda h: PIPELINE_RECORDS, _failover_cut, _failover_cut,
                         {"failover": "region"}),
    "join": Topology(_join_flow, _join_oracle, "l bigint, r bigint", "rows", 1, lambda h: JOIN_ROWS,
                     _join_cut, _join_cut),
    # what fired at a cut also depends on the watermark (as ``windows``): no cut
    "columnar": Topology(campaign_columnar.flow, campaign_columnar.oracle,
                         "k text NOT NULL, s double precision, e double precision, c bigint, total bigint",
                         "ev", test_columnar_time.SPLITS,
                         lambda h: test_columnar_time.PER_SPLIT // test_columnar_time.ROWS, campaign_columnar.drained,
                         None),
    # progress is main's own input (orders); what clicks a cut holds depends on the channel's
    # lanes, not on offsets: no cut (a keep-rollback is checked loose)
    "regions": Topology(campaign_regions.flow, campaign_regions.oracle, "k text NOT NULL, n bigint NOT NULL",
                        "orders", 2, lambda h: campaign_regions.RECORDS // 2, None, None,
                        checkpoints="campaign/regions/main/campaign", check=campaign_regions.check,
                        crossing={"main": "at-most", "side": "at-least", "resume": "at-least"},
                        excluded={"drain": "a drained cut's clicks depend on what the lanes held, not on the "
                                           "sources' offsets: the model cannot say them",
                                  "restore-checkpoint": "a job of regions restores from a savepoint or the "
                                                        "latest checkpoint of each region, not from one chosen "
                                                        "checkpoint"}),
}


def source_offsets(url: str, history) -> dict:
    """``{split: records read}`` of the savepoint or checkpoint at ``url`` (every split named)."""
    topology = TOPOLOGIES[history.topology]
    merged: dict = {}
    for row in ep.state.list_source_offsets(url, topology.source):
        merged.update(row["offsets"] or {})
    read = {int(s): int(n) for s, n in merged.items()}
    assert set(read) == set(range(topology.splits)), f"savepoint {url} names splits {sorted(read)}"
    return read


def everything(history) -> dict:
    topology = TOPOLOGIES[history.topology]
    return {s: topology.limit(history) for s in range(topology.splits)}


# ----------------------------------------------------------------------------- targets
class Target:
    """One sink and its independent reader: ``read()`` → multiset of rows."""

    def __init__(self, kind: str, workdir: str, services: dict, columns: str):
        self.kind, self.services = kind, services
        if kind == "file":
            self.path = os.path.join(workdir, "out")
        elif kind == "log":
            self.root = os.path.join(workdir, "log")
        elif kind == "postgres":
            self.pg = services["postgres"]
            self.table = self.pg.new_table(columns)
        elif kind == "kafka":
            self.broker = services["kafka"]
            self.topic = self.broker.create_topic(None, 2)
        elif kind == "delta":
            self.uri = os.path.join(workdir, "table")
        elif kind == "iceberg":
            self.catalog = {"type": "sql", "uri": f"sqlite:///{workdir}/catalog.db",
                            "warehouse": f"file://{workdir}/warehouse"}
        else:
            raise ValueError(kind)
        self.names, self.schema = _schema(columns)

    def into(self, stream):
        """The topology's last stream into this sink (tables get rows as dicts)."""
        if self.kind in ("delta", "iceberg"):
            stream = stream.map("as-dict", _AsDict(self.names))
        return stream.sink("out", self.sink())

    #: what a restore from an older savepoint does to the epochs the parent committed after
    #: it (docs/lifecycle.md): ``remove`` — the branch deletes them (one history); ``keep`` —
    #: they stay and the branch produces them again (the parent's output plus the re-emitted epochs)
    @property
    def rollback(self) -> str:
        return "remove" if self.kind == "file" else "keep"

    def sink(self):
        if self.kind == "file":
            return FileSink(self.path, rollback="remove")
        if self.kind == "log":
            return LogSink(self.root, "counts", partitions=2)
        if self.kind == "postgres":
            from epochal.sinks import PostgresSink

            return PostgresSink(self.services["postgres"].dsn, self.table)
        if self.kind == "delta":
            from epochal.sinks import DeltaSink

            return DeltaSink(self.uri, schema=self.schema)
        if self.kind == "iceberg":
            from epochal.sinks import IcebergSink

            return IcebergSink(self.catalog, "db.campaign", schema=self.schema)
        from epochal.sinks import KafkaSink

        return KafkaSink(self.broker.servers, self.topic, key=lambda r: str(r[0]), serializer=_json)

    def read(self) -> collections.Counter:
        if self.kind == "file":
            return collections.Counter(tuple(r) for r in read_committed(self.path))
        if self.kind == "log":
            from epochal.sources.log import read_committed_log

            return collections.Counter(tuple(r) for rs in read_committed_log(self.root, "counts").values() for r in rs)
        if self.kind == "postgres":
            return collections.Counter(tuple(r) for r in self.pg.execute(f"SELECT * FROM {self.table}"))
        if self.kind in ("delta", "iceberg"):
            import tables

            if self.kind == "delta":
                rows = tables.read_delta(self.uri) if os.path.exists(os.path.join(self.uri, "_delta_log")) else []
            else:
                rows = _read_iceberg(self.catalog)
            return collections.Counter(tuple(r[n] for n in self.names) for r in rows)
        return collections.Counter(tuple(json.loads(v)) for v in self.broker.values(self.topic))


def _json(record) -> bytes:
    return json.dumps(record).encode()


class _AsDict:
    """A row tuple as the table's dict (picklable: it travels to the tasks)."""

    def __init__(self, names):
        self.names = tuple(names)

    def __call__(self, row) -> dict:
        return dict(zip(self.names, row))


_TYPES = {"text": "string", "bigint": "int64", "double": "float64"}


def _schema(columns: str):
    """Column names and the pyarrow schema of a PostgreSQL column list (text, bigint, double)."""
    import pyarrow as pa

    names, fields = [], []
    for column in columns.split(","):
        name, kind = column.split()[:2]
        names.append(name)
        fields.append(pa.field(name, getattr(pa, _TYPES[kind])()))
    return names, pa.schema(fields)


def _read_iceberg(catalog: dict) -> list:
    """The Iceberg table's current snapshot, read with pyiceberg's own scan ([] before the first commit)."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    props = dict(catalog)
    try:
        table = load_catalog(props.pop("name", "default"), **props).load_table("db.campaign")
    except (NoSuchTableError, NoSuchNamespaceError):
        return []
    return table.scan().to_arrow().to_pylist()
