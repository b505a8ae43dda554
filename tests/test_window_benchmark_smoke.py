"""benchmarks/window.py: smoke run in a subprocess (so the script cannot rot), through the CLI
too, and its measurement helpers on hand-made inputs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def window():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import window
    finally:
        sys.path.remove(str(BENCHMARKS))
    return window


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)
    assert proc.returncode == 0, f"{cmd}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.bench
def test_window_benchmark_smoke(tmp_path, window):
    out = tmp_path / "window.json"
    _run([sys.executable, str(BENCHMARKS / "window.py"), "--smoke", "--out", str(out), "--tmp", str(tmp_path)],
         timeout=120)
    doc = json.loads(out.read_text())
    assert doc["errors"] == []  # includes: every emitted window aggregate had the right count and sum
    assert set(doc["summary"]) == {"0.5", "1"}
    measured = {m: 0 for m in window.MODES}
    for size, modes in doc["summary"].items():
        assert set(modes) == set(window.MODES), size
        assert modes["no-checkpoint"]["ratio_to_baseline"] == 1.0
        for name, m in modes.items():
            assert m["steady_records_per_s"]["median"] > 0 and m["ratio_to_baseline"] > 0, (size, name)
            measured[name] += m["measured_checkpoints"]["median"]
    assert measured.pop("no-checkpoint") == 0
    assert all(n >= 1 for n in measured.values()), measured  # checkpoints fell into every measured phase
    for r in doc["runs"]:
        assert r["stamps"] == -(-(r["fill_records"] + r["post_records"]) // doc["config"]["emit_every"])
        for c in r["measured_checkpoints"]:  # triggered after the fill: the whole window is in the snapshot
            assert c["state_bytes"] >= r["window_bytes"], (r["mode"], c)
    if _has_matplotlib():  # the `bench` extra; without it the JSON is written, the plot skipped
        assert out.with_suffix(".png").stat().st_size > 0


@pytest.mark.bench
def test_bench_window_through_the_cli(tmp_path):
    """`epochal bench window --smoke` runs the benchmark, then the report section and plot."""
    proc = _run([sys.executable, "-m", "epochal.cli", "bench", "window", "--smoke", "--results", str(tmp_path),
                 "--", "--sizes", "0.5", "--modes", "heap-blocking"], timeout=90)
    assert "finished with exit code 0" in proc.stdout
    doc = json.loads((tmp_path / "window.json").read_text())
    assert doc["errors"] == [] and set(doc["summary"]["0.5"]) == {"no-checkpoint", "heap-blocking"}
    section = (tmp_path / "README_SECTION.md").read_text()
    assert "### Large-state sliding window" in section and "| 0.5 | heap-blocking |" in section
    if _has_matplotlib():
        assert (tmp_path / "window.png").stat().st_size > 0


def test_check_stamps_catches_wrong_aggregates(window):
    keys, per_key = 3, 4
    good = []
    for i in range(0, 40, 5):  # key i % 3's window after record i: i, i - 3, ... (at most 4 records)
        members = [j for j in range(i, -1, -keys)][:per_key]
        good.append([i, 0.0, i % keys, len(members), sum(members)])
    assert window.check_stamps(good, keys, per_key) == 0
    bad = [list(s) for s in good]
    bad[-1][4] += 1  # a sum off by one
    bad[2][3] = per_key + 1  # a window larger than its size
    assert window.check_stamps(bad, keys, per_key) == 2


def test_measure_counts_only_the_post_fill_phase(window):
    stamps = [[0, 100.0, 0, 1, 0], [500, 101.0, 0, 1, 500], [1000, 102.0, 0, 1, 1000],
              [2000, 104.0, 0, 1, 2000], [3000, 106.0, 0, 1, 3000]]
    epochs = [  # triggered at wall_time - duration_s
        {"epoch": 1, "reason": "periodic", "wall_time": 101.5, "duration_s": 0.2, "bytes": 1, "state_bytes": 1},
        {"epoch": 2, "reason": "periodic", "wall_time": 104.5, "duration_s": 0.5, "bytes": 2, "state_bytes": 2},
        {"epoch": 3, "reason": "final", "wall_time": 106.5, "duration_s": 0.1, "bytes": 3, "state_bytes": 3},
    ]
    m = window.measure(stamps, epochs, fill=1000)
    assert m["steady_records_per_s"] == pytest.approx(2000 / 4.0)  # records 1000 → 3000 in 102 → 106 s
    assert m["fill_s"] == pytest.approx(2.0) and m["measured_s"] == pytest.approx(4.0)
    assert [c["epoch"] for c in m["measured_checkpoints"]] == [2] and m["periodic_checkpoints"] == 2


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
