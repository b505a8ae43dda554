"""``window(..., ttl=StateTtl(d))`` — a **processing-time** ttl — on Arrow batches
(epochal/columnar/windows.py, "Processing-time TTL"): the record path's rule (a key's
pending windows go once no on-time row of it arrived for ``ttl`` of wall clock; a window
fires only while its key is live) vectorized. The operator (built by the real builder) is
driven with a fake wall clock against a plain-Python model of that rule — tumbling and
sliding windows, both backends, through a snapshot restored into a fresh operator; after
every step it stores no expired key. A restore that changes the ttl's clock is refused."""
from __future__ import annotations

import collections
import random

import cloudpickle
import pytest

import epochal as ep
from epochal.errors import ConfigError

import test_columnar_window_ttl
from test_columnar_window_ttl import _backend, _batch, _op, _spec, restorer, stored_keys

cloudpickle.register_pickle_by_value(test_columnar_window_ttl)  # the job's source lives there

SIZE, SLIDE = 20_000, 10_000  # µs of event time
WALL_TTL = 10_000  # µs of (fake) wall clock
T0 = 10 ** 15  # µs


@pytest.fixture
def wall(monkeypatch):
    now = {"us": T0}
    monkeypatch.setattr("epochal.columnar.windows.now_micros", lambda: now["us"])
    return now


def _script(seed: int) -> list:
    """``(wall µs, step)``: batches of ``(key, v, ts)`` rows (disorder; half the keys fall
    silent for a while), watermarks, barriers and processing-time ticks."""
    rng = random.Random(seed)
    out, t, now = [], 0, T0
    for i in range(160):
        now += rng.randrange(0, 4000)
        rows = []
        for _ in range(rng.randrange(1, 5)):
            t += rng.randrange(0, 1500)
            keys = ["a", "b", "c"] if (i // 25) % 2 else ["a", "b", "c", "d", "e", "f"]
            rows.append((rng.choice(keys), rng.randrange(10), max(0, t - rng.randrange(0, 6000))))
        out.append((now, ("rows", rows)))
        r = rng.random()
        if r < 0.15:
            out.append((now + rng.randrange(0, 3000), ("barrier",)))
        elif r < 0.3:
            out.append((now + rng.randrange(0, 3000), ("tick",)))
        if rng.random() < 0.4:
            out.append((now + rng.randrange(0, 3000), ("wm", t - 6000)))
        now = out[-1][0]
    out.append((now, ("wm", t + 10 * SIZE)))
    return out


def model(script: list, slide: int, ttl: int | None, live: list) -> collections.Counter:
    """The record path's definition, in plain Python: at every step, first every key whose
    newest on-time row arrived ``ttl`` or more of wall clock ago loses its pending rows;
    then a row is late when its last window's end - 1 is at or behind the watermark, else
    it joins its windows and stamps its key with the wall clock; at watermark ``w`` every
    window with previous < end - 1 <= w fires. Emits ``(key, start, n, sum)``; appends to
    ``live`` after each step the keys holding rows."""
    rows: dict = collections.defaultdict(list)
    stamp: dict = {}
    out, wm = collections.Counter(), -(1 << 62)

    def starts(ts):
        last = ts - ts % slide
        return [last - j * slide for j in range(SIZE // slide)]

    for now, step in script:
        for k in [k for k in rows if ttl is not None and stamp[k] + ttl <= now]:
            del rows[k], stamp[k]
        if step[0] == "rows":
            for k, v, ts in step[1]:
                if starts(ts)[0] + SIZE - 1 > wm:
                    rows[k].append((ts, v))
                    stamp[k] = now
        elif step[0] == "wm" and step[1] > wm:
            w = step[1]
            for k in list(rows):
                windows: dict = collections.defaultdict(lambda: [0, 0])
                for ts, v in rows[k]:
                    for s in starts(ts):
                        if wm < s + SIZE - 1 <= w:
                            windows[s][0] += 1
                            windows[s][1] += v
                out.update((k, s, n, total) for s, (n, total) in windows.items())
                rows[k] = [(ts, v) for ts, v in rows[k] if starts(ts)[0] + SIZE - 1 > w]
            wm = w
        live.append({k for k in rows if rows[k]})
    return out


def run(op, script: list, wall: dict, live: list, restore) -> collections.Counter:
    """Drive ``op`` at the script's wall clock; after every step the operator stores no
    key the model had dropped; ``restore(op, wm)`` at the middle returns a restored one."""
    out, wm = collections.Counter(), None
    for i, (now, step) in enumerate(script):
        wall["us"] = now
        if step[0] == "rows":
            op.process_batch([_batch(step[1])])
        elif step[0] == "barrier":
            op.prepare_snapshot_pre_barrier(i)
        elif step[0] == "tick":
            due = op.next_processing_time()
            if due is not None and due <= now:
                op.on_processing_time(now)
        else:
            wm = step[1]
            for b in op.on_watermark(wm):
                assert b.schema.names == ["k", "window_start", "window_end", "n", "s"]  # no hidden column
                d = b.to_pydict()
                out.update((k, round(s.timestamp() * 1e6), n, t) for k, s, n, t in zip(d["k"], d["window_start"],
                                                                                        d["n"], d["s"]))
        assert stored_keys(op) <= live[i], f"step {i} ({step[0]}): expired keys kept"
        if i == len(script) // 2 and wm is not None:
            op.prepare_snapshot_pre_barrier(i)
            op = restore(op, wm)
    return out


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
@pytest.mark.parametrize("slide", [SIZE, SLIDE])
def test_processing_time_ttl_matches_the_model_through_a_restore(wall, kind, slide):
    script, live = _script(11), []
    want = model(script, slide, WALL_TTL, live)
    assert want != model(script, slide, None, [])  # the ttl really drops windows here
    assert sum(want.values()) > 40
    assigner = ep.windows.Tumbling(SIZE / 1e6) if slide == SIZE else ep.windows.Sliding(SIZE / 1e6, slide / 1e6)
    spec = _spec(assigner, ttl=ep.StateTtl(WALL_TTL / 1e6))
    backends, restore = restorer(kind, spec)
    try:
        assert run(_op(backends[0], spec), script, wall, live, restore) == want
    finally:
        for b in backends:
            b.close()


def a_then_b(op, wall):
    """``op`` after a's and b's rows at T0 and b's again 6 ms later, merged at a barrier."""
    op.process_batch([_batch([("a", 1, 10), ("b", 2, 20)])])
    wall["us"] += 6000
    op.process_batch([_batch([("b", 3, 30)])])
    op.prepare_snapshot_pre_barrier(1)
    return op


def test_a_silent_key_expires_at_a_processing_time_timer(wall):
    spec = _spec(ep.windows.Tumbling(SIZE / 1e6), ttl=ep.StateTtl(WALL_TTL / 1e6))
    b = _backend("heap")
    try:
        op = a_then_b(_op(b, spec), wall)
        assert stored_keys(op) == {"a", "b"}
        assert op.next_processing_time() == T0 + WALL_TTL  # a's deadline
        wall["us"] = T0 + WALL_TTL
        op.on_processing_time(wall["us"])
        assert stored_keys(op) == {"b"}  # a went though no batch, watermark or barrier came
        assert op.next_processing_time() == T0 + 6000 + WALL_TTL
        wall["us"] += 1000
        out = op.on_watermark(SIZE)  # b's window fires: b is live
        assert [(r["k"], r["n"], r["s"]) for batch in out for r in batch.to_pylist()] == [("b", 2, 5)]
    finally:
        b.close()


def test_restoring_with_the_ttl_clock_changed_is_refused(wall):
    proc = _spec(ep.windows.Tumbling(SIZE / 1e6), ttl=ep.StateTtl(WALL_TTL / 1e6))
    event = _spec(ep.windows.Tumbling(SIZE / 1e6))
    for old, new, change in ((proc, event, "checkpoint: processing time, now: event time"),
                             (event, proc, "checkpoint: event time, now: processing time")):
        b, other = _backend("heap"), _backend("heap")
        try:
            op = _op(b, old)
            op.process_batch([_batch([("a", 1, 10)])])
            op.prepare_snapshot_pre_barrier(1)
            other.restore([b.snapshot(1).run()])
            with pytest.raises(ConfigError, match=f"window 'w': cannot restore: the ttl's clock changed .*{change}"):
                _op(other, new)
        finally:
            b.close()
            other.close()


def test_a_key_keeps_its_newest_arrival_when_its_newest_pane_goes_first(wall):
    """a's row for the later window arrives at T0, one for the earlier window at T0 + 6 ms;
    the earlier window fires (its pane goes): a stays live until T0 + 6 ms + ttl, so at
    T0 + 12 ms its later window still fires."""
    spec = _spec(ep.windows.Tumbling(SIZE / 1e6), ttl=ep.StateTtl(WALL_TTL / 1e6))
    b = _backend("heap")
    try:
        op = _op(b, spec)
        op.process_batch([_batch([("a", 1, SIZE + 5000)])])
        wall["us"] += 6000
        op.process_batch([_batch([("a", 2, 5000)])])
        first = op.on_watermark(SIZE - 1)
        assert [(r["k"], r["n"], r["s"]) for batch in first for r in batch.to_pylist()] == [("a", 1, 2)]
        wall["us"] = T0 + 12_000
        due = op.next_processing_time()
        if due is not None and due <= wall["us"]:
            op.on_processing_time(wall["us"])
        second = op.on_watermark(2 * SIZE - 1)
        assert [(r["k"], r["n"], r["s"]) for batch in second for r in batch.to_pylist()] == [("a", 1, 1)]
    finally:
        b.close()


def test_processing_time_ttl_job_through_a_crash(tmp_path):
    """A local job with a processing-time ttl (an hour: no key falls silent that long, so
    nothing may be dropped — the wall clock of a loaded machine decides nothing here) through
    a crash after a checkpoint: the arrival stamps, the clock record and the timer hooks
    work in a real task; exactly-once output against the plain-Python window counts."""
    from epochal.columnar import count
    from epochal.sinks import FileSink, read_committed
    from epochal.testing import CrashAtRecord
    from pipelines import unique_dir
    from test_columnar_window_ttl import E2E, PHASE, SETS, WIN_S, _span_batches, span_oracle_without_ttl

    n = PHASE * SETS * 2
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("cwin-pttl", parallelism=2)
    (flow.source("ev", ep.sources.GeneratorSource(_span_batches, num_splits=1, schema=E2E, records_per_second=80.0),
                 parallelism=1)
         .with_watermarks("wm", timestamp="ts", parallelism=1)
         .key_by("k")
         .window(ep.windows.Tumbling(WIN_S), ttl=ep.StateTtl("1h"))
         .aggregate("counts", n=count())
         .sink("out", FileSink(out, format="parquet")))
    result = flow.run(runtime="local", faults=[CrashAtRecord("counts", subtask=0, record=15, how="exit",
                                                             after_epoch=1)],
                      checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, f"the crash did not fire: {result.failures}"
    got = collections.Counter((r["k"], round(r["window_start"].timestamp()), r["n"])
                              for r in read_committed(out, format="parquet"))
    assert got == collections.Counter((k, w * WIN_S, c) for (k, w), c in span_oracle_without_ttl(n).items())


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_the_reader_hides_keys_expired_by_wall_clock_at_read(wall, kind, monkeypatch):
    """A checkpoint holds a's and b's panes; read when a's newest rows are ``ttl`` old (its
    expiry had not run at the cut), the offline reader shows b's panes only."""
    import time

    from epochal.state.location import Checkpoint
    from epochal.state.reader import keyed_entries

    spec = _spec(ep.windows.Tumbling(SIZE / 1e6), ttl=ep.StateTtl(WALL_TTL / 1e6))
    b = _backend(kind)
    try:
        a_then_b(_op(b, spec), wall)
        blob = b.snapshot(1).run()
        if not isinstance(blob, (bytes, bytearray)):
            pytest.skip(f"{type(b).__name__} snapshots to {type(blob).__name__}, not inline bytes")
        meta = {"plan": {"w": {"kind": "window", "parallelism": 1}},
                "tasks": {"t0": {"chain": ["w"], "subtask": 0, "parallelism": 1, "handle": None}}}
        ckpt = Checkpoint(url="test://one-task", storage=None, epoch=1, meta=meta, _states={"t0": {"keyed": blob}})

        def keys_read_at(us):
            monkeypatch.setattr(time, "time_ns", lambda: us * 1000)
            return {row[0] for row in keyed_entries(ckpt, "w", "panes")}
        assert keys_read_at(T0 + WALL_TTL - 1) == {"a", "b"}
        assert keys_read_at(T0 + WALL_TTL) == {"b"}  # a's newest rows arrived at T0
        assert keys_read_at(T0 + 6000 + WALL_TTL) == set()
    finally:
        b.close()
