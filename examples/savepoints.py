"""Savepoints: stop a job, restore it with other code at another parallelism, roll it back.

Version 1 of a running word count reads an endless, rate-limited input at parallelism 2. The
script takes a savepoint while it runs (``before``), then stops it with another one
(``stop``): the committed output ends exactly at ``stop``. Version 2 (its count runs at
parallelism 3, and it reads the input up to ``END`` words per split at full speed) restores from
``stop`` and runs to the end. Then the script rolls back: version 3 restores from the older
savepoint ``before`` and produces everything after it again; its ``FileSink(rollback=
"remove")`` first deletes the files the abandoned future committed, so the directory holds
one history. After each step the committed output and the savepoint's state are compared
with a plain-Python count of the input up to that point.

    python examples/savepoints.py [--runtime spark|local]

Contract: :func:`run` runs the three versions in a fresh directory and returns what each
step committed and where its savepoints are.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import os
import tempfile
import time

import epochal as ep
from epochal.sinks import FileSink, read_committed

WORDS = ("north", "south", "east", "west", "up", "down")
END = 3000  # records per split in versions 2 and 3 (bounded); version 1 reads an endless input
JOB = "words"


def word(split: int, i: int) -> str:
    """Word ``i`` of ``split``: a pure function of its position (so the source can replay it)."""
    return WORDS[(i * 7 + split + i // 11) % len(WORDS)]


def words_from(split: int, offset: int):
    return (word(split, i) for i in itertools.count(offset))


class Count(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, word, value):
        self.count.update(self.count.value() + 1)
        yield {"word": word, "n": self.count.value()}


def build(work: str, count_parallelism: int, rate: float | None, limit: int | None) -> ep.Dataflow:
    """Every version: the same operator names (they key the state), other settings."""
    flow = ep.Dataflow(JOB, parallelism=2)
    words = ep.sources.GeneratorSource(words_from, num_splits=2, limit=limit, records_per_second=rate)
    (flow.source("words", words)
         .key_by(lambda w: w)
         .process("counter", Count(), parallelism=count_parallelism)
         .sink("out", FileSink(f"{work}/out", rollback="remove")))
    return flow


def let_it_run(handle, epochs: int) -> None:
    """Wait until the running job completed ``epochs`` more checkpoints."""
    target, deadline = len(handle.completed_epochs) + epochs, time.monotonic() + 120
    while len(handle.completed_epochs) < target and time.monotonic() < deadline:
        time.sleep(0.02)


def committed(work: str) -> collections.Counter:
    """Every committed row ``(word, n)``, with its multiplicity."""
    return collections.Counter((r["word"], r["n"]) for r in read_committed(f"{work}/out"))


def running(counts: dict) -> collections.Counter:
    """The rows a running count writes for these final counts: ``(word, 1) .. (word, n)`` once each."""
    return collections.Counter((w, k) for w, n in counts.items() for k in range(1, n + 1))


def run(work: str, runtime: str = "spark", spark=None) -> dict:
    """Stop, restore rescaled, roll back; returns each step's committed counts and results."""
    steps: dict = {}
    # --8<-- [start:stop]
    v1 = build(work, count_parallelism=2, rate=100, limit=None)   # endless, 100 words/s per split
    handle = v1.start(checkpoint=ep.CheckpointConfig(interval="200ms", storage=f"file://{work}/ckpt-v1"),
                      runtime=runtime, spark=spark)
    let_it_run(handle, epochs=2)
    before = handle.savepoint(f"{work}/savepoints/before")       # the job runs on
    let_it_run(handle, epochs=2)
    stop = handle.stop_with_savepoint(f"{work}/savepoints/stop")  # commits up to it, then stops
    assert handle.wait(60).stopped_with_savepoint == stop
    # --8<-- [end:stop]
    steps["stop"] = {"savepoint": stop, "before": before, "counts": committed(work),
                     "state": {r["key"]: r["value"] for r in ep.state.read(stop, "counter").to_pylist()}}

    # --8<-- [start:restore]
    v2 = build(work, count_parallelism=3, rate=None, limit=END)  # rescaled 2 -> 3, up to END at full speed
    result = v2.run(restore_from=stop,                   # a fresh checkpoint storage
                    checkpoint=ep.CheckpointConfig(interval="200ms", storage=f"file://{work}/ckpt-v2"),
                    runtime=runtime, spark=spark)
    # --8<-- [end:restore]
    steps["restore"] = {"result": result, "counts": committed(work)}

    # --8<-- [start:rollback]
    v3 = build(work, count_parallelism=2, rate=None, limit=END)
    result = v3.run(restore_from=before,                 # back to the older savepoint: a branch
                    checkpoint=ep.CheckpointConfig(interval="200ms", storage=f"file://{work}/ckpt-v3"),
                    runtime=runtime, spark=spark)
    # FileSink(rollback="remove"): the files v1 and v2 committed after `before` are gone
    # --8<-- [end:rollback]
    steps["rollback"] = {"result": result, "counts": committed(work)}
    return steps


def count_up_to(url: str) -> dict:
    """Plain Python: each word's count over the input the savepoint's sources had read."""
    offsets = {}
    for entry in ep.state.list_source_offsets(url):
        offsets.update(entry["offsets"])
    return dict(collections.Counter(word(int(s), i) for s, n in offsets.items() for i in range(n)))


def count_all() -> dict:
    return dict(collections.Counter(word(s, i) for s in range(2) for i in range(END)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default=os.environ.get("EPOCHAL_RUNTIME", "spark"), choices=["spark", "local"])
    args = parser.parse_args()
    steps = run(tempfile.mkdtemp(prefix="epochal-savepoints-"), args.runtime)
    at_stop = count_up_to(steps["stop"]["savepoint"])
    checks = {
        "stopped: the output ends at the savepoint": steps["stop"]["counts"] == running(at_stop),
        "stopped: the savepoint's state is that count": steps["stop"]["state"] == at_stop,
        "restored at parallelism 3: every update once": steps["restore"]["counts"] == running(count_all()),
        "rolled back: one history, every update once": steps["rollback"]["counts"] == running(count_all()),
    }
    for what, ok in checks.items():
        print(f"  {what}: {ok}")
    if not all(checks.values()):
        raise SystemExit("a step's committed output differs from the plain-Python count")


if __name__ == "__main__":
    main()
