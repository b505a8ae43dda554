"""Processing-time windows of Arrow batches in a whole job (issue 52; the operator alone is
tested against the record path in ``test_columnar_processing_windows``): a throttled source,
``to_batches``, tumbling processing-time windows counting and summing per key, a file sink,
exactly-once on the local runtime — with a task process SIGKILLed from outside mid-run.

Which window a row lands in depends on the wall clock, so the oracle is what does not:
every row is counted exactly once across the committed windows (per key, the windows' counts
and sums add up to the input's, computed in plain Python), each (key, window) is committed
once, and every window starts on the size's grid."""
from __future__ import annotations

import collections
import datetime
import os

import pyarrow as pa

import epochal as ep
from epochal.columnar import count, sum as asum
from epochal.sinks import FileSink, read_committed
from epochal.windows import Tumbling
from pipelines import PidFileKiller, unique_dir

KEYS, SPLITS, PER_SPLIT, RATE = 5, 2, 3000, 1500.0  # rows per split and rows/s per split: 2 s of input
SIZE_US = 50_000
SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def _rows(split: int, offset: int):
    return ({"k": f"k{(split * PER_SPLIT + i) % KEYS}", "v": split * PER_SPLIT + i} for i in range(offset, PER_SPLIT))


def _oracle() -> dict:
    totals: dict = collections.defaultdict(lambda: [0, 0])
    for split in range(SPLITS):
        for r in _rows(split, 0):
            totals[r["k"]][0] += 1
            totals[r["k"]][1] += r["v"]
    return {k: tuple(v) for k, v in totals.items()}


class MarkPid:
    """Passes batches through; leaves a file named by its process id (for the kill)."""

    def __init__(self, pid_dir: str):
        self.pid_dir = pid_dir

    def __call__(self, batch):
        path = os.path.join(self.pid_dir, str(os.getpid()))
        if not os.path.exists(path):
            open(path, "w").close()
        return batch


def _flow(out: str, pid_dir: str) -> ep.Dataflow:
    flow = ep.Dataflow("ptw-job", parallelism=2)
    (flow.source("rows", ep.sources.GeneratorSource(_rows, num_splits=SPLITS, limit=PER_SPLIT, records_per_second=RATE))
         .to_batches("batches", SCHEMA)
         .map_batches("mark", MarkPid(pid_dir))
         .key_by("k").window(Tumbling("0.05s", processing_time=True)).aggregate("w", n=count(), s=asum("v"))
         .sink("out", FileSink(out)))
    return flow


def test_processing_time_windows_on_batches_count_every_row_once_through_a_sigkill(tmp_path):
    out, pids = unique_dir(tmp_path, "out"), tmp_path / "pids"
    pids.mkdir()
    handle = _flow(out, str(pids)).start(runtime="local", checkpoint=ep.CheckpointConfig(
        interval=0.1, storage="file://" + unique_dir(tmp_path, "ckpt")))
    killer = PidFileKiller(pids, ready=lambda: len(handle.completed_epochs) >= 2, running=lambda: handle.running)
    result = handle.wait(180)
    killer.join()
    assert killer.killed and result.attempts >= 2, f"the SIGKILL of {killer.killed} caused no restart"
    rows = read_committed(out)
    windows = collections.Counter((r["k"], r["window_start"]) for r in rows)
    assert max(windows.values()) == 1, [w for w, c in windows.items() if c > 1][:3]  # each window committed once
    totals: dict = collections.defaultdict(lambda: [0, 0])
    for r in rows:
        start_us = round(datetime.datetime.fromisoformat(r["window_start"]).timestamp() * 1e6)  # jsonl: ISO 8601
        assert start_us % SIZE_US == 0 and r["n"] > 0, r
        totals[r["k"]][0] += r["n"]
        totals[r["k"]][1] += r["s"]
    assert {k: tuple(v) for k, v in totals.items()} == _oracle()
    assert len(windows) > KEYS  # the rows spread over several windows of the run, not one per key at the end
