"""The task-thread loop of an eventual-checkpoint operator (``epochal.eventual.runner``) over a
JSON-lines source and a log in a local directory, crashed and restarted.

In-process: a crash raised at a chosen tuple, the segment being written torn, and a downstream
reader that bounds truncation; out of process: the operator's process SIGKILLed from outside
while it runs, then restarted. Both end with the plain-Python oracle's results, each once.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from epochal.errors import DataError, InjectedFault
from epochal.eventual.extent import CheckpointScheduler, ExtentPolicy
from epochal.eventual.log import OutputLog, ResultReader
from epochal.eventual.operator_state import EventualWindows, SumCount, Tumbling
from epochal.eventual.runner import JsonLinesSource, run_eventual

SIZE = 5
ROOT = Path(__file__).resolve().parent.parent


def write_source(path: Path, n: int, seed: int) -> list:
    r = random.Random(seed)
    ts, rows = 0, []
    for _ in range(n):
        ts += r.choice([0, 0, 1, 2])
        rows.append([0 if r.random() < 0.7 else r.randint(1, 6), ts, r.randint(-3, 9)])
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def oracle(rows) -> Counter:
    acc = {}
    for key, ts, value in rows:
        w = (key, ts // SIZE * SIZE)
        s, c = acc.get(w, (0, 0))
        acc[w] = (s + value, c + 1)
    return Counter(acc.items())


def operator():
    return EventualWindows(Tumbling(SIZE), SumCount, closing="key",
                           scheduler=CheckpointScheduler(ExtentPolicy(budget=0.0, max_extent=15)))  # due ones only


def crash_at(k):
    def hook(i, t):
        if i == k:
            raise InjectedFault(f"crash before tuple {i} of the attempt, at {tuple(t)}")
    return hook


@pytest.mark.parametrize("crash, fraction", [(17, 0.5), (62, 0.0), (101, 0.9)])
def test_crashes_tear_and_restarts_end_with_every_result_once(tmp_path, crash, fraction):
    rows = write_source(tmp_path / "in.jsonl", 150, seed=crash)
    source, url = JsonLinesSource(str(tmp_path / "in.jsonl")), str(tmp_path / "log")
    reader = ResultReader(OutputLog(url))
    got = Counter()

    def keep_from():  # the downstream sink reads before the log is truncated behind it
        got.update((r.window, r.value) for r in reader.poll())
        return reader.index

    crashed = OutputLog(url)
    with pytest.raises(InjectedFault):
        run_eventual(operator, source, crashed, flush_every=4, keep_from=keep_from, on_tuple=crash_at(crash))
    assert crashed.buffered_bytes > 0  # frames not yet flushed: the crash interrupts their flush
    crashed.flush()
    newest = OutputLog(url).segments()[-1].path
    data = Path(newest).read_bytes()
    Path(newest).write_bytes(data[:int(len(data) * fraction)])  # torn: nothing read or truncated it yet
    report = run_eventual(operator, source, OutputLog(url), flush_every=4, keep_from=keep_from)
    keep_from()
    assert report.recovered.tc is not None and report.tuples < len(rows)  # it resumed mid-run
    assert report.truncated > 0 or crash < 20
    assert got == oracle(rows)


CHILD = """
import sys
from epochal.eventual.log import OutputLog
from epochal.eventual.runner import run_eventual, JsonLinesSource
sys.path.insert(0, sys.argv[3])
from test_eventual_runner import operator

def progress(i, t):
    sys.stdout.write(f"{i}".ljust(4095) + "\\n")  # pipe-sized lines: at most ~16 ahead of the reader
    sys.stdout.flush()

report = run_eventual(operator, JsonLinesSource(sys.argv[1]), OutputLog(sys.argv[2]), flush_every=3,
                      truncate=False, on_tuple=progress)
print(f"done {report.replayed} {report.ignored}".ljust(4095), flush=True)
"""


def child(source, log, kill_after=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(source), str(log), str(ROOT / "tests")],
                            stdout=subprocess.PIPE, env=env)
    lines, last = 0, b""
    for last in proc.stdout:
        lines += 1
        if kill_after is not None and lines > kill_after:
            proc.kill()
            break
    proc.stdout.close()
    return proc.wait(timeout=120), lines, last.decode().split()


def test_the_operator_process_killed_from_outside_restarts_to_every_result_once(tmp_path):
    rows = write_source(tmp_path / "in.jsonl", 400, seed=3)
    log = tmp_path / "log"
    code, lines, _ = child(tmp_path / "in.jsonl", log, kill_after=150)
    assert code == -9 and lines == 151  # killed mid-run: 250 tuples to go
    partial = Counter((r.window, r.value) for r in OutputLog(str(log)).results())
    assert 0 < sum(partial.values()) < sum(oracle(rows).values())
    code, lines, (done, replayed, ignored) = child(tmp_path / "in.jsonl", log)
    assert code == 0 and done == "done" and int(replayed) > 0 and int(ignored) > 0  # replayed after T, filtered
    assert Counter((r.window, r.value) for r in OutputLog(str(log)).results()) == oracle(rows)


def test_a_source_out_of_timestamp_order_is_named(tmp_path):
    (tmp_path / "in.jsonl").write_text('["a", 5, 1]\n["a", 4, 1]\n')
    with pytest.raises(DataError, match=r"in.jsonl' line 2: timestamp 4 after 5"):
        run_eventual(operator, JsonLinesSource(str(tmp_path / "in.jsonl")), OutputLog(str(tmp_path / "log")))
