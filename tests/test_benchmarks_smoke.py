"""The benchmark scripts still run: smoke mode, local runtime, in a subprocess (as a user would)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
import pytest


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.bench
def test_throughput_smoke(tmp_path):
    out = tmp_path / "throughput.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "throughput.py"), "--smoke", "--runtime", "local",
         "--out", str(out), "--tmp", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert set(doc["modes"]) == {"no-checkpoint", "at-least-once", "exactly-once"}
    assert doc["errors"] == []
    for name, mode in doc["modes"].items():
        assert mode["runs_ok"] == 1, name
        assert mode["records_per_s"]["median"] > 0, name
        assert mode["completed_epochs"]["median"] >= 1, name  # at least the final epoch
    assert doc["modes"]["no-checkpoint"]["ratio_to_baseline"] == 1.0
    full = [r for r in doc["runs"] if r["kind"] == "full"]
    assert {r["records_in"] for r in full} == {doc["config"]["records"]}
    assert len({r["sink_records_in"] for r in full}) == 1  # same pipeline, same output in every mode
    assert doc["machine"]["cpu_count"] >= 1


@pytest.mark.bench
def test_latency_smoke(tmp_path):
    """benchmarks/latency.py --smoke runs end to end (so the script cannot rot)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "latency.json"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "latency.py"
    subprocess.run([sys.executable, str(script), "--smoke", "--runtime", "local", "--out", str(out)],
                   check=True, timeout=240, capture_output=True)
    runs = json.loads(out.read_text())["runs"]
    assert runs and all(r["sink"] == "file" for r in runs)  # --smoke: the exactly-once file sink
    assert all(r["records"] == r["expected"] and r["latency_s"]["p50"] is not None for r in runs)


@pytest.mark.bench
def test_dataplane_smoke(tmp_path):
    """benchmarks/dataplane.py --smoke: epochal pass-through and every raw ceiling, side by side."""
    out = tmp_path / "dataplane.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "dataplane.py"), "--smoke", "--out", str(out), "--tmp", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    variants = {"epochal no-checkpoint", "epochal exactly-once", "epochal tls exactly-once",
                "epochal exactly-once __main__ class", "epochal columnar exactly-once", "pickle", "arrow-py", "arrow",
                "arrow-columnar", "bytes", "generate"}
    assert set(doc["summary"]) == variants
    for name, s in doc["summary"].items():
        assert s["runs_ok"] == 1 and s["records_per_s"]["median"] > 0, name
        assert s["producer_cpu_ns_per_record"] is not None, name
    epochal = [r for r in doc["runs"] if r["variant"].startswith("epochal")]
    for r in epochal:  # every record crossed the one channel between the two task processes, in order
        assert (r["tasks"], r["channels"], r["sibling_processes"]) == (2, 1, 1)
        assert r["received"] == r["records"] and r["bad_stamps"] == 0
        assert r["records"] == doc["calibration"]["records"] or r["records_kind"] == "arrow batches"
        assert r["consumer_cpu_ns_per_record"] > 0
    assert {r["completed_epochs"] >= 1 for r in epochal} == {True}
    ratios = doc["summary"]["epochal no-checkpoint"]["ratio_to"]
    assert set(ratios) == variants - {v for v in variants if v.startswith("epochal")} and all(ratios.values())
    assert {r["variant"]: r["encryption"] for r in epochal}["epochal tls exactly-once"] is True
    assert [r["variant"] for r in epochal if r["main_class_records"]] == ["epochal exactly-once __main__ class"]
    assert doc["summary"]["epochal exactly-once __main__ class"]["ratio_to_exactly_once"] > 0
    from epochal.config import ChannelConfig

    d = ChannelConfig()  # the documented wire settings are the ones epochal really uses by default
    assert doc["epochal_wire"]["channel_config"] == {"batch_size": d.batch_size, "linger_s": d.linger,
                                                     "credits": d.credits}


def test_dataplane_steady_window_and_counting_sink():
    """The steady rate ignores the slow start and end; the counting sink flags out-of-place records."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import dataplane
        import dataplane_sink
    finally:
        sys.path.remove(str(BENCHMARKS))
    # 0..1 s: 10 records (start-up), then 1000 records/s until 1000 records, then a slow tail
    stamps = [(0, 0.0, 0.0), (10, 1.0, 0.5)] + [(10 + 10 * k, 1.0 + 0.01 * k, 0.5 + 0.002 * k) for k in range(1, 100)]
    stamps.append((1010, 5.0, 1.0))
    st = dataplane.steady(stamps)
    assert abs(st["records_per_s"] - 1000.0) < 1e-6
    assert abs(st["cpu_ns_per_record"][0] - 0.2e6) < 1e-3  # 0.002 s CPU per 10 records
    assert dataplane.steady([(0, 0.0), (5, 1.0)])["records_per_s"] is None
    w = dataplane_sink._CountingWriter("/dev/null", every=2)
    w.restore(None)
    for i in (0, 1, 2, 4):  # record 3 is lost: the 4th record written carries id 4
        w.write((i, b""))
    assert (w.n, w.bad, [s[0] for s in w.stamps]) == (4, 1, [2, 4])


@pytest.mark.bench
def test_event_windows_smoke(tmp_path):
    """benchmarks/event_windows.py --smoke: epochal (both modes) and the installed peers, same input,
    every engine's windows equal the oracle, rates and latencies are measured."""
    import importlib.util

    engines = ["epochal-exactly-once", "epochal-no-checkpoint", "epochal-columnar", "epochal-columnar-250ms",
               "spark-ss", "spark-ss-250ms", "spark-ss-backlog"]
    engines += ["bytewax"] if importlib.util.find_spec("bytewax") else []  # the `peers` extra
    out = tmp_path / "event_windows.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "event_windows.py"), "--smoke", "--out", str(out),
                           "--engines", *engines], capture_output=True, text=True, timeout=420, check=False)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    assert set(doc["summary"]) == set(engines)
    for name, s in doc["summary"].items():
        assert s["runs_ok"] == 1 and s["correct"] and s["late_dropped"] == 0, name
        assert s["steady_events_per_s"]["median"] > 0, name
        assert s["fired_to_committed"]["p50"] is not None, name
    for r in doc["runs"]:  # nothing is committed before it fired
        assert r["latency_s"]["fired_to_committed"]["min"] >= -0.01, r["engine"]
    assert doc["summary"]["epochal-exactly-once"]["checkpoint_duration_s"]["n"] >= 1
    assert doc["summary"]["epochal-no-checkpoint"]["ratio_to_no_checkpoint"] == 1.0
    assert "watermark_to_committed" in doc["summary"]["spark-ss"]
    for name in ("epochal-columnar", "epochal-columnar-250ms"):  # issue 25's pairs, per repetition
        versus = doc["summary"][name]["against_spark_ss"]
        assert [len(versus[k]["raw"]) for k in ("steady_events_per_s_ratio", "closable_to_committed_p99_ratio",
                                                 "fired_to_committed_p99_ratio")] == [1, 1, 1], name
    assert [doc["summary"][n]["against_spark_ss"]["latency_peer"] for n in ("epochal-columnar",
                                                                            "epochal-columnar-250ms")] == \
        ["spark-ss", "spark-ss-250ms"]  # latency at equal cadence
    assert doc["runs"][[r["engine"] for r in doc["runs"]].index("spark-ss-backlog")]["micro_batches"] >= 3


def test_event_windows_oracle_catches_lost_and_repeated_windows():
    """The correctness check of event_windows.py: a lost row or a row written twice is an error."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import event_windows
    finally:
        sys.path.remove(str(BENCHMARKS))
    args = event_windows.parse_args(["--smoke", "--out", "/dev/null"])
    oracle = event_windows.Oracle(args)
    assert sum(oracle.per_window.values()) == oracle.events == args.events
    assert oracle.first < oracle.a <= oracle.b  # steady windows exist
    rows = [[k, s, e, v, 1.0 + s / 1e9, 2.0 + s / 1e9, 2.1 + s / 1e9] for (k, s, e, v), n in oracle.rows.items()
            for _ in range(n)]
    raw = {"status": "ok", "rows": rows, "started_at": 0.0}
    good = event_windows.analyse("x", raw, oracle)
    assert good["correct"] and good["steady_events_per_s"] > 0
    assert abs(good["latency_s"]["fired_to_committed"]["p50"] - 1.0) < 1e-6
    for broken in (rows[1:], rows + rows[:1]):
        bad = event_windows.analyse("x", {**raw, "rows": broken}, oracle)
        assert not bad["correct"] and bad["mismatch"]["missing"] + bad["mismatch"]["unexpected"] == 1


@pytest.mark.bench
def test_record_path_smoke(tmp_path):
    """benchmarks/record_path.py --smoke: every stage of the word count's record path, in ns per word."""
    out = tmp_path / "record_path.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "record_path.py"), "--smoke", "--lines", "2000",
                           "--out", str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    tasks = {s["task"] for s in doc["stages"]}
    assert {"source+split", "count+sink", "component"} <= tasks
    assert all(s["ns_per_word"] > 0 for s in doc["stages"])
    assert set(doc["totals_ns_per_word"]) == {"source+split", "count+sink", "both"}


@pytest.mark.bench
def test_kafka_smoke(tmp_path):
    """benchmarks/kafka.py --smoke: every mode moves every record topic to topic, and the
    latency runs see every record (its own Apache Kafka broker)."""
    out = tmp_path / "kafka.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "kafka.py"), "--smoke", "--runtime", "local",
                           "--out", str(out), "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    assert all(m["records_per_s"]["median"] for m in doc["modes"].values())
    assert {r["mode"] for r in doc["latency"]} == {"exactly-once", "at-least-once", "client", "client-transactional",
                                                   "broker", "broker-transactional"}
    assert all(r["seen"] == r["records"] and not r["duplicates"] for r in doc["latency"])


@pytest.mark.bench
def test_kafka_kills_smoke(tmp_path):
    """benchmarks/kafka_kills.py --smoke: one run, one SIGKILL that lands mid-run, recovered
    and exact."""
    out = tmp_path / "kafka_kills.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "kafka_kills.py"), "--smoke", "--runtime", "local",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    assert run["exact"] and run["attempts"] == 2 and len(run["recovery_s"]) == 1


@pytest.mark.bench
def test_postgres_smoke(tmp_path):
    """benchmarks/postgres.py --smoke: every sink mode writes every row once (its own server)."""
    out = tmp_path / "postgres.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "postgres.py"), "--smoke", "--out", str(out),
                           "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == [] and all(m["records_per_s"]["median"] for m in doc["modes"].values())


@pytest.mark.bench
def test_tables_smoke(tmp_path):
    """benchmarks/tables.py --smoke: FileSink, DeltaSink and IcebergSink each write every row
    exactly once (read back with each system's own reader), records and columnar."""
    out = tmp_path / "tables.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "tables.py"), "--smoke", "--runtime", "local",
                           "--out", str(out), "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    assert set(doc["sinks"]) == {f"{k}/{s}" for k in ("filesink-parquet", "delta", "iceberg")
                                 for s in ("records", "columnar")}
    assert all(r["output_rows"] == r["rows"] and r["rows_per_s"] > 0 for r in doc["runs"])


@pytest.mark.bench
def test_queryable_smoke(tmp_path):
    """benchmarks/queryable.py --smoke: lookups against a running job on both backends, and
    on RocksDB with the query sidecar."""
    out = tmp_path / "queryable.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "queryable.py"), "--smoke", "--out", str(out),
                           "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == [] and [r["backend"] for r in doc["runs"]] == ["heap", "rocksdb", "rocksdb-sidecar"]
    for run in doc["runs"]:
        assert [w["mode"] for w in run["windows"]] == ["no-queries", "read-committed", "no-queries",
                                                       "read-uncommitted", "no-queries"]
        for w in run["windows"]:
            if w["mode"] != "no-queries":
                assert w["lookups"] > 0 and w["latency_ms"]["p99"] > 0 and w["side_by_side_ratio"] > 0
        assert set(run["ratios"]) == {"read-committed", "read-uncommitted", "no-queries"}
        assert run["last_epoch_read"] >= 1


@pytest.mark.bench
def test_iceberg_contention_smoke(tmp_path):
    """benchmarks/iceberg_contention.py --smoke: 4 writer processes commit 2 epochs at once."""
    out = tmp_path / "iceberg_contention.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "iceberg_contention.py"), "--smoke", "--out", str(out),
                           "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["mode"] for r in runs] == ["backoff", "no-backoff"]
    assert all(r["exactly_once"] and r["commits"] == 8 and r["attempts"]["max"] >= 1 for r in runs)


@pytest.mark.bench
def test_delta_contention_smoke(tmp_path):
    """benchmarks/delta_contention.py --smoke: 4 writer processes commit 2 epochs at once."""
    out = tmp_path / "delta_contention.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "delta_contention.py"), "--smoke", "--out", str(out),
                           "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["mode"] for r in runs] == ["backoff", "no-backoff"]
    assert all(r["exactly_once"] and r["commits"] == 8 and r["attempts"]["max"] >= 1 for r in runs)
