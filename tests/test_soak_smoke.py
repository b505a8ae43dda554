"""benchmarks/soak.py --smoke (opt-in, ``-m bench``): the soak benchmark still runs end to end
on the local runtime and writes its growth figures (the real run: see benchmarks/README.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.bench
def test_soak_smoke(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "soak.py"), "--smoke", "--runtime", "local",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    assert run["runtime"] == "local" and run["restarts"] == 0 and run["epochs"] >= 50
    running = [s for s in run["samples"] if s["epoch"]]  # once the job runs, every task process is sampled
    assert running and all(len(s["tasks_rss"]) == 4 for s in running), run["samples"]
    growth = run["growth"]["rss"]
    assert growth["driver_bytes_per_epoch"] is not None and growth["tasks_bytes_per_epoch"] is not None
    assert doc["machine"]["loadavg_at_start"] is not None
