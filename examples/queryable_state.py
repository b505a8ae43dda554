"""Querying a running job: read-committed lookups of keyed state, from the driver, from a
client in another process, and from the shell.

A word count whose per-word count is declared queryable runs on an endless, rate-limited
input. While it runs, the script asks for every word's count — each answer is the state as
of one completed epoch, every word at the same epoch — through the job's handle, through a
``QueryClient`` (what another process or host uses) and through the ``epochal query``
command. Then it stops the job with a savepoint. Each answer is compared with a plain-Python
count of exactly the input the answered epoch's checkpoint had read (its source offsets).

    python examples/queryable_state.py [--runtime spark|local]

Contract: :func:`run` runs the job, asks until three different epochs answered, stops it and
returns ``(result, answers, storage)``: ``answers`` is a list of ``(how, epoch, {word: n})``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import epochal as ep
from epochal.query import QueryClient
from epochal.sinks import FileSink

WORDS = ("apple", "banana", "cherry", "damson", "elder", "fig", "grape")
JOB = "word-counts"


def word(split: int, i: int) -> str:
    """Word ``i`` of ``split``: a pure function of its position (so the source can replay it)."""
    return WORDS[(i * 5 + split * 3 + i // 7) % len(WORDS)]


def words_from(split: int, offset: int):
    i = offset
    while True:
        yield word(split, i)
        i += 1


# --8<-- [start:graph]
class Count(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0, queryable=True)  # served to lookups

    def process(self, word, value):
        self.count.update(self.count.value() + 1)
        yield {"word": word, "n": self.count.value()}


def build(work: str) -> ep.Dataflow:
    flow = ep.Dataflow(JOB, parallelism=2)
    (flow.source("words", ep.sources.GeneratorSource(words_from, num_splits=2, records_per_second=2000))
         .key_by(lambda w: w)
         .process("counter", Count())
         .sink("out", FileSink(f"{work}/out")))
    return flow
# --8<-- [end:graph]


def run(work: str, runtime: str = "spark", spark=None, epochs: int = 3):
    storage = f"file://{work}/checkpoints"
    answers = []
    # --8<-- [start:query]
    handle = build(work).start(checkpoint=ep.CheckpointConfig(interval="200ms", storage=storage,
                                                              retained=1000),  # to check the answers
                               runtime=runtime, spark=spark)
    try:
        deadline = time.monotonic() + 120
        while len({epoch for _, epoch, _ in answers}) < epochs and time.monotonic() < deadline:
            # in the driver: every word at one completed epoch (waits for the first one)
            r = handle.query("counter", "count", list(WORDS), timeout=60)
            answers.append(("handle", r.epoch, r.values))

            # from another process or host: the address and the token are the job's
            with QueryClient(handle.query_address, handle.query_token) as client:
                r = client.query("counter", "count", list(WORDS))
            answers.append(("client", r.epoch, r.values))
            time.sleep(0.1)  # pacing: a service asks when it needs an answer

        # from the shell: EPOCHAL_QUERY_TOKEN=... epochal query HOST:PORT counter count apple fig
        host, port = handle.query_address
        shell = subprocess.run([sys.executable, "-m", "epochal.cli", "query", f"{host}:{port}", "counter", "count",
                                *WORDS], env={**os.environ, "EPOCHAL_QUERY_TOKEN": handle.query_token},
                               capture_output=True, text=True, check=True)
        printed = json.loads(shell.stdout)  # {"epoch": 7, "isolation": "read-committed", "values": [[k, v], ...]}
        answers.append(("shell", printed["epoch"], dict(printed["values"])))
    finally:
        handle.stop_with_savepoint(f"{work}/savepoint", timeout=120)
    # --8<-- [end:query]
    return handle.wait(120), answers, storage


def counts_at(storage: str, epoch: int) -> dict:
    """Plain Python: each word's count over the input epoch ``epoch``'s checkpoint had read."""
    offsets = {}
    for entry in ep.state.list_source_offsets(f"{storage}/{JOB}/chk-{epoch}"):
        offsets.update(entry["offsets"])
    counts = collections.Counter(word(int(s), i) for s, n in offsets.items() for i in range(n))
    return {w: counts[w] for w in WORDS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default=os.environ.get("EPOCHAL_RUNTIME", "spark"), choices=["spark", "local"])
    args = parser.parse_args()
    result, answers, storage = run(tempfile.mkdtemp(prefix="epochal-query-"), args.runtime)
    wrong = 0
    for how, epoch, values in answers:
        ok = values == counts_at(storage, epoch)
        wrong += not ok
        print(f"  {how:6} epoch {epoch}: {sum(values.values())} words counted; equal to plain Python: {ok}")
    print(f"stopped with a savepoint at {result.stopped_with_savepoint}")
    if wrong:
        raise SystemExit(f"{wrong} answer(s) differ from the count of their epoch's input")


if __name__ == "__main__":
    main()
