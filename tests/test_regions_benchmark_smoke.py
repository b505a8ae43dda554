"""benchmarks/regions.py: a smoke run in a subprocess (so the script cannot rot)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.bench
def test_regions_benchmark_smoke(tmp_path):
    out = tmp_path / "regions.json"
    proc = subprocess.run([sys.executable, "benchmarks/regions.py", "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    runs = {r["mode"]: r for r in doc["runs"]}
    assert set(runs) == {"failure-free", "one-region", "failover", "two-regions"}
    assert all(r["exact_a"] and r["exact_b"] for r in runs.values())
    assert runs["two-regions"]["attempts"] == {"a": 1, "b": 2}  # the kill restarted B alone
    assert runs["one-region"]["attempts"] == {"job": 2}
    assert runs["failover"]["attempts"] == {"job": 2} and runs["failover"]["opens"]["a"] == 1  # B alone
