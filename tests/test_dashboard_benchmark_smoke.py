"""Smoke run of ``benchmarks/dashboard.py`` (opt-in: ``-m bench``): both modes run, the page's
polls all answered, the JSON has the side-by-side summary."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.bench
def test_dashboard_benchmark_smoke(tmp_path):
    out = tmp_path / "dashboard.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "dashboard.py"), "--smoke", "--poll-interval", "0.5",
                           "--out", str(out), "--tmp", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    runs = {r["mode"]: r for r in doc["runs"]}
    assert set(runs) == {"no-ui", "ui-polled"}
    assert runs["ui-polled"]["polls"] >= 1 and runs["ui-polled"]["failed_polls"] == 0
    assert "polls" not in runs["no-ui"]
    assert all(r["records_in"] == r["lines"] for r in runs.values())
    s = doc["summary"]
    assert s["ratio_ui_polled_to_no_ui"] > 0 and s["poll_cpu_ms"]["median"] > 0
    assert s["full_page"]["rows"] == 500 and s["full_page"]["cpu_ms"] > 0
