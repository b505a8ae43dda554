"""``window(...).aggregate(..., checkpoints=ep.Eventual(...))``: the build-time checks, the CEC
operator as a source of the job (its reader crashed and recreated at an epoch's position, its
log torn), and a job on embedded Spark whose CEC task is SIGKILLed from outside — each against
a plain-Python oracle of the windows' sums."""
from __future__ import annotations

import collections
import glob
import json
import os
import signal
import sys
import threading
import time

import cloudpickle
import pytest

import epochal as ep
from epochal.errors import PipelineDefinitionError
from epochal.sinks.file_formats import read_committed
from epochal.windows import Session, Sliding, Sum, Tumbling

pytest_plugins = ["s3server"]  # fixtures s3_server, s3_env

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # its functions run in the tasks

WINDOWS = {"tumbling": Tumbling("0.5s"), "sliding": Sliding("1s", "0.25s"), "session": Session("0.3s")}


# ------------------------------------------------------------------ the input and its oracle
def tuples(n: int) -> list:
    """``(key, seconds, value)`` in timestamp order, ties included: hot keys k0..k5, and a rare
    key whose windows stay open long (the seed's slow windows), with gaps that end sessions."""
    out = []
    for i in range(n):
        key = "rare" if i % 97 == 0 else f"k{i % 6}"
        out.append((key, (i // 2) * 0.01 + (i // 400) * 0.5, i % 13))
    return out


def oracle(items: list, assigner) -> collections.Counter:
    """Every window's ``(key, start, end, sum)``, in plain Python."""
    sums: dict = collections.defaultdict(int)
    if isinstance(assigner, Session):  # in µs, as the operator keeps time
        gap, last, opened, ends = assigner.gap, {}, {}, {}
        for key, ts, v in items:
            us = round(ts * 1e6)
            if key not in last or us - last[key] >= gap:
                opened[key] = us
            last[key] = us
            sums[(key, opened[key])] += v
            ends[(key, opened[key])] = us + gap
        return collections.Counter(json.dumps([k, s / 1e6, ends[(k, s)] / 1e6, v]) for (k, s), v in sums.items())
    size = assigner.size / 1e6
    slide = getattr(assigner, "slide", assigner.size) / 1e6
    for key, ts, v in items:
        us = round(ts * 1e6)
        last = us - us % round(slide * 1e6)
        for start in range(last - round(size * 1e6) + round(slide * 1e6), last + 1, round(slide * 1e6)):
            sums[(key, start / 1e6)] += v
    return collections.Counter(json.dumps([k, s, s + size, v]) for (k, s), v in sums.items())


def canon(results) -> collections.Counter:
    return collections.Counter(json.dumps([r[0], r[1], r[2], r[3]]) for r in results)


def canon_rows(rows) -> collections.Counter:
    return collections.Counter(json.dumps([r["key"], r["start"], r["end"], r["value"]]) for r in rows)


def job(name: str, items: list, assigner, *, storage: str | None = None, flush_every: int = 40,
        parallelism: int = 2, timestamp=lambda r: r[1]):
    flow = ep.Dataflow(name)
    results = (flow.source("in", ep.sources.CollectionSource(items))
                   .with_watermarks("ts", timestamp=timestamp)
                   .key_by(lambda r: r[0])
                   .window(assigner)
                   .aggregate("sums", Sum(lambda r: r[2]), parallelism=parallelism,
                              checkpoints=ep.Eventual(budget=0.05, max_extent="1s", flush_every=flush_every,
                                                      storage=storage)))
    return flow, results


def drain(reader, out: list, polls: int | None = None) -> bool:
    for _ in range(polls if polls is not None else 10**9):
        poll = reader.poll(7)
        out += poll.records
        if poll.finished:
            return True
    return False


def recoveries(log_root: str) -> list[dict]:
    return [json.load(open(p)) for p in sorted(glob.glob(f"{log_root}/*/recovery-*.json"))]


def crash_and_restart(storage: str, items: list, assigner, splits=(0, 1), polls=(25, 20)):
    """Run a reader ``polls[0]`` polls, take an epoch's snapshot, run ``polls[1]`` polls more and lose it (no close,
    nothing flushed after); a new reader continues from the snapshot. Returns ``(results handed
    over before the epoch + by the new reader, windows open at the crash)``."""
    _, results = job("r", items, assigner, storage=storage, parallelism=len(splits))
    src = results.flow.nodes["sums"].payload
    first = src.create_reader(list(splits), None)
    before: list = []
    assert not drain(first, before, polls=polls[0])
    epoch = first.snapshot()  # the barrier: `before` is in the epoch, nothing later is
    assert not drain(first, [], polls=polls[1]), "the crash must land mid-run"
    open_at_crash = sum(m["open_windows"] for m in first.metrics().values())
    del first  # SIGKILL: no close
    second = src.create_reader(list(splits), epoch)
    rest: list = []
    assert drain(second, rest)
    return before + rest, open_at_crash, epoch


# ------------------------------------------------------------------ build time
def test_build_makes_one_source_named_after_the_window():
    flow, results = job("b", tuples(10), Tumbling("1s"))
    assert sorted(flow.nodes) == ["sums"]
    assert flow.nodes["sums"].payload.name == "eventual window 'sums'"
    results.sink("out", ep.sinks.FileSink("/tmp/never-written"))
    assert sorted(flow.nodes) == ["out", "sums"]


@pytest.mark.parametrize("case, match", [
    ("map", r"window 'w': map 'm' has dead_letters=True"),
    ("generator", r"window 'w': source 'in' \(GeneratorSource\) cannot be replayed from an event-time position"),
    ("processing", r"window 'w'.*processing time"),
    ("lateness", r"window 'w'.*allowed_lateness"),
    ("columnar", r"window 'w'.*on records.*to_records"),
    ("budget", r"eventual checkpoints: budget must be a fraction"),
    ("offset", r"window 'w'.*offset"),
])
def test_unsupported_is_refused_at_build_naming_the_operator(case, match):
    flow = ep.Dataflow("refuse")
    if case == "generator":
        src = flow.source("in", ep.sources.GeneratorSource(lambda split, offset: iter([])))
    elif case == "columnar":
        import pyarrow as pa

        schema = pa.schema([("k", pa.string()), ("t", pa.float64()), ("v", pa.int64())])
        src = flow.source("in", ep.sources.CollectionSource([pa.record_batch([["a"], [1.0], [1]], schema=schema)],
                                                              schema=schema))
    else:
        src = flow.source("in", ep.sources.CollectionSource(tuples(5)))
    stream = src.map("m", lambda r: r, dead_letters=True) if case == "map" else src
    if case == "columnar":
        keyed = stream.with_watermarks("ts", timestamp="t").key_by("k")
    else:
        keyed = stream.with_watermarks("ts", timestamp=lambda r: r[1]).key_by(lambda r: r[0])
    assigner = {"processing": Tumbling("1s", processing_time=True), "offset": Tumbling("1s", "0.5s")}.get(
        case, Tumbling("1s"))
    windowed = keyed.window(assigner, **({"allowed_lateness": "1s"} if case == "lateness" else {}))
    with pytest.raises((PipelineDefinitionError, ep.ConfigError), match=match):
        if case == "budget":
            windowed.aggregate("w", Sum(), checkpoints=ep.Eventual(budget=1.5))
        windowed.aggregate("w", **({} if case == "columnar" else {"function": Sum()}), checkpoints=ep.Eventual())


# ------------------------------------------------------------------ the input, replayed after T
@pytest.mark.parametrize("splits", [1, 3, 7])
def test_a_collection_replays_after_a_position_by_seeking(splits):
    """Replay after T seeks a CollectionSource to the record after T (recovery reads the extent,
    not the input from its start): the same records at the same positions as reading it all
    and skipping, at any cut, with ties of timestamps and any number of splits."""
    from epochal.eventual.source import ReadAll

    items = [(i, i // 3) for i in range(100)]
    replay = ReadAll(ep.sources.CollectionSource(items, num_splits=splits), lambda r: r[1], "window 'w'")
    everything = list(replay.read_after(None))
    assert [p.seq for _, p in everything] == list(range(100))
    for cut in (0, 5, 33, 34, 98, 99):
        assert list(replay.read_after(everything[cut][1])) == everything[cut + 1:]


# ------------------------------------------------------------------ the reader, crashed at an epoch position
@pytest.mark.parametrize("kind", sorted(WINDOWS))
def test_reader_restarted_at_an_epoch_position_hands_over_each_result_once(tmp_path, kind):
    """An epoch's snapshot of the source holds only a queue position. The reader runs on past
    it, then is lost (a crash: nothing of it is closed or flushed); a new reader at that
    position rebuilds the operators from their logs (footprints, not a snapshot) and hands
    over the rest: the results before the epoch plus the new reader's equal the oracle."""
    items, assigner = tuples(3000), WINDOWS[kind]
    handed, open_at_crash, epoch = crash_and_restart(str(tmp_path), items, assigner)
    assert canon(handed) == oracle(items, assigner)
    reports = recoveries(f"{tmp_path}/eventual/sums")
    crashed = [r for r in reports if r["tc"] is not None]
    assert len(crashed) == 2 and sum(r["n"] for r in crashed) == open_at_crash > 0
    assert all(r["extent"] >= r["n"] and r["position"] == epoch[str(i)] for i, r in enumerate(crashed))


def test_the_output_queue_on_s3_recovers_the_same(s3_env):
    """The logs in S3 (moto on loopback): the same crash and restart, the same results."""
    import fsspec

    url = s3_env.fresh_url("eventual")
    items, assigner = tuples(1500), WINDOWS["tumbling"]
    handed, open_at_crash, _ = crash_and_restart(url, items, assigner, polls=(10, 8))
    assert canon(handed) == oracle(items, assigner)
    fs, root = fsspec.core.url_to_fs(url)
    assert fs.glob(f"{root}/eventual/sums/0/seg-*.ecl") and open_at_crash > 0
    reports = [json.loads(fs.cat_file(p)) for p in sorted(fs.glob(f"{root}/eventual/sums/*/recovery-*.json"))]
    assert sum(r["n"] for r in reports if r["tc"] is not None) == open_at_crash


def test_a_new_run_starts_its_logs_over_and_a_rescale_is_refused(tmp_path):
    """A first attempt that restores no epoch is a new run: the logs of an earlier run in the
    same storage are not recovered from (its results would be handed over again). Logs written
    by 2 splits refuse a job of 3, naming the operator."""
    assigner = WINDOWS["tumbling"]
    for n in (650, 900):  # the second run reads more (650 ends mid-window): its output is not the first run's
        items = tuples(n)
        _, results = job("again", items, assigner)
        reader = results.flow.nodes["sums"].payload.create_reader([0, 1], None)
        reader.bind_storage(str(tmp_path), "again", generation=0)
        out: list = []
        assert drain(reader, out)
        assert canon(out) == oracle(items, assigner)
    _, results = job("again", items, assigner, parallelism=3)
    reader = results.flow.nodes["sums"].payload.create_reader([0], {"0": [1, 0, 0]})
    reader.bind_storage(str(tmp_path), "again", generation=1)
    with pytest.raises(ep.ConfigError, match=r"eventual window 'sums'.*written by 2 splits.*now has 3"):
        reader.poll(7)


def test_a_torn_newest_segment_recovers_from_the_previous_footprints(tmp_path):
    """The crash tore the segment being written: recovery drops the torn frame (fingerprint) and
    recovers from the footprints before it; the handed-over results still equal the oracle."""
    items, assigner = tuples(2000), WINDOWS["tumbling"]
    _, results = job("torn", items, assigner, storage=str(tmp_path), parallelism=1)
    src = results.flow.nodes["sums"].payload
    first = src.create_reader([0], None)
    before: list = []
    assert not drain(first, before, polls=10)
    epoch = first.snapshot()
    assert not drain(first, [], polls=10)
    del first
    segments = sorted(glob.glob(f"{tmp_path}/eventual/sums/0/seg-*.ecl"))
    newest = segments[-1]
    size = os.path.getsize(newest)
    with open(newest, "r+b") as f:
        f.truncate(size - 5)  # mid-frame
    second = src.create_reader([0], epoch)
    rest: list = []
    assert drain(second, rest)
    assert second._splits[0].log.torn_frames >= 1, "the torn frame was not seen"
    assert canon(before + rest) == oracle(items, assigner)


# ------------------------------------------------------------------ in a job
def test_a_job_on_the_local_runtime_commits_the_oracle(tmp_path):
    """Through the engine (the task binds the job's checkpoint storage; the sink commits per
    epoch what the CEC source handed over), failure-free: sliding windows, two splits. ~3 s."""
    items, assigner = tuples(1500), WINDOWS["sliding"]
    flow, results = job("loc", items, assigner, flush_every=100)
    out = str(tmp_path / "out")
    results.sink("out", ep.sinks.FileSink(out, format="jsonl"))
    result = flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/ckpt"))
    assert result.attempts == 1
    assert canon_rows(read_committed(out)) == oracle(items, assigner)
    assert len(recoveries(f"{tmp_path}/ckpt/loc/eventual/sums")) == 2  # one fresh start per split, in the storage


def test_a_jobs_metrics_and_dashboard_show_the_windows_the_extent_and_footprints(tmp_path):
    """The CEC reader's gauges reach the progress events (``handle.metrics()``, the listener)
    and the operator's dashboard page. Plain-Python bounds from the input: while the job runs,
    1..(distinct keys) tumbling windows are open (one per key at a time), the extent lag is
    within ``max_extent`` (1 s) and the input's event-time span, and footprints are written at
    some rate; at the end every window is closed and at least one footprint (its Gopen) was
    written per window of the oracle. Failed with the task's ``"reader"`` report removed (no
    gauges in any event). ~3 s."""
    from epochal.epochs.history import EpochHistory
    from epochal.ui.model import DashboardModel

    items, assigner = tuples(3000), WINDOWS["tumbling"]
    flow, results = job("gauges", items, assigner, flush_every=100, timestamp=Throttle(str(tmp_path)))
    out = str(tmp_path / "out")
    results.sink("out", ep.sinks.FileSink(out, format="jsonl"))
    events: list = []
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/c"),
                        metrics=ep.MetricsConfig(interval=0.05, listener=events.append, status=False, log=False))
    result = handle.wait(120)
    final = handle.metrics()
    assert result.attempts == 1 and canon_rows(read_committed(out)) == oracle(items, assigner)
    expected = oracle(items, assigner)
    keys, span = len({k for k, _, _ in items}), items[-1][1] - items[0][1]
    running = [e for e in events if e["state"] == "running"
               and (e["operators"].get("sums", {}).get("reader") or {}).get("open_windows")]
    assert running, f"none of {len(events)} progress events while running showed open windows"
    for e in running:
        g = e["operators"]["sums"]["reader"]
        assert 0 < g["open_windows"] <= keys and 0 <= g["extent_lag_s"] < min(1.0, span), g
        tasks = [t["reader"] for t in e["tasks"].values() if t.get("reader")]
        assert 1 <= len(tasks) <= 2 and sum(t["open_windows"] for t in tasks) == g["open_windows"]  # a task per split
    assert any(e["operators"]["sums"]["reader"]["footprints_per_s"] > 0 for e in running)
    done = final["operators"]["sums"]["reader"]
    assert done["open_windows"] == 0 and done["extent_lag_s"] == 0 and done["footprints"] >= len(expected) > 0, done
    page = DashboardModel(flow.plan(), lambda: {"state": "running", "generation": 0, "history": EpochHistory(4)},
                          lambda: running[-1]).view()["operators"]["sums"]
    assert page["reader"]["open_windows"] == running[-1]["operators"]["sums"]["reader"]["open_windows"]
    assert sorted(r["subtask"] for r in page["subtasks"] if r.get("reader")) == [0, 1]
    prometheus = pytest.importorskip("prometheus_client")
    from epochal.metrics.prometheus import _Collector

    registry = prometheus.CollectorRegistry()
    registry.register(_Collector(type("Newest", (), {"latest": running[-1]})()))
    text = prometheus.generate_latest(registry).decode()
    assert f'epochal_operator_open_windows{{job="gauges",operator="sums"}} {float(page["reader"]["open_windows"])}' \
        in text and 'epochal_operator_extent_lag_seconds{job="gauges",operator="sums"}' in text


def test_a_signed_job_signs_its_logs_and_refuses_a_frame_planted_without_the_key(tmp_path):
    """With ``signing_key``, the tasks sign every log frame with the key derived for task logs
    (``AttemptSpec.log_key``, never the signing key itself): the logs read back with it, and a
    reader without it (what someone who can only write the storage has) is refused before any
    frame is unpickled. Failed before the attempt carried the key (frames unkeyed)."""
    from epochal.backends.signing import derived_key
    from epochal.errors import CheckpointStorageError
    from epochal.eventual.log import OutputLog

    key = b"k" * 32
    items, assigner = tuples(600), WINDOWS["tumbling"]
    flow, results = job("sig", items, assigner, flush_every=100)
    out = str(tmp_path / "out")
    results.sink("out", ep.sinks.FileSink(out, format="jsonl"))
    flow.run(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/ckpt",
                                                              signing_key=key))
    assert canon_rows(read_committed(out)) == oracle(items, assigner)
    split = f"file://{tmp_path}/ckpt/sig/eventual/sums/0"
    signed = OutputLog(split, key=derived_key(key, "task-logs"))
    assert signed.segments() and sum(len(signed.read_segment(s)) for s in signed.segments()) > 0
    with pytest.raises(CheckpointStorageError, match="corrupt"):
        unkeyed = OutputLog(split)
        unkeyed.read_segment(unkeyed.segments()[0])


# ------------------------------------------------------------------ on embedded Spark, SIGKILLed from outside
class Throttle:
    """The input's timestamp function in the CEC task: leaves the task's pid in ``pid_dir`` and
    paces the input (≈ 1 ms per 4 records) so the job is still running when the kill lands."""

    def __init__(self, pid_dir: str):
        self.pid_dir, self.n = pid_dir, 0

    def __call__(self, r):
        self.n += 1
        if self.n == 1:
            open(os.path.join(self.pid_dir, str(os.getpid())), "w").close()
        if self.n % 4 == 0:
            time.sleep(0.001)
        return r[1]


@pytest.mark.slow
def test_sigkilled_cec_task_on_spark_recovers_from_footprints(tmp_path, spark):
    """A job ``source → with_watermarks → key_by → window(Tumbling).aggregate(checkpoints=
    Eventual) → FileSink`` on embedded Spark. The CEC task's process is SIGKILLed from outside
    once an epoch completed and while the job runs; the committed output equals the oracle,
    and the new attempt recovered its windows from footprints in the log (its epoch state was
    only a queue position)."""
    items, assigner = tuples(6000), WINDOWS["tumbling"]
    pids, out = tmp_path / "pids", str(tmp_path / "out")
    pids.mkdir()
    url = f"file://{tmp_path}/ckpt"
    flow, results = job("cec", items, assigner, flush_every=100, timestamp=Throttle(str(pids)))
    results.sink("out", ep.sinks.FileSink(out, format="jsonl"))
    handle = flow.start(spark=spark, checkpoint=ep.CheckpointConfig(interval=0.2, storage=url))
    killed: list = []

    def kill():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and handle.running and not (len(handle.completed_epochs) >= 2
                                                                       and os.listdir(pids)):
            time.sleep(0.01)
        for name in sorted(os.listdir(pids)):
            if handle.running:
                try:
                    os.kill(int(name), signal.SIGKILL)
                    killed.append((int(name), time.monotonic()))
                    return
                except ProcessLookupError:
                    continue

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    result = handle.wait(300)
    killer.join()
    assert killed and result.attempts >= 2, f"the SIGKILL {killed} caused no restart: {result.failures}"
    assert canon_rows(read_committed(out)) == oracle(items, assigner)
    reports = recoveries(f"{tmp_path}/ckpt/cec/eventual/sums")
    recovered = [r for r in reports if r["tc"] is not None]
    assert recovered and any(r["n"] > 0 and r["extent"] >= r["n"] and r["position"][0] > 0 for r in recovered), \
        f"no recovery from footprints after an epoch's position: {reports}"
    end = round(items[-1][1] * 1e6)
    assert all(r["tc"][0] < end for r in recovered), f"the kill landed after the input's end: {recovered}"
