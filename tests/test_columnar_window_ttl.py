"""``window(..., ttl=StateTtl(d, time="event"))`` on Arrow batches (epochal/columnar/windows.py,
"TTL"): the record path's window TTL, vectorized. The operator (built by the real builder)
is driven directly with batches and watermarks against a plain-Python model of the
definition in docs/ttl-broadcast.md — tumbling and sliding windows, both backends, through
a snapshot restored into a fresh operator; restores adding or removing the ttl are
refused (a processing-time ttl: tests/test_columnar_window_pttl.py)."""
from __future__ import annotations

import collections
import random

import pyarrow as pa
import pytest

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.columnar import count, sum as asum
from epochal.columnar.windows import ColumnWindowOperator
from epochal.errors import ConfigError
from epochal.operators.base import OperatorContext

MAXP = 8
SIZE, SLIDE, TTL = 80_000, 40_000, 25_000  # µs: windows longer than the ttl
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64()), ("ts", pa.int64())])


def _spec(assigner, ttl=ep.StateTtl(TTL / 1e6, time="event")):
    flow = ep.Dataflow("cw-ttl")
    (flow.source("s", ep.sources.CollectionSource([{"k": "a", "v": 1, "ts": 0}]))
         .to_batches("b", SCHEMA)
         .with_watermarks("wm", timestamp="ts", timestamp_unit="us")
         .key_by("k")
         .window(assigner, ttl=ttl)
         .aggregate("w", n=count(), s=asum("v")))
    return flow._nodes["w"].payload


def _backend(kind):
    return HeapStateBackend(range(MAXP), snapshot_mode="thread") if kind == "heap" else RocksDBStateBackend(range(MAXP))


def _op(backend, spec):
    ctx = OperatorContext("w", "w[0]", 0, 1, 0, "cw-ttl", MAXP, keyed_backend=backend, key_groups=range(MAXP))
    op = ColumnWindowOperator(ctx, spec)
    op.restore(None)
    return op


def restorer(kind: str, spec):
    """``(backends, restore)``: a fresh backend, and ``restore(op, wm)`` that snapshots the
    newest backend into a new one and returns a restored operator on it (its regenerated
    watermark ``wm`` fires nothing twice)."""
    backends = [_backend(kind)]

    def restore(op, wm):
        blob = backends[-1].snapshot(1).run()
        backends.append(_backend(kind))
        backends[-1].restore([blob])
        new = _op(backends[-1], spec)
        assert new.on_watermark(wm) == []  # the regenerated watermark fires nothing twice
        return new
    return backends, restore


def _script(seed: int) -> list:
    """Batches of ``(key, v, ts)`` rows (disorder, keys falling silent), watermarks and
    barriers (the operator merges its buffer)."""
    rng = random.Random(seed)
    out, t = [], 0
    for i in range(150):
        rows = []
        for _ in range(rng.randrange(1, 6)):
            t += rng.randrange(0, 1500)
            keys = ["a", "b", "c"] if (i // 25) % 2 else ["a", "b", "c", "d", "e", "f"]
            rows.append((rng.choice(keys), rng.randrange(10), max(0, t - rng.randrange(0, 6000))))
        if rng.random() < 0.1:  # a new key's row further behind than the ttl (late, or already expired)
            rows.append((f"z{i}", 1, max(0, t - rng.randrange(30_000, 90_000))))
        out.append(("rows", rows))
        if rng.random() < 0.2:
            out.append(("barrier",))
        if rng.random() < 0.4:
            out.append(("wm", t - 6000))
    out.append(("wm", t + 10 * SIZE))
    return out


def model(script: list, slide: int, ttl: int | None, live: list | None = None) -> collections.Counter:
    """The definition, in plain Python: a row is late when its last window's end - 1 is at
    or behind the watermark; a key's stamp is the newest event time of its rows (on time),
    its deadline stamp + ttl; at watermark w every window with previous < end - 1 <= w and
    end - 1 < deadline fires; then rows whose last window passed go, and every row of a
    key whose deadline passed (the key starts afresh). Emits ``(key, start, n, sum)``;
    appends to ``live`` after each step the keys with rows whose deadline is ahead."""
    rows: dict = collections.defaultdict(list)
    stamp: dict = {}
    out, wm = collections.Counter(), -(1 << 62)

    def starts(ts):
        last = ts - ts % slide
        return [last - j * slide for j in range(SIZE // slide)]

    for step in script:
        if step[0] == "barrier":
            if live is not None:
                live.append({k for k in rows if rows[k] and (ttl is None or stamp[k] + ttl > wm)})
            continue
        if step[0] == "rows":
            for k, v, ts in step[1]:
                if starts(ts)[0] + SIZE - 1 <= wm:
                    continue  # late
                rows[k].append((ts, v))
                stamp[k] = max(stamp.get(k, ts), ts)
            if live is not None:
                live.append({k for k in rows if rows[k] and (ttl is None or stamp[k] + ttl > wm)})
            continue
        w = step[1]
        if w <= wm:
            if live is not None:
                live.append(live[-1] if live else set())
            continue
        for k in list(rows):
            deadline = stamp[k] + ttl if ttl is not None else 1 << 62
            windows: dict = collections.defaultdict(lambda: [0, 0])
            for ts, v in rows[k]:
                for s in starts(ts):
                    if wm < s + SIZE - 1 <= w and s + SIZE - 1 < deadline:
                        windows[s][0] += 1
                        windows[s][1] += v
            out.update((k, s, n, total) for s, (n, total) in windows.items())
            rows[k] = [(ts, v) for ts, v in rows[k] if starts(ts)[0] + SIZE - 1 > w]
            if deadline <= w:
                del rows[k], stamp[k]
        wm = w
        if live is not None:
            live.append({k for k in rows if rows[k] and (ttl is None or stamp[k] + ttl > wm)})
    return out


def _batch(rows):
    return pa.record_batch([pa.array([r[0] for r in rows], pa.string()), pa.array([r[1] for r in rows], pa.int64()),
                            pa.array([r[2] for r in rows], pa.int64())], schema=SCHEMA)


def stored_keys(op) -> set:
    return {k for block in op.blocks.values() for k in block.keys.to_pylist()}


def run(op, script: list, restore=None, live: list | None = None) -> collections.Counter:
    """Drive ``op``; ``restore(op, wm)`` at the middle returns a restored operator. With
    ``live`` (the model's live keys after each step): after every watermark and snapshot
    the operator stores no key that expired (bounded state)."""
    out, wm = collections.Counter(), None
    for i, step in enumerate(script):
        if step[0] == "rows":
            op.process_batch([_batch(step[1])])
        elif step[0] == "barrier":
            op.prepare_snapshot_pre_barrier(i)
            if live is not None:
                assert stored_keys(op) <= live[i], f"step {i}: expired keys in the snapshot"
        else:
            wm = step[1]
            for b in op.on_watermark(wm):
                assert b.schema.names == ["k", "window_start", "window_end", "n", "s"]  # no hidden column
                d = b.to_pydict()
                out.update((k, s.timestamp() * 1e6, n, t) for k, s, n, t in zip(d["k"], d["window_start"], d["n"],
                                                                                  d["s"]))
            if live is not None:
                assert stored_keys(op) <= live[i], f"step {i}: expired keys kept"
        if restore is not None and i == len(script) // 2 and wm is not None:
            op.prepare_snapshot_pre_barrier(1)
            if live is not None:
                assert stored_keys(op) <= live[i], "expired keys in the snapshot"
            op = restore(op, wm)
    return collections.Counter({(k, round(s), n, t): c for (k, s, n, t), c in out.items()})


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
@pytest.mark.parametrize("slide", [SIZE, SLIDE])
def test_columnar_window_ttl_matches_the_model_through_a_restore(kind, slide):
    script, live = _script(5), []
    want = model(script, slide, TTL, live)
    assert want != model(script, slide, None)  # the ttl really drops windows here
    spec = _spec(ep.windows.Tumbling(SIZE / 1e6) if slide == SIZE else ep.windows.Sliding(SIZE / 1e6, slide / 1e6))
    backends, restore = restorer(kind, spec)
    try:
        assert run(_op(backends[0], spec), script, restore, live) == want
        assert all(not any(b.value_items("w/panes", kg)) for kg in range(MAXP) for b in backends[-1:])
    finally:
        for b in backends:
            b.close()


def test_without_ttl_the_windows_are_unchanged():
    script = _script(5)
    spec = _spec(ep.windows.Tumbling(SIZE / 1e6), ttl=None)
    b = _backend("heap")
    try:
        assert run(_op(b, spec), script) == model(script, SIZE, None)
    finally:
        b.close()


def test_restoring_with_the_ttl_added_or_removed_is_refused():
    plain, timed = _spec(ep.windows.Tumbling(SIZE / 1e6), ttl=None), _spec(ep.windows.Tumbling(SIZE / 1e6))
    for old, new, change in ((plain, timed, "a ttl"), (timed, plain, "no ttl")):
        b, other = _backend("heap"), _backend("heap")
        try:
            op = _op(b, old)
            op.process_batch([_batch([("a", 1, 10)])])
            op.prepare_snapshot_pre_barrier(1)
            other.restore([b.snapshot(1).run()])
            with pytest.raises(ConfigError, match=f"window 'w': cannot restore: the windows' accumulators changed .* "
                                                  f"the ttl was added or removed .*now: {change}"):
                _op(other, new)
        finally:
            b.close()
            other.close()


def test_columnar_window_ttl_build_errors():
    with pytest.raises(ep.PipelineDefinitionError, match="window 'w': ttl update='read_and_write'"):
        _spec(ep.windows.Tumbling(1), ttl=ep.StateTtl(5, time="event", update="read_and_write"))


# ------------------------------------------------------------------ end to end, through a crash
PHASE, SETS, ROWS = 1000, 4, 100
WIN_S, TTL_S = 1500, 200
E2E = pa.schema([("k", pa.string()), ("ts", pa.float64()), ("v", pa.int64())])


def _key(i: int) -> str:
    return f"k{(i // PHASE) % SETS}-{i % 10}"


def _span_batches(split: int, offset: int):
    """Row i: event time i s, key ``k<set>-<j>`` — a key set is active one phase in SETS
    (each key every 10 s), silent for the others; ROWS rows a batch, in order."""
    for b in range(offset, PHASE * SETS * 2 // ROWS):
        ids = range(b * ROWS, (b + 1) * ROWS)
        yield pa.record_batch([pa.array([_key(i) for i in ids]), pa.array([float(i) for i in ids]),
                               pa.array([1] * ROWS)], schema=E2E)


def span_oracle(n: int) -> collections.Counter:
    """Per key and active span (keys never expire inside one — 10 s between rows, a watermark
    at most one batch, 100 s, behind — and always between two, 3000 s apart), per window:
    its count, if the window ends before the span's last row + ttl."""
    counts: collections.Counter = collections.Counter()
    last: dict = {}
    for i in range(n):
        key, span, win = _key(i), i // PHASE, i // WIN_S
        counts[(key, span, win)] += 1
        last[(key, span)] = i
    return collections.Counter((k, w * WIN_S, c) for (k, span, w), c in counts.items()
                               if w * WIN_S + WIN_S - 1e-6 < last[(k, span)] + TTL_S)


def test_columnar_window_and_aggregate_ttl_job_through_a_crash(tmp_path):
    """The window (ttl shorter than the window) drops the windows of a key set that fell
    silent; the aggregate's keys restart with each span (a count never exceeds one span's
    100 rows). A crash after a checkpoint; exactly-once output against the oracles."""
    from epochal.sinks import FileSink, read_committed
    from epochal.testing import CrashAtRecord
    from pipelines import unique_dir

    n = PHASE * SETS * 2
    out, totals = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "totals")
    flow = ep.Dataflow("cwin-ttl", parallelism=2)
    keyed = (flow.source("ev", ep.sources.GeneratorSource(_span_batches, num_splits=1, schema=E2E,
                                                          records_per_second=80.0), parallelism=1)
             .with_watermarks("wm", timestamp="ts", parallelism=1)
             .key_by("k"))
    (keyed.window(ep.windows.Tumbling(WIN_S), ttl=ep.StateTtl(TTL_S, time="event"))
          .aggregate("counts", n=count())
          .sink("out", FileSink(out, format="parquet")))
    (keyed.aggregate("totals", n=count(), ttl=ep.StateTtl(TTL_S, time="event"))
          .sink("totals-out", FileSink(totals, format="parquet")))
    result = flow.run(runtime="local", faults=[CrashAtRecord("counts", subtask=0, record=15, how="exit",
                                                             after_epoch=1)],
                      checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2, f"the crash did not fire: {result.failures}"
    got = collections.Counter((r["k"], round(r["window_start"].timestamp()), r["n"])
                              for r in read_committed(out, format="parquet"))
    want = span_oracle(n)
    assert len(want) < len(span_oracle_without_ttl(n))  # the ttl really drops windows here
    assert got == want
    top: dict = {}
    for r in read_committed(totals, format="parquet"):
        top[r["k"]] = max(top.get(r["k"], 0), r["n"])
    assert top == {f"k{s}-{j}": PHASE // 10 for s in range(SETS) for j in range(10)}  # 200 without the ttl


def span_oracle_without_ttl(n: int) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for i in range(n):
        counts[(_key(i), i // WIN_S)] += 1
    return counts
