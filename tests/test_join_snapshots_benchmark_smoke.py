"""benchmarks/join_snapshots.py and join_probe.py --smoke run end to end in a subprocess (so the scripts cannot rot)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.bench
def test_join_snapshots_benchmark_smoke(tmp_path):
    out = tmp_path / "join_snapshots.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "join_snapshots.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    assert {(r["code"], r["backend"]) for r in doc["runs"]} == {
        (c, b) for c in ("old", "new") for b in ("heap", "rocksdb")}
    for r in doc["runs"]:  # every epoch wrote something: the new rows
        assert all(e["put_bytes"] > 0 for e in r["epochs"])


@pytest.mark.bench
def test_join_probe_benchmark_smoke(tmp_path):
    """benchmarks/join_probe.py: the old and the new operator emit the same rows."""
    out = tmp_path / "join_probe.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "join_probe.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == [] and len(doc["rounds"]) == 1
    row = doc["rounds"][0]
    assert row["old"]["output_rows"] == row["new"]["output_rows"] > 0
