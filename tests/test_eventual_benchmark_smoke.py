"""benchmarks/eventual.py --smoke runs end to end in a subprocess (so the script cannot rot);
opt-in (``-m bench``) like the other benchmark smokes. It checks the shape of the results, and
that CEC's recovery started from its eventual checkpoint (extent read back, replay after T) —
never the figures, which depend on the machine's load."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
MODES = ["none-heap", "epoch-blocking", "epoch-thread", "epoch-fork", "epoch-aligned", "epoch-unaligned", "none-cec",
         "cec"]


@pytest.mark.bench
def test_eventual_benchmark_smoke(tmp_path):
    out = tmp_path / "eventual.json"
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "eventual.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == [] and [r["mode"] for r in doc["runs"]] == MODES
    runs = {r["mode"]: r for r in doc["runs"]}
    for mode in MODES:
        lat = runs[mode]["latency_us"]
        assert 0 < lat["p50"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
        assert runs[mode]["throughput"] > 0
    for mode in ("epoch-blocking", "epoch-thread", "epoch-fork", "epoch-aligned", "epoch-unaligned", "cec"):
        assert runs[mode]["checkpoints"] > 0 and runs[mode]["recovery"]["replay_records"] > 0
    cec = runs["cec"]["recovery"]
    assert cec["extent_records"] >= cec["open_windows"] > 0
    assert runs["epoch-unaligned"]["channel_state_bytes"]["max"] > 0 and "channel_state_bytes" not in runs["epoch-aligned"]
    assert all(r["longest_pause_us"] == r["latency_us"]["max"] for r in doc["runs"])
    sweep = doc["recovery_vs_extent"]  # a larger max_extent never replays less (the same input, budget 0)
    assert len(sweep) == 5 and [r["replay_records"] for r in sweep] == sorted(r["replay_records"] for r in sweep)
    assert sweep[0]["replay_records"] < sweep[-1]["replay_records"]
    assert doc["machine"]["loadavg_at_start"] and doc["loadavg_at_end"]
