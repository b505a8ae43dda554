"""benchmarks/columnar_ttl.py --smoke runs end to end in a subprocess (so the script cannot rot)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.bench
def test_columnar_ttl_benchmark_smoke(tmp_path):
    out = tmp_path / "columnar_ttl.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "columnar_ttl.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    assert {(r["kind"], r["variant"]) for r in doc["runs"]} == {
        (k, v) for k in ("aggregate", "window") for v in ("ttl", "none")}
    for s in doc["summary"]:  # bounded: fewer keys kept with the ttl than without
        assert s["keys_stored"]["ttl"] < s["keys_stored"]["none"]
