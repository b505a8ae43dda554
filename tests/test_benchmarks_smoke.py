"""The benchmark scripts still run: smoke mode, local runtime, in a subprocess (as a user would)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


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
    assert {r["guarantee"] for r in runs} == {"exactly-once", "at-least-once"}
    assert all(r["records"] == r["expected"] and r["latency_s"]["p50"] is not None for r in runs)
