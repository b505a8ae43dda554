"""Event time end to end: windows and timers against plain-Python oracles, with faults.

Input: two splits of events ``(key, ts, value, id)`` whose timestamps are out of order by
at most ``DISORDER`` within a split (one split per source subtask, watermarks bounded by
``BOUND`` > ``DISORDER``), so no record is late and every window's content is known
without running the engine. Keys are active in alternating 2.5 s blocks, so session
windows (gap 0.5 s) have real gaps. The late-data test uses one source subtask and
records whose lateness is unambiguous whatever the batching (see ``late_category``).
"""
from __future__ import annotations

import collections
import json
import os
import time

import pytest

import epochal as ep
from epochal.backends.choice import BackendSpec
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord, CrashDuringAlignment, CrashDuringCommit, CrashDuringSnapshotUpload
from epochal.windows import AggregateFunction, Count, Session, Sliding, Tumbling

from pipelines import cancel_after_epoch, run_until_checkpoints, unique_dir

N = 3000  # events per split
SPLITS = 2
STEP = 0.01  # seconds of event time per event index
DISORDER = 0.8
BOUND = 1.0


KEYS = ("u0", "u1", "u2", "u7", "u8", "u9")  # spread over subtasks at parallelism 2 and 3
LATE_KEYS = ("u0", "u1", "u2", "u4")


def event(split: int, i: int) -> tuple:
    block = (i // 250) % 2
    key = KEYS[(i * 31 + split) % 3 + 3 * block]
    jitter = ((i * 7919 + split * 104729) % 97) / 97 * DISORDER
    return key, round(i * STEP - jitter, 6), (i % 13) + 1, f"{split}-{i}"


def events_of(split: int, offset: int):
    return (event(split, i) for i in range(offset, N))


def all_events():
    return [event(s, i) for s in range(SPLITS) for i in range(N)]


def us(t: float) -> int:
    return round(t * 1_000_000)


class SumCount(AggregateFunction):
    def create(self):
        return (0, 0)

    def add(self, acc, value):
        return (acc[0] + 1, acc[1] + value[2])

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])


def ids_of(key, window, elements):
    yield sorted(e[3] for e in elements)


def windows_flow(name: str, out: str, assigner, *, window_parallelism: int = 2, rate: float | None = 4000.0,
                 ids: bool = False) -> ep.Dataflow:
    flow = ep.Dataflow(name, parallelism=window_parallelism)
    source = ep.sources.GeneratorSource(events_of, num_splits=SPLITS, limit=N, records_per_second=rate)
    windowed = (flow.source("events", source, parallelism=SPLITS)
                .with_watermarks("ts", timestamp=lambda e: e[1], max_out_of_orderness=BOUND)
                .key_by(lambda e: e[0])
                .window(assigner))
    result = (windowed.process("win", ids_of, parallelism=window_parallelism) if ids
              else windowed.aggregate("win", SumCount(), parallelism=window_parallelism))
    result.sink("out", FileSink(out), parallelism=2)
    return flow


def results(out: str) -> collections.Counter:
    return collections.Counter((r["key"], r["start"], r["end"], tuple(r["value"])) for r in read_committed(out))


def pane_oracle(size: float, slide: float, events=None, agg=lambda vs: (len(vs), sum(v[2] for v in vs))):
    windows = collections.defaultdict(list)
    size_us, slide_us = us(size), us(slide)
    for e in events or all_events():
        t = us(e[1])
        start = t - t % slide_us
        while start > t - size_us:
            windows[(e[0], start)].append(e)
            start -= slide_us
    return collections.Counter((k, s / 1e6, (s + size_us) / 1e6, agg(vs)) for (k, s), vs in windows.items())


def sessions(events, gap: float) -> list:
    """(key, start_us, end_us, events) per session; asserts no record lands exactly on a
    session's end (there an in-order arrival would merge after the session fired)."""
    per_key = collections.defaultdict(list)
    for e in events:
        per_key[e[0]].append(e)
    out = []
    for key, es in per_key.items():
        es.sort(key=lambda e: us(e[1]))
        cur = None
        for e in es:
            t = us(e[1])
            if cur is not None and t <= cur[2]:
                assert t != cur[2], f"test data: {e} lands exactly on a session end"
                cur[2] = max(cur[2], t + us(gap))
                cur[3].append(e)
            else:
                if cur is not None:
                    out.append(tuple(cur))
                cur = [key, t, t + us(gap), [e]]
        out.append(tuple(cur))
    return out


def session_oracle(gap: float) -> collections.Counter:
    return collections.Counter((k, s / 1e6, e / 1e6, (len(es), sum(x[2] for x in es)))
                               for k, s, e, es in sessions(all_events(), gap))


def _run(flow, tmp_path, faults=(), **kw) -> ep.runtime.driver.result.JobResult:
    kw.setdefault("runtime", "local")
    kw.setdefault("checkpoint", ep.CheckpointConfig(interval=0.05, storage="file://" + unique_dir(tmp_path, "ck")))
    return flow.run(faults=list(faults), **kw)


def _fired(result, attempts: int = 2) -> None:
    """The injected fault fired: a raised one is named, an exited process is a disconnect."""
    assert result.attempts == attempts, result.failures
    assert all("injected" in f or "disconnected without finishing" in f for f in result.failures), result.failures


# ---------------------------------------------------------------------------- windows
def test_oracle_data_is_out_of_order_with_real_session_gaps():
    evs = all_events()
    per_split = [[e for e in evs if e[3].startswith(f"{s}-")] for s in range(SPLITS)]
    for p in per_split:
        running = [max(us(x[1]) for x in p[:i + 1]) for i in range(0, len(p), 50)]
        behind = max(running[i // 50] - us(e[1]) for i, e in enumerate(p) if i % 50 == 0)
        assert 0.5e6 < behind < us(DISORDER)
    assert len(sessions(evs, 0.5)) == 36  # 6 keys x 6 bursts of 2.5 s


@pytest.mark.parametrize("assigner,oracle,backend,fault", [
    (Tumbling("2s"), lambda: pane_oracle(2, 2), "heap", CrashAtRecord("win", subtask=1, record=1500, how="exit")),
    (Sliding("3s", "1s"), lambda: pane_oracle(3, 1), "rocksdb",
     CrashDuringSnapshotUpload("win", subtask=0, epoch=3)),
    (Session("0.5s"), lambda: session_oracle(0.5), BackendSpec("rocksdb", {"incremental": True}),
     CrashDuringAlignment("win", subtask=1, epoch=2)),
    (Tumbling("2s"), lambda: pane_oracle(2, 2), "heap", CrashDuringCommit("out", subtask=0, epoch=2)),
], ids=["tumbling-crash-at-record", "sliding-rocksdb-crash-in-upload", "session-incremental-crash-aligning",
        "tumbling-crash-in-commit"])
def test_windows_equal_the_oracle_exactly_once_despite_a_fault(tmp_path, assigner, oracle, backend, fault):
    out = unique_dir(tmp_path, "out")
    result = _run(windows_flow("w", out, assigner), tmp_path, [fault], backend=backend)
    _fired(result)
    assert results(out) == oracle()


def test_windows_at_least_once_hold_every_record(tmp_path):
    out = unique_dir(tmp_path, "out")
    result = _run(windows_flow("w", out, Tumbling("2s"), ids=True), tmp_path,
                  [CrashAtRecord("win", subtask=0, record=2000, how="exit", after_epoch=2)],
                  guarantee="at-least-once")
    _fired(result)
    seen = collections.defaultdict(set)
    for r in read_committed(out):
        seen[(r["key"], r["start"], r["end"])].update(r["value"])
    expected = pane_oracle(2, 2, agg=lambda vs: tuple(sorted(v[3] for v in vs)))
    for (key, start, end, ids), _ in expected.items():
        assert set(ids) <= seen[(key, start, end)]


@pytest.mark.spark
def test_windows_on_spark_survive_a_process_crash(tmp_path, spark):
    out = unique_dir(tmp_path, "out")
    result = _run(windows_flow("w-spark", out, Sliding("3s", "1s")), tmp_path,
                  [CrashAtRecord("win", subtask=0, record=1200, how="exit", after_epoch=1)],
                  runtime="spark", spark=spark)
    _fired(result)
    assert results(out) == pane_oracle(3, 1)


# -------------------------------------------------------------------- late records
LATE_N = 4000
BATCH = 64  # the source's poll size: watermarks follow each poll


def _normal(i: int) -> float:
    return round(i * STEP - ((i * 7919) % 97) / 97 * DISORDER, 6)


def _late_ts(i: int) -> float | None:
    """Every 61st record from i = 1100 on is sent back in time: into a window that has
    certainly fired but not expired (late firing), or one that has certainly expired."""
    if i < 1100 or i % 61:
        return None
    w_lo = max(_normal(j) for j in range(i - BATCH + 1)) - BOUND  # watermark certainly reached
    end = (w_lo // 10) * 10  # a window end the watermark passed
    return end - 5 if (i // 61) % 2 else end - 35


def late_event(split: int, i: int) -> tuple:
    ts = _late_ts(i)
    return LATE_KEYS[i % 4], _normal(i) if ts is None else ts, 1, f"{i}"


def late_events(split: int, offset: int):
    return (late_event(split, i) for i in range(offset, LATE_N))


def late_category(i: int, events: list, lateness: float) -> str:
    """normal: its window cannot have fired when it arrives; refire: it certainly fired and
    has not expired; dropped: it certainly expired. The watermark at its arrival lies
    between the watermark of the records a whole poll earlier and that of all before it."""
    w_lo = max(us(e[1]) for e in events[:max(1, i - BATCH + 1)]) - us(BOUND) - 1
    w_hi = max(us(e[1]) for e in events[:max(1, i)]) - us(BOUND) - 1
    t = us(events[i][1])
    end = t - t % us(10) + us(10)
    if end - 1 > w_hi:
        return "normal"
    if end - 1 <= w_lo and end - 1 + us(lateness) > w_hi:
        return "refire"
    if end - 1 + us(lateness) <= w_lo:
        return "dropped"
    raise AssertionError(f"test data: record {i} {events[i]} is ambiguously late")


def late_oracle(lateness: float):
    events = [late_event(0, i) for i in range(LATE_N)]
    normal, refires, dropped = collections.Counter(), collections.defaultdict(int), []
    out = collections.Counter()
    for i, e in enumerate(events):
        category = late_category(i, events, lateness)
        window = (e[0], (us(e[1]) - us(e[1]) % us(10)) / 1e6)
        if category == "normal":
            normal[window] += 1
        elif category == "refire":
            refires[window] += 1
        else:
            dropped.append(e)
    for window in set(normal) | set(refires):
        base = normal[window]
        for n in ([base] if base else []) + [base + j for j in range(1, refires[window] + 1)]:
            out[(window[0], window[1], window[1] + 10, n)] += 1
    assert len(refires) > 5 and len(dropped) > 5
    return out, collections.Counter(map(tuple, dropped))


def test_late_records_refire_within_lateness_and_go_to_the_side_output_beyond(tmp_path):
    lateness = 20.0
    flow = ep.Dataflow("late", parallelism=2)
    source = ep.sources.GeneratorSource(late_events, num_splits=1, limit=LATE_N, records_per_second=6000.0)
    counts = (flow.source("events", source, parallelism=1)
              .with_watermarks("ts", timestamp=lambda e: e[1], max_out_of_orderness=BOUND)
              .key_by(lambda e: e[0])
              .window(Tumbling("10s"), allowed_lateness=lateness)
              .aggregate("win", Count(), parallelism=2))
    out, late = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "late")
    counts.sink("out", FileSink(out))
    counts.late().sink("late", FileSink(late))
    result = _run(flow, tmp_path, [CrashAtRecord("win", subtask=1, record=900, how="exit", after_epoch=2)],
                  channels=ep.ChannelConfig(batch_size=BATCH))
    _fired(result)
    expected, expected_late = late_oracle(lateness)
    got = collections.Counter((r["key"], r["start"], r["end"], r["value"]) for r in read_committed(out))
    assert got == expected
    assert collections.Counter(tuple(r) for r in read_committed(late)) == expected_late


# --------------------------------------------------------------------------- timers
class Buckets(ep.KeyedProcessFunction):
    """Counts each key's records per second of event time by hand, with timers: a timer at
    the end of each second emits its count. Registers the same timer many times (one
    timer), and deletes and re-registers it every 50 records (still one firing)."""

    def open(self, ctx):
        self.ctx = ctx
        self.counts = ctx.map_state("counts")

    def process(self, key, e):
        second = int(e[1] // 1)
        n = self.counts.get(second, 0) + 1
        self.counts.put(second, n)
        if n % 50 == 0:
            self.ctx.timers.delete_event_time(second + 1)
        self.ctx.timers.register_event_time(second + 1)

    def on_timer(self, key, timestamp, domain):
        assert domain == "event" and self.ctx.timestamp == timestamp and self.ctx.watermark >= timestamp
        second = round(timestamp) - 1
        yield {"key": key, "second": second, "n": self.counts.get(second)}
        self.counts.remove(second)


def bucket_oracle() -> collections.Counter:
    per = collections.Counter((e[0], int(e[1] // 1)) for e in all_events())
    return collections.Counter((k, s, n) for (k, s), n in per.items())


def buckets(out: str) -> collections.Counter:
    return collections.Counter((r["key"], r["second"], r["n"]) for r in read_committed(out))


def timers_flow(name: str, out: str, win_out: str | None = None, parallelism: int = 2,
                rate: float | None = 4000.0) -> ep.Dataflow:
    flow = ep.Dataflow(name, parallelism=parallelism)
    source = ep.sources.GeneratorSource(events_of, num_splits=SPLITS, limit=N, records_per_second=rate)
    keyed = (flow.source("events", source, parallelism=SPLITS)
             .with_watermarks("ts", timestamp=lambda e: e[1], max_out_of_orderness=BOUND)
             .key_by(lambda e: e[0]))
    keyed.process("buckets", Buckets(), parallelism=parallelism).sink("out", FileSink(out), parallelism=1)
    if win_out:
        keyed.window(Session("0.5s")).aggregate("win", SumCount(), parallelism=parallelism).sink(
            "wout", FileSink(win_out), parallelism=1)
    return flow


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_event_time_timers_fire_exactly_once_despite_a_crash(tmp_path, backend):
    out = unique_dir(tmp_path, "out")
    result = _run(timers_flow("t", out), tmp_path, [CrashAtRecord("buckets", subtask=1, record=1000, how="exit",
                                                                  after_epoch=2)], backend=backend)
    _fired(result)
    assert buckets(out) == bucket_oracle()


def test_timers_and_open_windows_rescale_2_to_3_to_1(tmp_path):
    """Pending timers and open sessions are keyed state: they follow their key groups."""
    out, wout, url = unique_dir(tmp_path, "out"), unique_dir(tmp_path, "wout"), "file://" + unique_dir(tmp_path, "c")
    run_until_checkpoints(timers_flow("r", out, wout, 2, rate=1500.0), url, 3, resume=False)
    run_until_checkpoints(timers_flow("r", out, wout, 3, rate=1500.0), url, 3, resume=True)
    result = timers_flow("r", out, wout, 1, rate=None).run(
        runtime="local", resume=True, checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    assert len(result.restored_from) and result.restored_from[0] is not None
    assert buckets(out) == bucket_oracle()
    assert collections.Counter((r["key"], r["start"], r["end"], tuple(r["value"])) for r in read_committed(wout)) \
        == session_oracle(0.5)


class Flush(ep.KeyedProcessFunction):
    """Counts records per key and emits the count 0.1 s of processing time after the
    first record of a batch; an event-time timer at the end of input flushes the rest."""

    def open(self, ctx):
        self.ctx = ctx
        self.n = ctx.value_state("n", default=0)
        self.armed = ctx.value_state("armed", default=False)

    def process(self, key, e):
        self.n.update(self.n.value() + 1)
        if not self.armed.value():
            self.armed.update(True)
            self.ctx.timers.register_processing_time(self.ctx.processing_time() + 0.1)
        self.ctx.timers.register_event_time(1e9)  # fires with the final watermark

    def on_timer(self, key, timestamp, domain):
        if self.n.value():
            yield {"key": key, "n": self.n.value(), "domain": domain}
        self.n.clear()
        self.armed.clear()


def test_processing_time_timers_count_every_record_exactly_once(tmp_path):
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("pt", parallelism=2)
    (flow.source("events", ep.sources.GeneratorSource(events_of, num_splits=SPLITS, limit=N,
                                                      records_per_second=2500.0), parallelism=SPLITS)
        .key_by(lambda e: e[0]).process("flush", Flush()).sink("out", FileSink(out)))
    result = _run(flow, tmp_path, [CrashAtRecord("flush", subtask=0, record=1500, how="exit", after_epoch=3)])
    _fired(result)
    got = collections.Counter()
    domains = collections.Counter()
    for r in read_committed(out):
        got[r["key"]] += r["n"]
        domains[r["domain"]] += 1
    assert got == collections.Counter(e[0] for e in all_events())
    assert domains["processing"] > 10  # they fired while the job ran, not only at the end


class Reminder(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.ctx = ctx
        self.set = ctx.value_state("set", default=False)

    def process(self, key, e):
        if not self.set.value():
            self.set.update(True)
            self.ctx.timers.register_processing_time(self.ctx.processing_time() + 1.0)

    def on_timer(self, key, timestamp, domain):
        yield {"key": key, "due": timestamp, "fired": self.ctx.processing_time()}


def test_processing_time_timers_due_while_the_job_was_down_fire_after_restore(tmp_path):
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "c")

    def flow(rate):
        f = ep.Dataflow("remind", parallelism=2)
        (f.source("events", ep.sources.GeneratorSource(events_of, num_splits=SPLITS, limit=N,
                                                       records_per_second=rate), parallelism=SPLITS)
            .key_by(lambda e: e[0]).process("remind", Reminder()).sink("out", FileSink(out)))
        return f

    run_until_checkpoints(flow(300.0), url, 2, resume=False)
    time.sleep(1.2)  # every reminder registered before the cancel is due now
    restarted = time.time()
    flow(None).run(runtime="local", resume=True, checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    fired = read_committed(out)
    assert len({r["key"] for r in fired}) == len(fired)  # once per key, however the job stopped
    while_down = [r for r in fired if r["due"] < restarted <= r["fired"]]
    assert while_down, fired
    assert all(r["fired"] - restarted < 5.0 for r in while_down)


# --------------------------------------------------------------- loops and unaligned
def countdown_body(stream):
    step = stream.map("step", lambda e: (e[0], e[1], e[2], e[3], e[4] - 1))
    return step.filter("again", lambda e: e[4] > 0), step.filter("done", lambda e: e[4] <= 0)


def test_event_time_flows_through_a_loop_without_stalling(tmp_path):
    """Records keep their timestamps around a feedback loop. The loop head's event time
    comes from its external input only, so the loop never holds event time back — and a
    record that circulates may come out behind the watermark: windows after a loop re-derive
    event time with their own bound (here 10 s, far more than any record spends looping)."""
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("loop", parallelism=2)
    # 1.5 s of input, the crash once epoch 1 completed: it lands mid-run even on a loaded machine
    # (at 4000 records/s and after epoch 2, the input could end before the fault was armed)
    source = ep.sources.GeneratorSource(events_of, num_splits=SPLITS, limit=N, records_per_second=2000.0)
    (flow.source("events", source, parallelism=SPLITS)
        .with_watermarks("ts", timestamp=lambda e: e[1], max_out_of_orderness=BOUND)
        .map("rounds", lambda e: e + (e[2] % 3 + 1,))
        .iterate("loop", countdown_body)
        .with_watermarks("ts-after", timestamp=lambda e: e[1], max_out_of_orderness=10)
        .key_by(lambda e: e[0]).window(Tumbling("2s")).aggregate("win", SumCount())
        .sink("out", FileSink(out)))
    result = _run(flow, tmp_path, [CrashAtRecord("step", subtask=1, record=2500, how="exit", after_epoch=1)])
    _fired(result)
    assert results(out) == pane_oracle(2, 2)
    assert all(m["watermark"] == ep.time.MAX_TIME for t, m in result.task_metrics.items() if t.startswith("loop"))


def slow(record):
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:
        pass
    return record


class HeldOpen(ep.sources.GeneratorSource):
    """``GeneratorSource``, except that its splits never finish: after the last record it
    only answers idle, so the job runs (and holds event time) until it is cancelled."""

    def create_reader(self, splits, state, *, subtask=0, parallelism=1):
        return _HeldOpenReader(super().create_reader(splits, state, subtask=subtask, parallelism=parallelism))


class _HeldOpenReader(ep.sources.SourceReader):
    def __init__(self, inner):
        self.inner, self.drained = inner, False

    def poll(self, max_records):
        if self.drained:
            return ep.sources.Poll([], idle=True)
        p = self.inner.poll(max_records)
        self.drained = p.finished
        return ep.sources.Poll(p.records, idle=p.idle or (p.finished and not p.records), split=p.split)

    def snapshot(self):
        return self.inner.snapshot()

    def close(self):
        self.inner.close()


def test_unaligned_checkpoints_keep_watermarks_in_channel_state(tmp_path):
    """With unaligned checkpoints the watermarks queued among in-flight records are part of
    the channel state and are replayed in order; the windows still equal the oracle.

    Deterministic: the first run takes no periodic epochs and its source never ends, so
    the only epochs are the ones the test triggers, one at a time. Against a stage that
    takes 1 ms a record, the queues in front of it stay full for seconds; the test cancels
    right after a completed epoch holds watermarks in its channel state, so that epoch is
    the restore point. The second run resumes from it with the bounded source."""
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "c")

    def flow(source_type):
        f = ep.Dataflow("ua", parallelism=2)
        source = source_type(events_of, num_splits=SPLITS, limit=N, records_per_second=1500.0)
        (f.source("events", source, parallelism=SPLITS)
            .with_watermarks("ts", timestamp=lambda e: e[1], max_out_of_orderness=BOUND)
            .key_by(lambda e: e[0]).map("slow", slow)
            .key_by(lambda e: e[0]).window(Tumbling("2s")).aggregate("win", SumCount())
            .sink("out", FileSink(out)))
        return f

    channels = ep.ChannelConfig(batch_size=32, credits=4)
    handle = flow(HeldOpen).start(runtime="local", channels=channels,
                                  checkpoint=ep.CheckpointConfig(interval=None, storage=url, unaligned=True))
    held = cancel_after_epoch(handle, lambda epoch: epoch["channel_state_watermarks"] > 0)
    assert held is not None, [(e["channel_state_records"], e["channel_state_watermarks"])
                              for e in handle.completed_epochs]
    assert handle.completed_epochs[-1]["epoch"] == held["epoch"]
    assert held["snapshot_kinds"].get("unaligned", 0) > 0
    result = flow(ep.sources.GeneratorSource).run(
        runtime="local", resume=True, channels=channels,
        checkpoint=ep.CheckpointConfig(interval=0.05, storage=url, unaligned=True))
    assert result.restored_from[0] == held["epoch"]
    assert results(out) == pane_oracle(2, 2)
    replayed = collections.Counter()
    for m in result.task_metrics.values():
        replayed.update({k: m.get(k, 0) for k in ("channel_state_replayed", "channel_state_watermarks")})
    assert replayed["channel_state_watermarks"] == held["channel_state_watermarks"], (replayed, held)
    assert replayed["channel_state_replayed"] > 0, replayed


def test_watermarks_are_replaced_by_with_watermarks_and_reported(tmp_path):
    """A job's task metrics report each task's last forwarded watermark: the end of input."""
    out = unique_dir(tmp_path, "out")
    result = _run(windows_flow("m", out, Tumbling("2s"), rate=None), tmp_path)
    marks = {t: m.get("watermark") for t, m in result.task_metrics.items()}
    assert marks["events[0]"] == ep.time.MAX_TIME
    assert json.dumps(sorted(marks))  # every task reported


def test_processing_time_windows_count_every_record_once(tmp_path):
    """Processing-time windows are not reproducible (a restored job assigns records by the
    wall clock again), but each record is still counted in exactly one committed window."""
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("ptw", parallelism=2)
    (flow.source("events", ep.sources.GeneratorSource(events_of, num_splits=SPLITS, limit=N,
                                                      records_per_second=3000.0), parallelism=SPLITS)
        .key_by(lambda e: e[0]).window(Tumbling("0.2s", processing_time=True)).aggregate("win", Count())
        .sink("out", FileSink(out)))
    result = _run(flow, tmp_path, [CrashAtRecord("win", subtask=0, record=1500, how="exit", after_epoch=2)])
    _fired(result)
    got = collections.Counter()
    windows = collections.Counter()
    for r in read_committed(out):
        got[r["key"]] += r["value"]
        windows[r["key"]] += 1
        assert round(r["end"] - r["start"], 6) == 0.2
    assert got == collections.Counter(e[0] for e in all_events())
    assert min(windows.values()) > 2  # windows closed while the job ran


# ------------------------------------------------------------------------- idleness
class StallingSource(ep.sources.Source):
    """Split 0: ``N`` events; split 1: 10 events, then no data for ``stall`` seconds of wall
    time (polls say idle), then the end — whose wall time it writes to ``ended`` (so the
    test compares with when the stall really ended, not with a start-up it cannot know).
    Replayable: offsets as in GeneratorSource."""

    def __init__(self, stall: float, ended: str):
        self.stall, self.ended = stall, ended

    def splits(self):
        return [0, 1]

    def create_reader(self, splits, state, *, subtask=0, parallelism=1):
        return _StallingReader(self.stall, self.ended, splits, state)


class _StallingReader(ep.sources.base.SourceReader):
    def __init__(self, stall, ended, splits, state):
        self.split = splits[0]
        self.offset = (state or {}).get(str(self.split), 0)
        self.limit = N if self.split == 0 else 10
        self.stall, self.ended, self.idle_since = stall, ended, None

    def poll(self, max_records):
        if self.offset < self.limit:
            n = min(max_records, self.limit - self.offset)
            records = [event(self.split, i) for i in range(self.offset, self.offset + n)]
            self.offset += n
            return ep.sources.base.Poll(records, finished=self.split == 0 and self.offset >= self.limit)
        if self.idle_since is None:
            self.idle_since = time.monotonic()
        if time.monotonic() - self.idle_since < self.stall:
            time.sleep(0.01)
            return ep.sources.base.Poll([], idle=True)
        if self.split == 1 and not os.path.exists(self.ended):
            with open(self.ended, "w") as f:
                f.write(repr(time.time()))
        return ep.sources.base.Poll([], finished=True)

    def snapshot(self):
        return {str(self.split): self.offset}


def fired_at(key, window, elements):
    yield [len(elements), time.time()]


@pytest.mark.parametrize("idle_timeout", [0.2, None])
def test_an_idle_subtask_stops_holding_event_time_back(tmp_path, idle_timeout):
    """Split 1 sends 10 events and then nothing for 2 s. With ``idle_timeout`` its subtask
    turns idle and split 0's windows fire meanwhile, before split 1 ends; without, none
    fires before split 1's end."""
    out, ended = unique_dir(tmp_path, "out"), str(tmp_path / "split1-ended")
    flow = ep.Dataflow("idle", parallelism=2)
    (flow.source("events", StallingSource(stall=2.0, ended=ended), parallelism=2)
        .with_watermarks("ts", timestamp=lambda e: e[1], max_out_of_orderness=BOUND, idle_timeout=idle_timeout)
        .key_by(lambda e: e[0]).window(Tumbling("2s")).process("win", fired_at)
        .sink("out", FileSink(out)))
    result = _run(flow, tmp_path)
    with open(ended) as f:
        stall_end = float(f.read())
    early = [r for r in read_committed(out) if r["value"][1] < stall_end]
    assert sum(r["value"][0] for r in read_committed(out)) == N + 10
    if idle_timeout:
        assert len(early) > 5, f"no window fired while split 1 was idle ({result.duration_s:.1f} s run)"
    else:
        assert early == []


def test_a_bad_timestamp_fails_naming_operator_and_record_or_becomes_a_dead_letter(tmp_path):
    def flow(dead_letters, out):
        f = ep.Dataflow("badts")
        ts = f.source("in", ep.sources.CollectionSource([("a", 1.0), ("b", "noon"), ("c", 2.0)])) \
            .with_watermarks("ts", timestamp=lambda e: e[1], dead_letters=dead_letters)
        ts.key_by(lambda e: e[0]).window(Tumbling("10s")).aggregate("n", Count()).sink("out", FileSink(out))
        if dead_letters:
            ts.dead_letters().sink("dlq", FileSink(out + "-dlq"))
        return f

    with pytest.raises(ep.JobFailedError, match=r"(?s)operator 'ts'.*'noon'.*expected seconds \(int/float\) or a datetime"):
        _run(flow(False, unique_dir(tmp_path, "o1")), tmp_path, restart=ep.RestartStrategy(max_attempts=3))
    out = unique_dir(tmp_path, "o2")
    _run(flow(True, out), tmp_path)
    assert sorted(r["key"] for r in read_committed(out)) == ["a", "c"]
    assert [d["record"] for d in read_committed(out + "-dlq")] == [["b", "noon"]]


def test_timestamp_units_and_a_unit_mistake(tmp_path):
    """Epoch milliseconds with timestamp_unit="ms" give the same windows as seconds; read
    as seconds they fail at once, naming the operator and the likely unit."""
    def flow(unit, scale, out):
        f = ep.Dataflow(f"units-{unit}")
        (f.source("in", ep.sources.CollectionSource([("a", t * scale) for t in (1_700_000_000.5, 1_700_000_003.0,
                                                                                   1_700_000_011.0)]))
            .with_watermarks("ts", timestamp=lambda e: e[1], timestamp_unit=unit)
            .key_by(lambda e: e[0]).window(Tumbling("10s")).aggregate("n", Count()).sink("out", FileSink(out)))
        return f

    expected = [(1_700_000_000.0, 2), (1_700_000_010.0, 1)]
    for unit, scale in (("s", 1), ("ms", 1000), ("us", 1_000_000)):
        out = unique_dir(tmp_path, unit)
        _run(flow(unit, scale, out), tmp_path)
        assert sorted((r["start"], r["value"]) for r in read_committed(out)) == expected
    with pytest.raises(ep.JobFailedError, match=r"(?s)operator 'ts'.*read as s.*timestamp_unit='ms'"):
        _run(flow("s", 1000, unique_dir(tmp_path, "bad")), tmp_path, restart=ep.RestartStrategy(max_attempts=2))


def test_per_split_watermarks_make_split_skew_harmless(tmp_path):
    """One source subtask reads both splits, 512 events (5 s of event time) of one split per
    poll: a subtask-wide watermark would run 5 s ahead of the other split (with a 1 s bound,
    its records would be late). Per split (``Poll.split``), the subtask's watermark is the
    minimum over its splits: nothing is late, also across a restore and a rescale 1 -> 2."""
    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "c")

    def flow(source_parallelism, rate):
        f = ep.Dataflow("splits", parallelism=2)
        (f.source("events", ep.sources.GeneratorSource(events_of, num_splits=SPLITS, limit=N, records_per_second=rate),
                  parallelism=source_parallelism)
            .with_watermarks("ts", timestamp=lambda e: e[1], max_out_of_orderness=BOUND)
            .key_by(lambda e: e[0]).window(Tumbling("2s")).aggregate("win", SumCount(), parallelism=2)
            .sink("out", FileSink(out)))
        return f

    run_until_checkpoints(flow(1, 2000.0), url, 3, resume=False)
    result = flow(2, None).run(runtime="local", resume=True, faults=[CrashAtRecord("win", record=700, how="exit",
                                                                                  generation=1)],
                               checkpoint=ep.CheckpointConfig(interval=0.05, storage=url))
    assert result.attempts == 2
    assert result.late_dropped == 0
    assert results(out) == pane_oracle(2, 2)


def test_per_partition_watermarks_of_a_log_source(tmp_path):
    """Events of split s are written to partition s of a transactional log; one consumer
    subtask reads both partitions, 512 events (5 s of event time) of one partition per poll.
    Each poll names its partition, so event time is kept per partition: no record is late
    (a subtask-wide watermark would run 5 s ahead of the other partition, 1 s bound), also
    across a crash and restore, and the windows equal the oracle."""
    from epochal.sinks import LogSink
    from epochal.sources import LogSource

    root, out = unique_dir(tmp_path, "log"), unique_dir(tmp_path, "out")
    produce = ep.Dataflow("produce", parallelism=SPLITS)  # subtask s reads split s, writes partition s
    (produce.source("events", ep.sources.GeneratorSource(events_of, num_splits=SPLITS, limit=N))
        .sink("log", LogSink(root, "events", partitions=SPLITS)))
    _run(produce, tmp_path)
    consume = ep.Dataflow("consume", parallelism=2)
    (consume.source("events", LogSource(root, "events"), parallelism=1)
        .with_watermarks("ts", timestamp=lambda e: e[1], max_out_of_orderness=BOUND)
        .key_by(lambda e: e[0]).window(Tumbling("2s")).aggregate("win", SumCount())
        .sink("out", FileSink(out)))
    result = _run(consume, tmp_path, [CrashAtRecord("win", record=1500, how="exit")])
    _fired(result)
    assert result.late_dropped == 0
    assert results(out) == pane_oracle(2, 2)
