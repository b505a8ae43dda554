"""benchmarks/nexmark.py --smoke runs end to end (epochal, local runtime, every query checked
against its plain-Python oracle, also on Arrow batches), so the script cannot rot."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.bench
def test_nexmark_smoke(tmp_path):
    out = tmp_path / "nexmark.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "nexmark.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    assert set(doc["queries"]) == {"q1", "q2", "q3", "q4", "q5", "q7", "q8"}
    for query, entry in doc["queries"].items():
        assert entry["epochal"]["check_ok"] is True, query
        assert entry["epochal"]["events_per_s"] > 0, query
    for query in doc["queries"]:  # the columnar versions
        assert doc["queries"][query]["epochal-columnar"]["check_ok"] is True, query
