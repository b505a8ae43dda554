"""benchmarks/scale.py (issue 50): a smoke run in a subprocess — the real driver, 10 simulated
tasks over pinned TLS, 0.1 s epochs for about a second, one task failing on schedule."""
from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
N, SEED, STATE_BYTES = 10, 7, 1024  # the smoke run's (benchmarks/scale.py --smoke)


@pytest.mark.bench
def test_scale_benchmark_smoke(tmp_path):
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, "benchmarks/scale.py", "--smoke", "--root", str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    run = json.loads(out.read_text())["runs"][0]
    # the scheduled failure fired mid-run and restarted its failover region alone
    assert sum(c["failed"] for c in run["sim_counts"]) == 1
    assert len(run["failovers"]) == 1 and run["failovers"][0]["region"] == 3
    restored = run["failovers"][0]["restored_epoch"]
    assert restored is not None and 1 <= restored < run["completed_epochs"]
    assert run["whole_attempts"] == 1 and run["attempts"] == 2  # the region restarted, not the attempt
    # oracle (plain Python): the newest _metadata holds every task's own state, byte for byte
    job = tmp_path / "ckpt" / f"scale-{N}"
    newest = max(job.glob("chk-*"), key=lambda p: int(p.name[4:]))
    tasks = json.loads((newest / "_metadata").read_text())["meta"]["tasks"]
    assert sorted(tasks) == sorted(f"src[{i}]" for i in range(N))
    for i in range(N):
        blob = random.Random(SEED * 1_000_003 + i).randbytes(STATE_BYTES)
        handle = tasks[f"src[{i}]"]["handle"]
        assert handle["sha256"] == hashlib.sha256(blob).hexdigest() and handle["size"] == STATE_BYTES
        assert hashlib.sha256((job / handle["path"]).read_bytes()).hexdigest() == handle["sha256"]
    # the figures exist: overhead per whole epoch, CPU, metadata, restore planning, dashboard
    assert run["whole_epochs"] >= 5 and run["beyond_slowest_s"]["p99"] is not None
    assert run["steady"]["driver_cpu_share"] is not None and run["metadata_bytes"] > 0
    assert run["restore_plan_s"] > 0 and run["dashboard_ms"]["count"] >= 1 and not run["dashboard_errors"]
