"""``window(..., ttl=...)`` (epochal/windows/ttl.py): a key's pending windows are dropped
unfired once the key had no record for ttl. The operator is driven directly (no job) and
compared with a plain-Python model of the definition in docs/ttl-broadcast.md."""
from __future__ import annotations

import collections
import random
import time

import pytest

import epochal as ep
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.operators.base import OperatorContext
from epochal.windows.functions import ReduceCombiner
from epochal.testing import CrashAtRecord
from epochal.windows.operator import PaneWindowOperator, SessionWindowOperator
from pipelines import canon, output, unique_dir

KGS = range(0, 8)
SIZE, TTL = 40_000, 15_000  # µs: windows longer than the ttl (else they always fire first)


def _op(kind: str, backend, ttl, spec=None, cls=PaneWindowOperator, lateness=0):
    ctx = OperatorContext("w", "w[0]", 0, 1, 0, "window-ttl", len(KGS), backend, KGS)
    spec = spec or ep.windows.Tumbling(SIZE / 1e6).spec()
    return cls(ctx, lambda r: r[0], spec, ReduceCombiner(lambda a, b: (a[0], a[1] + b[1])), lateness, True, False, ttl)


def _backend(kind: str):
    return HeapStateBackend(KGS, snapshot_mode="thread") if kind == "heap" else RocksDBStateBackend(KGS)


def _script(seed: int) -> list:
    """Records ``("rec", key, ts)`` in time order with some disorder, and watermarks."""
    rng = random.Random(seed)
    out, t = [], 0
    for _ in range(400):
        t += rng.randrange(0, 3000)
        key = f"k{rng.randrange(10)}"
        out.append(("rec", key, max(0, t - rng.randrange(0, 4000))))
        if rng.random() < 0.3:
            out.append(("wm", t - 4000))
    out.append(("wm", t + 10 * TTL))
    return out


def model(script: list, ttl: int) -> tuple[collections.Counter, int]:
    """The definition, in plain Python: tumbling event-time windows of SIZE, no lateness; a
    key's stamp is the newest event time of its records; when the watermark passes a
    window's end, it fires only if ``end - 1 < stamp + ttl``; the key's contents are gone
    once the watermark reaches ``stamp + ttl`` (a record then starts afresh). Returns the
    fired ``(key, start, sum)`` and how many times a key expired with pending contents."""
    panes: dict = collections.defaultdict(dict)  # key -> start -> count
    stamp: dict = {}
    out, expiries, wm = collections.Counter(), 0, -(1 << 62)

    def expire(k):
        nonlocal expiries
        expiries += bool(panes[k])
        panes[k].clear()
        del stamp[k]

    for step in script:
        if step[0] == "rec":
            _, k, ts = step
            start = ts - ts % SIZE
            if start + SIZE - 1 <= wm:
                continue  # late: the side output, no state touched
            if k in stamp and stamp[k] + ttl <= wm:
                expire(k)
            panes[k][start] = panes[k].get(start, 0) + 1
            stamp[k] = max(stamp.get(k, ts), ts)
            continue
        wm = max(wm, step[1])
        for k in sorted(panes):
            for start in sorted(panes[k]):
                if start + SIZE - 1 <= wm:
                    n = panes[k].pop(start)
                    if k in stamp and start + SIZE - 1 < stamp[k] + ttl:
                        out[(k, start, n)] += 1
                    elif k in stamp:
                        expire(k)
                        break
            if k in stamp and stamp[k] + ttl <= wm:
                expire(k)
    return out, expiries


def run(op, script: list) -> collections.Counter:
    got = collections.Counter()
    for step in script:
        if step[0] == "rec":
            _, k, ts = step
            results = op.process_batch([(ts, (k, 1))])
        else:
            results = op.on_watermark(step[1])
        for r in results:
            got[(r.key, round(r.start * 1e6), r.value[1])] += 1
    return got


@pytest.mark.parametrize("backend_kind", ["heap", "rocksdb"])
@pytest.mark.parametrize("seed", [1, 2])
def test_event_time_window_ttl_matches_the_model(backend_kind, seed):
    script = _script(seed)
    want, expiries = model(script, TTL)
    assert expiries > 5  # the script really lets keys expire with windows pending
    assert want != model(script, 10 ** 12)[0]  # ... and that changes the output
    backend = _backend(backend_kind)
    try:
        op = _op(backend_kind, backend, ep.StateTtl(TTL / 1e6, time="event"))
        assert run(op, script) == want
        # nothing left behind: no panes, no activity, no timers of any key
        assert not any(backend.map_keys("w/panes", kg) for kg in KGS)
        assert not any(backend.value_items("w/active", kg) for kg in KGS)
        assert op.ttl.queue.peek() is None and op.fire_q.peek() is None
    finally:
        backend.close()


def test_without_ttl_nothing_expires():
    script = _script(3)
    backend = _backend("heap")
    op = _op("heap", backend, None)
    assert op.ttl is None
    assert run(op, script) == model(script, 10 ** 12)[0]


def test_session_windows_of_an_expired_key_do_not_fire():
    backend = _backend("heap")
    spec = ep.windows.Session(0.02).spec()  # gap 20 ms
    op = _op("heap", backend, ep.StateTtl(0.025, time="event"), spec=spec, cls=SessionWindowOperator,
             lateness=50_000)  # a lateness longer than the ttl: the key expires before cleanup
    assert op.process_batch([(0, ("a", 1)), (10_000, ("a", 1)), (0, ("b", 1))]) == []
    fired = op.on_watermark(30_000)  # a's session [0, 30 ms) fires (29 999 < 10 000 + 25 000), b's too
    assert sorted((r.key, r.value[1]) for r in fired) == [("a", 2), ("b", 1)]
    kg_a, kg_b = op.assigner.assign("a"), op.assigner.assign("b")
    assert op.backend.map_items("w/sessions", kg_b, "b") == []  # b's deadline (25 ms) passed: kept state gone
    assert op.on_watermark(34_999) == []
    assert op.backend.map_items("w/sessions", kg_a, "a") != []  # kept for lateness, a still live
    op.on_watermark(35_000)  # a's deadline (10 ms + 25 ms): its kept session goes with it
    assert op.backend.map_items("w/sessions", kg_a, "a") == []
    # a late record within the lateness of a's old session starts afresh instead of updating it
    assert [(r.key, r.value[1]) for r in op.process_batch([(12_000, ("a", 1))])] == [("a", 1)]


def test_processing_time_ttl_drops_event_time_windows_of_silent_keys(monkeypatch):
    """Event-time windows behind a watermark that does not move: the wall clock expires a
    silent key (``a``) while the key still writing (``b``) keeps its window."""
    clock = {"ns": 10 ** 18}
    monkeypatch.setattr(time, "time_ns", lambda: clock["ns"])
    backend = _backend("heap")
    op = _op("heap", backend, ep.StateTtl(2))  # 2 s of wall clock
    op.process_batch([(1, ("a", 1)), (2, ("b", 1))])
    clock["ns"] += 1_500_000_000
    op.process_batch([(3, ("b", 1))])
    due = op.next_processing_time()
    assert due == (10 ** 18 + 2_000_000_000) // 1000  # a's deadline
    clock["ns"] += 600_000_000
    op.on_processing_time(clock["ns"] // 1000)
    kg_a, kg_b = op.assigner.assign("a"), op.assigner.assign("b")
    assert backend.map_items("w/panes", kg_a, "a") == []
    assert backend.map_items("w/panes", kg_b, "b") != []
    assert op.next_processing_time() == (10 ** 18 + 3_500_000_000) // 1000  # b's timer, moved to its deadline
    fired = op.on_watermark(SIZE)
    assert [(r.key, r.value[1]) for r in fired] == [("b", 2)]


def test_window_ttl_build_errors():
    flow = ep.Dataflow("window-ttl-bad")
    keyed = flow.source("s", ep.sources.CollectionSource([1, 2])).key_by(lambda r: r)
    with pytest.raises(ep.PipelineDefinitionError, match="window 'w': event-time ttl needs event-time windows"):
        keyed.window(ep.windows.Tumbling(5, processing_time=True), ttl=ep.StateTtl(5, time="event")).reduce(
            "w", lambda a, b: a)
    with pytest.raises(ep.PipelineDefinitionError, match="window 'w2': ttl update='read_and_write'"):
        keyed.window(ep.windows.Tumbling(5, processing_time=True),
                     ttl=ep.StateTtl(5, update="read_and_write")).reduce("w2", lambda a, b: a)
    with pytest.raises(ep.PipelineDefinitionError, match="window 'w3': ttl: StateTtl ttl"):
        keyed.window(ep.windows.Tumbling(5, processing_time=True), ttl=-1).reduce("w3", lambda a, b: a)


# --------------------------------------------------------------- end to end, through a crash
PHASE_S, SETS, WIN_S, TTL_S = 1000, 4, 1500, 200


def _events(split: int, offset: int):
    """Record i: event time i s, key ``k<set>-<j>``: a key set is active one phase in
    ``SETS`` (each key every 10 s), silent for the other phases."""
    i = offset
    while True:
        yield (f"k{(i // PHASE_S) % SETS}-{i % 10}", i)
        i += 1


def span_oracle(n: int) -> collections.Counter:
    """Per key and active phase (a span: keys never expire inside one, always between
    two), per window: its count, if the window ends before the span's last record + ttl."""
    counts: collections.Counter = collections.Counter()
    last: dict = {}
    for i in range(n):
        key, span, win = f"k{(i // PHASE_S) % SETS}-{i % 10}", i // PHASE_S, i // WIN_S
        counts[(key, span, win)] += 1
        last[(key, span)] = i
    return canon([[k, float(w * WIN_S), c] for (k, span, w), c in counts.items()
                  if w * WIN_S + WIN_S - 1e-6 < last[(k, span)] + TTL_S])


@pytest.mark.slow  # 6-9 s; the rules themselves are checked above without processes
def test_event_time_window_ttl_end_to_end_through_a_crash(tmp_path):
    """Windows longer than the ttl: a key set's window that ends more than ttl after its
    last record never fires. The margins (≥ 300 s of event time either way) make the
    result independent of batching and watermark lag; a task crashes after a checkpoint."""
    n = PHASE_S * SETS * 2
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "ckpt")
    f = ep.Dataflow("window-ttl", parallelism=2)
    (f.source("events", ep.sources.GeneratorSource(_events, num_splits=1, limit=n, records_per_second=6000.0),
              parallelism=1)
      .with_watermarks("wm", timestamp=lambda e: e[1], parallelism=1)
      .map("one", lambda e: (e[0], 1), parallelism=1)
      .key_by(lambda e: e[0])
      .window(ep.windows.Tumbling(WIN_S), ttl=ep.StateTtl(TTL_S, time="event"))
      .reduce("counts", lambda a, b: (a[0], a[1] + b[1]))
      .map("fmt", lambda r: [r.key, r.start, r.value[1]])
      .sink("out", ep.sinks.FileSink(out, format="jsonl")))
    result = f.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1, storage=url),
                   faults=[CrashAtRecord("counts", subtask=0, record=1500, how="exit", after_epoch=1)])
    assert result.attempts == 2, f"the crash did not fire: {result.failures}"
    want = span_oracle(n)
    everything = canon([[k, float(w * WIN_S), c] for (k, _s, w), c in _all_windows(n).items()])
    assert want != everything  # the ttl really drops windows here
    assert output(out) == want


def _all_windows(n: int) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for i in range(n):
        c[(f"k{(i // PHASE_S) % SETS}-{i % 10}", i // PHASE_S, i // WIN_S)] += 1
    return c
