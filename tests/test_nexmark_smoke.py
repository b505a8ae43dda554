"""benchmarks/nexmark.py --smoke runs end to end (epochal, local runtime, every query checked
against its plain-Python oracle, also on Arrow batches), so the script cannot rot."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _smoke(script: str, tmp_path) -> dict:
    out = tmp_path / (script + ".json")
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


@pytest.mark.bench
def test_nexmark_smoke(tmp_path):
    doc = _smoke("nexmark.py", tmp_path)
    assert doc["errors"] == []
    assert set(doc["queries"]) == {"q1", "q2", "q3", "q4", "q5", "q7", "q8"}
    for query, entry in doc["queries"].items():
        assert entry["epochal"]["check_ok"] is True, query
        assert entry["epochal"]["events_per_s"] > 0, query
    for query in doc["queries"]:  # the columnar versions
        assert doc["queries"][query]["epochal-columnar"]["check_ok"] is True, query


@pytest.mark.bench
def test_nexmark_floor_smoke(tmp_path):
    """The decoder-alone floor keeps the rows the queries' oracles say (q1: every bid; q2: the
    selected bids), so it times the same work."""
    sys.path.insert(0, str(BENCHMARKS))
    import nexmark_queries as nq

    doc = _smoke("nexmark_floor.py", tmp_path)
    q1, q2 = doc["queries"]["q1"], doc["queries"]["q2"]
    assert q1["rows_kept"] == sum(nq.oracle("q1", q1["events"]).values())
    assert q2["rows_kept"] == sum(nq.oracle("q2", q2["events"]).values()) > 0
    assert all(d["cpu_s_median"] > 0 for d in doc["queries"].values())
