"""Queryable windows, reduce accumulators and whole maps on RocksDB (issue 33, seed 004 §4.3.1).

One job, two keyed operators over the same events ``(key, ts_ms, value)``:

* ``totals`` — ``reduce(..., queryable=True)``: a key's running sum, state ``"acc"``;
* ``sums`` — ``window(Sliding(1 s, 0.5 s)).aggregate(..., queryable=True)``: per window
  ``(sum, count)``, state ``"windows"`` (panes are *map* state: on RocksDB a read-committed
  lookup reads them whole from the version's checkpoint).

Each event is a pure function of its split and position, and timestamps rise within each
split, so nothing is late. A read-committed answer at epoch ``e`` is compared with a
plain-Python oracle over exactly the events the sources had read at ``e``'s cut
(``list_source_offsets`` of ``chk-<e>``):

* ``acc`` equals the sum of each key's values;
* every window listed equals the oracle's ``(sum, count)`` of the key's events in
  ``[start, end)``; and every oracle window that cannot have fired at the cut (its
  ``end - 1 µs`` beyond the cut's highest timestamp minus the out-of-orderness bound) is
  listed. A read of live state (records after the cut), of another epoch, or a window made
  of the wrong panes (or one that expired, rebuilt from the panes later windows keep) fails
  the comparison.

A third operator, ``elements`` (``Tumbling(1 s).process(..., queryable=True)``), reads as
each window's elements: compared with the oracle's events of the window; its live
(read-uncommitted) answers, which have no cut, only with their key and window.
"""
from __future__ import annotations

import random
import threading
import time
import uuid

import pytest

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.errors import PipelineDefinitionError
from epochal.query import JobEnded, QueryError
from epochal.windows import Sliding, Tumbling
from epochal.windows.functions import Window

KEYS = 6
SPLITS = 2
STEP_MS = 2  # event time runs at twice the wall clock at 1000 events/s per split
BOUND_MS = 100  # max_out_of_orderness
SIZE_MS, SLIDE_MS = 1000, 500
READS = 3  # distinct epochs the reader must have read, with windows listed, before the job stops


def event(split: int, i: int) -> tuple[int, int, int]:
    """Event ``i`` of ``split``: (key, ts in ms, value)."""
    r = random.Random(split * 7919 + i)
    return r.randrange(KEYS), (i + 1) * STEP_MS, r.randrange(1, 10)


def events_from(split: int, offset: int):
    i = offset
    while True:
        yield event(split, i)
        i += 1


class SumCount(ep.windows.AggregateFunction):
    def create(self):
        return [0, 0]

    def add(self, acc, e):
        acc[0] += e[2]
        acc[1] += 1
        return acc

    def merge(self, a, b):  # modifies its first argument (allowed): the reader must copy
        a[0] += b[0]
        a[1] += b[1]
        return a

    def result(self, acc):
        return tuple(acc)


def flow_of(name: str, out: str) -> ep.Dataflow:
    """Endless input (1000 events/s per split): the test stops the job once its reader has
    read enough (a bounded input raced the reader: on a loaded machine it once read two
    epochs before the input ended)."""
    flow = ep.Dataflow(name, parallelism=2)
    source = ep.sources.GeneratorSource(events_from, num_splits=SPLITS, records_per_second=1000.0)
    keyed = (flow.source("events", source)
                 .with_watermarks("ts", timestamp=lambda e: e[1], timestamp_unit="ms",
                                  max_out_of_orderness=BOUND_MS / 1000)
                 .key_by(lambda e: e[0]))
    keyed.reduce("totals", lambda acc, e: acc + e[2], initial=0, queryable=True).sink("t", ep.sinks.FileSink(out + "-t"))
    keyed.window(Sliding(SIZE_MS / 1000, SLIDE_MS / 1000)).aggregate("sums", SumCount(), queryable=True) \
         .sink("w", ep.sinks.FileSink(out + "-w"))
    keyed.window(Tumbling(SIZE_MS / 1000)).process("elements", lambda k, w, es: [len(es)], queryable=True) \
         .sink("e", ep.sinks.FileSink(out + "-e"))
    return flow


class Reader(threading.Thread):
    def __init__(self, handle):
        super().__init__(daemon=True)
        self.handle = handle
        self.totals: list[tuple[int, dict]] = []
        self.windows: list[tuple[int, dict]] = []
        self.elements: list[tuple[int, dict]] = []
        self.live: list[dict] = []
        self.unknown: QueryError | None = None
        self.error: BaseException | None = None
        #: set once reads of READS distinct epochs were made, windows listed in some
        self.enough = threading.Event()

    def run(self):
        keys = list(range(KEYS))
        try:
            try:
                self.handle.query("elements", "panes", 0, timeout=60)
            except QueryError as exc:
                self.unknown = exc
            while True:
                r = self.handle.query("totals", "acc", keys, timeout=60)
                self.totals.append((r.epoch, r.values))
                w = self.handle.query("sums", "windows", keys, timeout=60)
                self.windows.append((w.epoch, w.values))
                e = self.handle.query("elements", "windows", keys, timeout=60)
                self.elements.append((e.epoch, e.values))
                self.live.append(self.handle.query("elements", "windows", keys, isolation="read-uncommitted",
                                                   timeout=60).values)
                if (len({epoch for epoch, _ in self.windows}) >= READS
                        and any(got for _, values in self.windows for got in values.values())):
                    self.enough.set()
        except JobEnded:
            pass
        except BaseException as exc:
            self.error = exc


def cut_events(storage: str, job: str, epoch: int) -> tuple[list, float]:
    """The events read at ``epoch``'s cut, and the lowest over splits of the highest
    timestamp read (ms; the watermark at the cut is below it minus the bound; every split
    is still reading: the input is endless)."""
    offsets: dict = {}
    for entry in ep.state.list_source_offsets(f"{storage}/{job}/chk-{epoch}"):
        offsets.update(entry["offsets"])
    assert set(offsets) == {str(s) for s in range(SPLITS)}, offsets
    events = [event(int(s), i) for s, n in offsets.items() for i in range(n)]
    high = min(event(int(s), n - 1)[1] if n else 0 for s, n in offsets.items())
    return events, high


def oracle_windows(events: list, key: int) -> dict:
    out: dict = {}
    for k, ts, v in events:
        if k != key:
            continue
        last = ts - ts % SLIDE_MS
        for start in range(last, ts - SIZE_MS, -SLIDE_MS):
            s, c = out.get(start, (0, 0))
            out[start] = (s + v, c + 1)
    return out


@pytest.mark.parametrize("backend", [pytest.param("heap", marks=pytest.mark.slow), "rocksdb"])
def test_read_committed_windows_and_reduce_equal_the_oracle_of_their_epoch(tmp_path, backend):
    job = f"winq-{uuid.uuid4().hex[:8]}"
    storage = f"file://{tmp_path}/ckpt"
    handle = flow_of(job, str(tmp_path / "out")).start(
        runtime="local", backend=backend, checkpoint=ep.CheckpointConfig(interval=0.1, storage=storage, retained=100_000))
    reader = Reader(handle)
    reader.start()
    read_enough = reader.enough.wait(90)
    handle.stop_with_savepoint(str(tmp_path / "stopped"), timeout=60)
    handle.wait(60)
    reader.join(60)
    assert reader.error is None, f"the reader failed: {reader.error!r}"
    assert read_enough, f"the reader read too little while the job ran: epochs {sorted(e for e, _ in reader.windows)}"
    assert reader.unknown is not None and "no queryable state 'panes' (queryable: ['windows'])" in str(reader.unknown)
    epochs = {e for e, _ in reader.totals} | {e for e, _ in reader.windows} | {e for e, _ in reader.elements}
    assert len(epochs) >= 3, f"too few epochs read: {sorted(epochs)}"
    cuts = {e: cut_events(storage, job, e) for e in epochs}
    for epoch, values in reader.totals:
        events, _ = cuts[epoch]
        expected = {k: sum(v for key, _, v in events if key == k) or None for k in range(KEYS)}
        assert values == expected, f"epoch {epoch}: reduce accumulators differ from the oracle"
    listed = 0
    for epoch, values in reader.windows:
        events, high = cuts[epoch]
        for key in range(KEYS):
            oracle = oracle_windows(events, key)
            got = values[key]
            assert list(got) == sorted(got), f"epoch {epoch}, key {key}: windows not in start order"
            for window, value in got.items():
                start = round(window.start * 1000)
                assert window.end - window.start == SIZE_MS / 1000
                assert oracle.get(start) == value, (
                    f"epoch {epoch}, key {key}: window {window} reads {value}, the oracle {oracle.get(start)}")
            open_now = {Window(s / 1000, (s + SIZE_MS) / 1000) for s in oracle if s + SIZE_MS > high - BOUND_MS}
            assert open_now <= set(got), (f"epoch {epoch}, key {key}: open windows missing: {open_now - set(got)} "
                                          f"(listed {got}, oracle {oracle}, highest timestamp of the cut {high} ms)")
            listed += len(got)
    assert listed > 0
    for epoch, values in reader.elements:  # a process window reads as its elements (sorted: splits interleave)
        events, high = cuts[epoch]
        for key in range(KEYS):
            for window, elements in values[key].items():
                assert window.end - window.start == SIZE_MS / 1000
                lo, hi = round(window.start * 1000), round(window.end * 1000)
                assert sorted(elements) == sorted(e for e in events if e[0] == key and lo <= e[1] < hi), (
                    f"epoch {epoch}, key {key}: elements of {window} differ from the oracle")
    assert any(windows for values in reader.live for windows in values.values()), "no live window read"
    for values in reader.live:  # live: no cut to compare with, but every element belongs to its key and window
        for key, windows in values.items():
            assert all(e[0] == key and w.start <= e[1] / 1000 < w.end for w, es in windows.items() for e in es)
    print(f"{backend}: {len(reader.totals)} reduce and {len(reader.windows)} window reads over {len(epochs)} epochs, "
          f"{listed} windows listed")


@pytest.mark.parametrize("make", [HeapStateBackend, RocksDBStateBackend])
def test_a_pinned_whole_map_never_sees_later_writes(make):
    backend = make(range(0, 8))
    try:
        backend.map_put("op/m", 1, "a", "x", 1)
        backend.map_put("op/m", 1, "a", "y", [2])
        backend.map_put("op/m", 2, "b", "x", 3)
        view = backend.pin_view(["op/m"], whole_maps=True)
        backend.map_put("op/m", 1, "a", "z", 9)
        inner = backend.map_get("op/m", 1, "a", "y")
        inner.append(3)
        backend.map_put("op/m", 1, "a", "y", inner)
        backend.map_delete("op/m", 2, "b", "x")
        backend.map_put("op/m", 3, "c", "x", 5)
        got = {}
        reader = threading.Thread(target=lambda: got.update(
            a=view.map_items("op/m", 1, "a"), b=view.map_items("op/m", 2, "b"), c=view.map_items("op/m", 3, "c")))
        reader.start()
        reader.join()
        assert got == {"a": {"x": 1, "y": [2]}, "b": {"x": 3}, "c": {}}
        assert dict(backend.map_items("op/m", 1, "a")) == {"x": 1, "y": [2, 3], "z": 9}
        view.release()
        view.release()  # idempotent
        if make is RocksDBStateBackend:
            assert backend.pending_snapshots == 0, "the view's checkpoint directory was not deleted"
    finally:
        backend.close()


def test_a_rocksdb_version_shares_the_barrier_checkpoint_and_outlives_its_snapshot_job():
    """Right after the barrier's snapshot (nothing written since) a whole-map view shares the
    snapshot's checkpoint directory instead of making one; the directory lives until both
    the snapshot job and the view let go. After a write, a view makes its own."""
    backend = RocksDBStateBackend(range(0, 8))
    try:
        backend.map_put("op/m", 1, "a", "x", 1)
        job = backend.snapshot(1)
        view = backend.pin_view(["op/m"], whole_maps=True)
        assert backend.pending_snapshots == 1 and view.checkpoint in backend._checkpoints  # shared, not a second one
        job.run()  # the upload, then the job releases the directory: the view still holds it
        backend.map_put("op/m", 1, "a", "y", 2)
        assert view.map_items("op/m", 1, "a") == {"x": 1}
        later = backend.pin_view(["op/m"], whole_maps=True)  # written since the barrier: its own checkpoint
        assert later.checkpoint != view.checkpoint and later.map_items("op/m", 1, "a") == {"x": 1, "y": 2}
        view.release()
        later.release()
        assert backend.pending_snapshots == 0
    finally:
        backend.close()


def test_queryable_options_are_checked_when_the_graph_is_built():
    flow = ep.Dataflow("q-bad")
    keyed = flow.source("s", ep.sources.CollectionSource([(1, 2, 3)])).key_by(lambda e: e[0])
    with pytest.raises(PipelineDefinitionError, match="reduce 'r2': queryable must be True or False"):
        keyed.reduce("r2", lambda a, b: a, queryable="acc")
    with pytest.raises(PipelineDefinitionError, match="window 'w': queryable must be True or False"):
        keyed.window(Tumbling(1, processing_time=True)).reduce("w", lambda a, b: a, queryable=1)


def test_a_client_asks_the_directory_again_when_a_task_is_unreachable():
    """A task that finished (end of input) or died leaves its route unreachable: the client
    must ask the directory again — here the job has ended, so ``JobEnded`` at once, not a
    timeout spent on the stale route."""
    import socket

    from epochal.query import QueryClient
    from epochal.query.protocol import query_key
    from epochal.runtime.driver.query_directory import QueryDirectory

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()
    answers = iter([{"generation": 0, "max_parallelism": 128, "expected": {"op": 1},
                     "operators": {"op": [("op#0", 0, 128, dead)]}}])
    directory = QueryDirectory(query_key("t"), "127.0.0.1", lambda: next(answers, "ended"))
    try:
        start = time.monotonic()
        with pytest.raises(JobEnded):
            QueryClient(directory.address, "t").query("op", "acc", 1, timeout=20)
        assert time.monotonic() - start < 10
    finally:
        directory.close()
