"""Live metrics: JobHandle.metrics(), progress events to a listener, Prometheus, the
terminal status line — checked against what the job is known to do."""
from __future__ import annotations

import time
import urllib.request

import pytest

import epochal as ep
from epochal.metrics.progress import percentile, status_line
from epochal.sinks import FileSink
from epochal.testing import CrashAtRecord

from pipelines import unique_dir

N = 4000


def numbers(split, offset):
    return ((split, i, float(i) / 100) for i in range(offset, N))


def slow(r):
    end = time.perf_counter() + 0.0003
    while time.perf_counter() < end:
        pass
    return r


def flow(name, out, rate=4000.0):
    f = ep.Dataflow(name, parallelism=2)
    (f.source("nums", ep.sources.GeneratorSource(numbers, num_splits=2, limit=N, records_per_second=rate))
        .with_watermarks("ts", timestamp=lambda r: r[2])
        .key_by(lambda r: r[1] % 10).map("slow", slow)
        .sink("out", FileSink(out)))
    return f


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 50) == 2 and percentile(list(range(1, 101)), 99) == 99


def test_metrics_while_running_and_progress_events(tmp_path):
    events = []
    handle = flow("live", unique_dir(tmp_path, "out")).start(
        runtime="local", metrics=ep.MetricsConfig(interval=0.2, listener=events.append),
        checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + unique_dir(tmp_path, "c")))
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = handle.metrics()
        seen.append(m)
        if m["state"] == "running" and m["last_completed_epoch"] and m["records_in_per_s"] > 0 and \
                any(t["watermark"] for t in m["tasks"].values()):
            break
        time.sleep(0.1)
    result = handle.wait(60)
    live = seen[-1]
    assert live["state"] == "running" and live["records_in_per_s"] > 0, live
    assert set(live["tasks"]) == {t.id for t in flow("x", "/tmp/x").plan().tasks}
    assert live["checkpoints"]["duration_s"]["p50"] is not None
    assert {"nums", "ts", "slow", "out"} <= set(live["operators"])
    assert live["tasks"]["slow[0]"]["backpressure_ratio"] >= 0.0
    # the listener got numbered events, the last one the final state with every record counted
    assert [e["sequence"] for e in events] == sorted(e["sequence"] for e in events)
    final = events[-1]
    assert final["state"] == "finished"
    assert sum(t["records_in"] for name, t in final["tasks"].items() if name.startswith("nums")) == 2 * N
    assert final["operators"]["out"]["records_in"] == 2 * N == result.records_in
    assert final["last_completed_epoch"] == result.completed_epochs[-1]["epoch"]
    # CPU seconds per task: "slow" spins 0.3 ms on each of 2N records (2.4 CPU-s, less only
    # while descheduled mid-spin); the sources sleep to their rate
    slow_cpu = [result.task_metrics[f"slow[{i}]"]["cpu_s"] for i in range(2)]
    assert 1.2 < sum(slow_cpu) < 10 and all(final["tasks"][f"slow[{i}]"]["cpu_s"] <= c for i, c in enumerate(slow_cpu))
    assert max(result.task_metrics[f"nums[{i}]"]["cpu_s"] for i in range(2)) < sum(slow_cpu) / 2, result.task_metrics
    loads = [t["cpu_load"] for e in events for t in e["tasks"].values() if t.get("cpu_load") is not None]
    assert loads and max(loads) > 0.1 and all(0 <= x < 4 for x in loads), loads


def test_restarts_and_their_causes_are_reported(tmp_path):
    events = []
    result = flow("restarts", unique_dir(tmp_path, "out")).run(
        runtime="local", metrics=ep.MetricsConfig(interval=0.1, listener=events.append),
        faults=[CrashAtRecord("slow", subtask=0, record=500)],
        checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.attempts == 2
    final = events[-1]
    assert final["attempt"] == 1 and len(final["restarts"]) == 1
    assert "injected CrashAtRecord" in final["restarts"][0]["cause"]


def test_prometheus_endpoint_serves_the_progress(tmp_path):
    pytest.importorskip("prometheus_client")
    handle = flow("prom", unique_dir(tmp_path, "out"), rate=2000.0).start(
        runtime="local", metrics=ep.MetricsConfig(interval=0.2, prometheus_port=0),
        checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + unique_dir(tmp_path, "c")))
    host, port = handle.prometheus_address
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline and 'epochal_last_completed_epoch{job="prom"}' not in text:
        time.sleep(0.3)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    handle.wait(60)
    assert 'epochal_up{job="prom"} 1.0' in text
    assert 'epochal_task_records_in_per_second{job="prom",task="slow[1]"}' in text
    assert 'epochal_operator_records_out_per_second{job="prom",operator="ts"}' in text
    assert 'epochal_task_cpu_seconds_total{job="prom",task="slow[1]"}' in text
    assert 'epochal_task_cpu_load{job="prom",task="slow[0]"}' in text


def test_run_shows_a_status_line_when_asked(tmp_path, capsys):
    flow("status", unique_dir(tmp_path, "out"), rate=3000.0).run(
        runtime="local", metrics=ep.MetricsConfig(interval=0.2, status=True),
        checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + unique_dir(tmp_path, "c")))
    err = capsys.readouterr().err
    assert "\rstatus | running | " in err and "rec/s in" in err and err.endswith("\n")


def test_status_line_text():
    p = {"job": "j", "state": "running", "attempt": 1, "records_in_per_s": 45_200.0, "records_out_per_s": 12.0,
         "last_completed_epoch": 7, "last_checkpoint_age_s": 0.4, "checkpoints": {"duration_s": {"last": 0.035}},
         "watermark": 0.0}
    assert status_line(p) == "j | running | attempt 2 | 45.2k rec/s in, 12 out | epoch 7 0.4s ago (35 ms) | event time 00:00:00"


def test_bad_metrics_config_is_refused():
    with pytest.raises(ep.ConfigError, match="metrics.interval"):
        ep.MetricsConfig(interval=0)
    with pytest.raises(ep.ConfigError, match="metrics.listener"):
        ep.MetricsConfig(listener="print")
