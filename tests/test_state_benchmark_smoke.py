"""benchmarks/state.py --smoke runs end to end in a subprocess (so the script cannot rot)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
import pytest


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.bench
def test_state_benchmark_smoke(tmp_path):
    out = tmp_path / "state.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "state.py"), "--smoke", "--runtime", "local",
         "--out", str(out), "--tmp", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    assert doc["errors"] == []
    for size, modes in doc["summary"].items():
        assert set(modes) == {"no-checkpoint", "heap-blocking", "heap-thread", "heap-fork", "rocksdb-full",
                              "rocksdb-incr"}
        assert modes["no-checkpoint"]["ratio_to_baseline"] == 1.0
        for name, m in modes.items():
            assert m["records_per_s"] > 0 and m["steady_records_per_s"] > 0 and m["checkpoints"] >= 1, (size, name)
            if name != "no-checkpoint":
                assert m["recovery_s"] is not None, (size, name)
    incr = [r for r in doc["runs"] if r["mode"] == "rocksdb-incr"]
    assert all(r["state_bytes"][-1] >= r["bytes"][-1] > 0 for r in incr)
