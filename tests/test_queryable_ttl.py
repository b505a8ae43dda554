"""Queryable state with a TTL (issue 33 with docs/ttl-broadcast.md): a lookup never returns
an entry expired as of the answered version's clock.

The system test keys records ``i`` (event time ``i`` s) by :func:`key_of` over ``K`` keys; a
keyed function keeps, per key, the index of its last record in a value state and in a map
state, both with an event-time TTL of ``TTL`` s — short enough beside the keys' gaps (``K``
records on average) that at every cut roughly half of the written keys have expired. Every
read-committed multi-key answer of epoch ``e`` must equal the plain-Python oracle: the last
record of each key among the records the epoch's checkpoint says the source had read, kept
only if ``i s + TTL > clock``, the event-time clock the operator recorded in the same
checkpoint (its watermark at the barrier, one number per key group). The test also asserts
that answers left out keys that had been written (expiry decided something) and kept others.
"""
from __future__ import annotations

import random
import threading
import uuid

import pytest

import epochal as ep
from epochal.backends.formats import decode_snapshot
from epochal.backends.keygroups import key_group_for
from epochal.errors import PipelineDefinitionError
from epochal.query import JobEnded
from epochal.query.readers import MapReader, ValueReader
from epochal.state.reader import _keyed_operator, _portable
from epochal.ttl.queries import TtlMapReader, TtlValueReader, ttl_reader
from epochal.ttl.registry import META, META_KEY

K = 40
TTL = 30  # seconds of event time = records
US = 1_000_000


def key_of(i: int) -> int:
    return random.Random(i * 7919).randrange(K)


def events(split: int, offset: int):
    i = offset
    while True:
        yield (key_of(i), i)
        i += 1


class Last(ep.KeyedProcessFunction):
    def open(self, ctx):
        ttl = ep.StateTtl(TTL, time="event")
        self.last = ctx.value_state("last", queryable=True, ttl=ttl)
        self.seen = ctx.map_state("seen", queryable=True, ttl=ttl)

    def process(self, key, event):
        self.last.update(event[1])
        self.seen.put("i", event[1])


def flow_of(name: str, out: str, n: int | None, rate: float) -> ep.Dataflow:
    """``n`` records (``None``: endless, the test stops the job) at ``rate`` per second."""
    flow = ep.Dataflow(name, parallelism=2)
    (flow.source("events", ep.sources.GeneratorSource(events, num_splits=1, limit=n, records_per_second=rate),
                 parallelism=1)
         .with_watermarks("wm", timestamp=lambda e: e[1], parallelism=1)
         .key_by(lambda e: e[0])
         .process("last", Last())
         .sink("out", ep.sinks.FileSink(out)))
    return flow


def cut(url: str) -> tuple[int, dict[int, int]]:
    """Records the source had read at checkpoint ``url`` and the TTL clock (µs) the ``last``
    operator recorded there, per key group."""
    offsets = {}
    for entry in ep.state.list_source_offsets(url):
        offsets.update(entry["offsets"])
    ckpt = ep.state.open_checkpoint(url)
    clocks = {}
    for task in _keyed_operator(ckpt, "last"):
        for kg, (values, _maps) in decode_snapshot(_portable(ckpt.task_state(task)["keyed"], ckpt)):
            clocks[kg] = values[f"last/{META}"][META_KEY]["clock"]
    return int(offsets["0"]), clocks


def oracle(n: int, clocks: dict[int, int], max_parallelism: int) -> dict:
    """Plain Python: each key's last record among the first ``n``, if live at its key group's clock."""
    last = {}
    for i in range(n):
        last[key_of(i)] = i
    return {k: (i if i * US + TTL * US > clocks[key_group_for(k, max_parallelism)] else None)
            for k, i in last.items()}, set(last)


# ---------------------------------------------------------------------- pure parts
def test_ttl_readers_leave_out_entries_expired_at_the_versions_clock():
    class Source:
        def get(self, state, kg, key, default=None):
            return {"a": (1, 100), "b": (2, 160)}.get(key, default)

        def map_items(self, state, kg, key):
            return {"x": (1, 100), "y": (2, 160)}

    now = [0]
    value = TtlValueReader("op/v", "dflt", lambda: now[0], ttl=50)
    now[0] = 150
    mark = value.mark()  # the clock at the pin: later moves of the clock change nothing
    now[0] = 10_000
    assert [value.read(Source(), 0, k, mark) for k in "abc"] == ["dflt", 2, "dflt"]
    assert value.read(Source(), 0, "b", 210) == "dflt"  # expired exactly at stamp + ttl
    assert TtlMapReader("op/m", lambda: 0, ttl=50).read(Source(), 0, "k", 150) == {"y": 2}

    class Registry:
        def clock(self, config):
            return lambda: 7

    wrapped = ttl_reader(ValueReader("op/v", 3), Registry(), ep.StateTtl(2, time="event"))
    assert isinstance(wrapped, TtlValueReader) and wrapped.default == 3 and wrapped.mark() == 7
    assert isinstance(ttl_reader(MapReader("op/m"), Registry(), ep.StateTtl(2)), TtlMapReader)


def test_a_queryable_reduce_with_a_ttl_is_built():
    flow = ep.Dataflow("q-ttl-reduce")
    keyed = flow.source("s", ep.sources.CollectionSource([(1, 2)])).key_by(lambda e: e[0])
    keyed.reduce("r", lambda a, b: a, queryable=True, ttl=5)  # refused before: now served
    with pytest.raises(PipelineDefinitionError, match="reduce 'r2': queryable must be True or False"):
        keyed.reduce("r2", lambda a, b: a, queryable="acc", ttl=5)


# ---------------------------------------------------------------------- system test
@pytest.mark.parametrize("backend", ["heap", pytest.param("rocksdb", marks=pytest.mark.slow)])
def test_read_committed_never_returns_values_expired_at_the_epoch(tmp_path, backend):
    job = f"qttl-{uuid.uuid4().hex[:8]}"
    storage = f"file://{tmp_path}/ckpt"
    flow = flow_of(job, str(tmp_path / "out"), n=None, rate=1000.0)  # stopped once the reader read enough
    handle = flow.start(
        runtime="local", backend=backend, checkpoint=ep.CheckpointConfig(interval=0.05, storage=storage,
                                                                        retained=100_000))
    answers: list = []
    uncommitted: list = []
    errors: list = []
    enough = threading.Event()

    def read():
        try:
            while True:
                r = handle.query("last", "last", list(range(K)), timeout=60)
                m = handle.query("last", "seen", list(range(K)), timeout=60)
                answers.append((r.epoch, r.values, m.epoch, m.values))
                if len({a[0] for a in answers} | {a[2] for a in answers}) >= 4:
                    enough.set()
                uncommitted.append(handle.query("last", "last", list(range(K)), isolation="read-uncommitted",
                                                timeout=60).values)
        except JobEnded:
            pass
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    read_enough = enough.wait(90)
    handle.stop_with_savepoint(str(tmp_path / "stopped"), timeout=60)
    handle.wait(60)
    reader.join(60)
    assert not errors, f"the reader failed: {errors[0]!r}"
    assert read_enough, f"the reader read too little while the job ran: {len(answers)} answers"
    epochs = sorted({a[0] for a in answers} | {a[2] for a in answers})
    assert len(epochs) >= 3, f"too few epochs read: {epochs}"
    expected = {e: oracle(*cut(f"{storage}/{job}/chk-{e}"), flow.max_parallelism) for e in epochs}
    expired = live = 0
    for epoch, values, map_epoch, maps in answers:
        want, written = expected[epoch]
        assert values == {k: want.get(k) for k in range(K)}, f"epoch {epoch}: value state differs from the oracle"
        want_maps, _ = expected[map_epoch]
        assert maps == {k: ({} if want_maps.get(k) is None else {"i": want_maps[k]}) for k in range(K)}, (
            f"epoch {map_epoch}: map state differs from the oracle")
        expired += sum(1 for k in written if want[k] is None)
        live += sum(1 for k in written if want[k] is not None)
    print(f"{len(answers)} read-committed answers over {len(epochs)} epochs: {expired} expired and {live} live "
          "written keys")
    assert expired and live, "expiry decided nothing: the test cannot tell a reader that ignores the ttl"
    assert all(v is None or isinstance(v, int) for u in uncommitted for v in u.values()), "stamps leaked"
