"""benchmarks/ttl.py --smoke runs end to end in a subprocess (so the script cannot rot)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.bench
def test_ttl_benchmark_smoke(tmp_path):
    out = tmp_path / "ttl.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "ttl.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    assert {(c["backend"], c["variant"]) for c in doc["capacity"]} == {
        (b, v) for b in ("heap", "rocksdb") for v in ("ttl", "none")}
    assert all(c["records_per_s"] > 0 for c in doc["capacity"])
    assert all(s["samples"] for s in doc["soak"])
