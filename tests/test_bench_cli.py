"""`epochal bench` and the benchmark report: smoke runs in subprocesses, as a user would run them.

No peer engine is needed: the chain benchmark runs on the local runtime, and the report is
generated from the JSON results checked into benchmarks/results/.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)
    assert proc.returncode == 0, f"{cmd}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # the `bench` extra is not installed: reports are written without plots
        return False
    return True


@pytest.mark.bench
def test_bench_chain_smoke_through_the_cli(tmp_path):
    """`epochal bench chain --smoke` runs the chain benchmark, then the report, into --results."""
    proc = _run([sys.executable, "-m", "epochal.cli", "bench", "chain", "--smoke", "--runtime", "local",
                 "--results", str(tmp_path), "--", "--ops", "1", "--layouts", "chained"], timeout=60)
    assert "finished with exit code 0" in proc.stdout  # the progress display
    doc = json.loads((tmp_path / "chain.json").read_text())
    assert doc["errors"] == []
    cells = {(r["mode"], r["interval_s"]) for r in doc["summary"]}
    assert cells == {("no-checkpoint", None), ("at-least-once", 0.5), ("exactly-once", 0.5)}
    base = next(r for r in doc["summary"] if r["mode"] == "no-checkpoint")
    assert base["steady_ratio"] == pytest.approx(1.0) and base["steady_records_per_s"] > 0
    if _has_matplotlib():
        assert (tmp_path / "chain.png").stat().st_size > 0
    section = (tmp_path / "README_SECTION.md").read_text()
    assert section.startswith("## Results") and "Stateless chain" in section


@pytest.mark.bench
def test_bench_dataplane_smoke_through_the_cli(tmp_path):
    """`epochal bench dataplane --smoke` (two variants) writes the JSON, the plot and its report section."""
    proc = _run([sys.executable, "-m", "epochal.cli", "bench", "dataplane", "--smoke", "--results", str(tmp_path),
                 "--", "--variants", "epochal no-checkpoint", "pickle"], timeout=90)
    assert "finished with exit code 0" in proc.stdout
    doc = json.loads((tmp_path / "dataplane.json").read_text())
    assert doc["errors"] == [] and set(doc["summary"]) == {"epochal no-checkpoint", "pickle"}
    assert doc["summary"]["epochal no-checkpoint"]["ratio_to"]["pickle"] > 0
    if _has_matplotlib():
        assert (tmp_path / "dataplane.png").stat().st_size > 0
    assert "### The data plane against its ceiling" in (tmp_path / "README_SECTION.md").read_text()
@pytest.mark.bench
def test_bench_alignment_smoke_through_the_cli(tmp_path):
    """`epochal bench alignment --smoke`: every (parallelism, guarantee) cell measured, report section."""
    _run([sys.executable, "-m", "epochal.cli", "bench", "alignment", "--smoke", "--results", str(tmp_path),
          "--", "--tmp", str(tmp_path)], timeout=90)
    doc = json.loads((tmp_path / "alignment.json").read_text())
    assert doc["errors"] == []
    cells = {(c["parallelism"], c["guarantee"]): c for c in doc["summary"]}
    assert set(cells) == {(p, g) for p in (1, 2) for g in ("exactly-once", "at-least-once")}
    for c in cells.values():
        assert c["runs_ok"] == 1 and c["periodic_epochs"] >= 2
        assert 0 < c["checkpoint_s"]["p50"] <= c["checkpoint_s"]["p99"]
        assert set(c["by_operator"]) == {"lines", "count", "bucket", "out"}
        assert sum(c["critical_operator"].values()) == pytest.approx(1.0)
        assert c["tasks"] == 4 * c["parallelism"]
    # sources have no inputs: nothing to align
    assert cells[(2, "exactly-once")]["by_operator"]["lines"]["alignment_s"]["max"] == 0.0
    runs = doc["runs"]
    assert {r["records_in"] for r in runs} == {doc["config"]["lines"]}
    if _has_matplotlib():
        assert (tmp_path / "alignment.png").stat().st_size > 0
    assert "### Alignment and checkpoint duration vs parallelism" in (tmp_path / "README_SECTION.md").read_text()


@pytest.mark.bench
def test_bench_recovery_smoke_through_the_cli(tmp_path):
    """`epochal bench recovery --smoke`: a crash per cell, restored from a checkpoint, output equal."""
    _run([sys.executable, "-m", "epochal.cli", "bench", "recovery", "--smoke", "--results", str(tmp_path),
          "--", "--sizes", "1", "--tmp", str(tmp_path)], timeout=90)
    doc = json.loads((tmp_path / "recovery.json").read_text())
    assert doc["errors"] == []
    assert {(c["size_mb"], c["backend"]) for c in doc["summary"]} == {(1, "heap"), (1, "rocksdb")}
    for c in doc["summary"]:
        assert c["runs_ok"] == 1 and c["outputs_equal"] is True
        assert c["restored_mb"]["median"] > 0.9  # the 1,024 values load in milliseconds, before epoch 1
        parts = sum(c["parts_p50_s"].values())
        assert c["recovery_s"]["median"] == pytest.approx(parts)
    crash = [r for r in doc["runs"] if r["kind"] == "crash"]
    assert all(r["attempts"] == 2 and r["restored_epoch"] >= 1 for r in crash)
    assert all("store[0]" in r["cause"] for r in crash)
    if _has_matplotlib():
        assert (tmp_path / "recovery.png").stat().st_size > 0
    assert "### Recovery time after a crash" in (tmp_path / "README_SECTION.md").read_text()


def test_chain_unchained_layout_has_a_task_per_operator():
    """The unchained layout forbids chaining: N maps + source + sink = N + 2 tasks."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import chain
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert len(chain.chain_job("c", "/unused", 4, "chained", 10, 2).plan().tasks) == 1
    assert len(chain.chain_job("u", "/unused", 4, "unchained", 10, 2).plan().tasks) == 6


def test_report_from_the_checked_in_results(tmp_path):
    """report.py turns the results JSON into README_SECTION.md and one PNG per benchmark."""
    results = tmp_path / "results"
    shutil.copytree(BENCHMARKS / "results", results, ignore=shutil.ignore_patterns("*.png", "*.md"))
    titles = {"throughput": "### Throughput", "latency": "### End-to-end latency", "chain": "### Stateless chain",
              "alignment": "### Alignment", "recovery": "### Recovery", "state": "### State backends at scale",
              "window": "### Large-state sliding window", "loops": "### Checkpointed loops",
              "event_windows": "### Event-time windows against other engines",
              "peers": "### The same word count", "dataplane": "### The data plane against its ceiling",
              "chain_intervals": "### Stateless chain vs checkpoint interval", "state_stress": "### State backends at scale",
              "serde": "### Records of classes from `__main__`", "backpressure": "### Checkpoints under back-pressure",
              "cluster": "### On a two-host Spark cluster", "coldstart": "### Cold start"}
    present = [n for n in titles if (results / f"{n}.json").exists()]
    assert present, "no benchmark results checked in"
    _run([sys.executable, str(BENCHMARKS / "report.py"), "--results", str(results)], timeout=60)
    section = (results / "README_SECTION.md").read_text()
    assert section.startswith("## Results")
    assert "cores" in section  # the machine description
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import report
    finally:
        sys.path.remove(str(BENCHMARKS))
    for name in [n for n in present if n in report.PLOTS] if _has_matplotlib() else []:
        assert (results / f"{name}.png").stat().st_size > 0, name
    for name in present:
        assert titles[name] in section, name


def test_peer_runners_use_the_test_suites_lines():
    """Every benchmark counts the same input as tests/pipelines.py: ``workload.line`` (used by
    the epochal benchmark scripts) and peer_runners' deliberate stdlib-only copy."""
    import pipelines  # tests/ is on sys.path (conftest)

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import peer_runners
        import workload
    finally:
        sys.path.remove(str(BENCHMARKS))
    for copy in (peer_runners.line, workload.line):
        assert all(copy(s, i) == pipelines.line(s, i) for s in range(4) for i in range(500))



@pytest.mark.spark
@pytest.mark.bench
def test_peer_line_sql_matches_line(spark):
    """The Spark continuous peer builds each line in SQL from the rate source's ``value``: same lines."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import peer_runners
    finally:
        sys.path.remove(str(BENCHMARKS))
    values = [0, 1, 2, 3, 7, 1001, 123_457, 4_000_003]
    rows = spark.createDataFrame([(v,) for v in values], "value long").selectExpr(
        "value", f"{peer_runners.line_sql(4)} as line").collect()
    assert {r["value"]: r["line"] for r in rows} == {v: peer_runners.line(v % 4, v // 4) for v in values}
