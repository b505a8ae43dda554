"""epochal's main example: an exactly-once word count on embedded local Spark.

It writes a small directory of text files, then runs a keyed word count with two
shuffles (words → running count per word → histogram of counts) as long-running Spark
tasks, checkpointing every second. Half-way through, an injected fault crashes the
task that counts words (``--no-crash`` to skip it): epochal restores every task from the
latest completed epoch, the file source rewinds to its snapshotted offsets, and the
exactly-once file sink publishes each epoch's output only when the epoch completes.
At the end the committed output is checked against a plain-Python count.

    python examples/wordcount.py [--no-crash] [--at-least-once] [--files 8] [--lines 4000]
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import tempfile
import time

import epochal as ep
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord

WORDS = ("stream state epoch barrier snapshot spark flink align commit sink source "
         "key group task channel credit loop head tail exactly once").split()


def write_input(directory: str, files: int, lines: int) -> list[str]:
    rng = random.Random(42)
    text = []
    for f in range(files):
        rows = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(lines)]
        with open(os.path.join(directory, f"part-{f:03d}.txt"), "w") as out:
            out.write("\n".join(rows) + "\n")
        text.extend(rows)
    return text


class Histogram(ep.KeyedProcessFunction):
    """Second shuffle: how many (word, n) updates reached each n % 10 bucket."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, bucket, value):
        self.count.update(self.count.value() + 1)
        yield {"kind": "bucket", "key": str(bucket), "n": self.count.value()}


def build(input_dir: str, output_dir: str) -> ep.Dataflow:
    flow = ep.Dataflow("wordcount", parallelism=2)
    lines = flow.source("lines", ep.sources.DirectorySource(input_dir, pattern="*.txt", epoch_per_file=True))
    counts = (lines.flat_map("split", str.split)
                   .key_by(lambda word: word)
                   .process("count", WordCount()))
    histogram = counts.key_by(lambda r: r["n"] % 10).process("histogram", Histogram())
    counts.union(histogram).sink("out", FileSink(output_dir, format="jsonl"))
    return flow


class WordCount(ep.KeyedProcessFunction):
    """First shuffle: a running count per word in keyed value state."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, word, value):
        self.count.update(self.count.value() + 1)
        yield {"kind": "word", "key": word, "n": self.count.value()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--no-crash", action="store_true", help="run without the injected fault")
    parser.add_argument("--at-least-once", action="store_true")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="epochal-example-")
    input_dir, output_dir = os.path.join(work, "in"), os.path.join(work, "out")
    os.makedirs(input_dir)
    text = write_input(input_dir, args.files, args.lines)
    expected = collections.Counter(w for line in text for w in line.split())

    faults = [] if args.no_crash else [CrashAtRecord("count", record=len(expected) and 20_000, subtask=1,
                                                     how="exit", after_epoch=2)]
    guarantee = "at-least-once" if args.at_least_once else "exactly-once"
    t0 = time.monotonic()
    result = build(input_dir, output_dir).run(
        guarantee=guarantee,
        checkpoint=ep.CheckpointConfig(interval="1s", storage=f"file://{work}/checkpoints"),
        restart=ep.RestartStrategy(max_attempts=2),
        runtime=os.environ.get("EPOCHAL_RUNTIME", "spark"),
        faults=faults,
    )
    elapsed = time.monotonic() - t0

    final = {}
    for record in read_committed(output_dir):
        if record["kind"] == "word":
            final[record["key"]] = max(final.get(record["key"], 0), record["n"])
    updates = sum(1 for r in read_committed(output_dir) if r["kind"] == "word")
    print(f"\nepochal word count on Spark ({guarantee}) in {elapsed:.1f} s, {result.attempts} attempt(s)")
    for failure in result.failures:
        print(f"  recovered from: {failure.splitlines()[0]}")
    print(f"  restored from epochs: {[e for e in result.restored_from if e is not None] or 'none'}")
    print(f"  completed epochs: {len(result.completed_epochs)}; "
          f"checkpoint p50 {_p(result.completed_epochs, 50):.3f} s, max {_p(result.completed_epochs, 100):.3f} s")
    print(f"  words: {sum(expected.values())}; top: "
          + ", ".join(f"{w}={n}" for w, n in sorted(final.items(), key=lambda kv: -kv[1])[:5]))
    exact = final == dict(expected) and updates == sum(expected.values())
    print(f"  committed output equals a failure-free count: {'yes' if exact else 'NO'}"
          f" ({updates} running-count updates for {sum(expected.values())} words)")
    print(f"  output: {output_dir}")
    if guarantee == "exactly-once" and not exact:
        raise SystemExit("exactly-once violated")


def _p(epochs, q):
    xs = sorted(e["duration_s"] for e in epochs)
    return xs[min(len(xs) - 1, int(len(xs) * q / 100))] if xs else 0.0


if __name__ == "__main__":
    main()
