"""The word count on a Spark cluster: input, checkpoints and output on storage every host
sees (S3, or a file system mounted alike on every host).

Submit it with ``spark-submit`` (README, "Running on a cluster"); the master, the packed
environment of the executors and their settings come from the command line::

    spark-submit --master spark://master:7077 --archives epochal-env.tar.gz#env \\
        examples/cluster_wordcount.py s3://bucket/wordcount-run-1

It writes ``--files`` text files under ``<base>/in``, counts words exactly-once with
checkpoints under ``<base>/checkpoints`` and output under ``<base>/out``, then checks the
committed output against a plain-Python count of the same text.
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
import time

import fsspec

import epochal as ep
from epochal.sinks import FileSink, read_committed

WORDS = ("stream state epoch barrier snapshot spark flink align commit sink source "
         "key group task channel credit loop head tail exactly once").split()


class WordCount(ep.KeyedProcessFunction):
    """A running count per word in keyed value state."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, word, value):
        self.count.update(self.count.value() + 1)
        yield {"word": word, "n": self.count.value()}


def write_input(base: str, files: int, lines: int) -> list[str]:
    rng = random.Random(42)
    text = []
    for f in range(files):
        rows = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(lines)]
        with fsspec.open(f"{base}/in/part-{f:03d}.txt", "w") as out:
            out.write("\n".join(rows) + "\n")
        text.extend(rows)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="s3://bucket/prefix, or a path every host sees (then --shared)")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--shared", action="store_true", help="base is a local path mounted alike on every host")
    args = parser.parse_args()
    base = args.base.rstrip("/")

    text = write_input(base, args.files, args.lines)
    expected = collections.Counter(w for line in text for w in line.split())

    flow = ep.Dataflow("cluster-wordcount", parallelism=args.parallelism)
    (flow.source("lines", ep.sources.DirectorySource(f"{base}/in", pattern="*.txt"))
         .flat_map("split", str.split)
         .key_by(lambda word: word)
         .process("count", WordCount())
         .sink("out", FileSink(f"{base}/out")))
    t0 = time.monotonic()
    result = flow.run(checkpoint=ep.CheckpointConfig(interval="1s", storage=f"{base}/checkpoints"),
                      cluster=ep.ClusterConfig(shared_paths=[base] if args.shared else []))
    final: dict = {}
    for record in read_committed(f"{base}/out"):
        final[record["word"]] = max(final.get(record["word"], 0), record["n"])
    hosts = sorted({m.get("host") for m in result.task_metrics.values()})
    print(f"epochal word count on {result.runtime} in {time.monotonic() - t0:.1f} s, {result.attempts} attempt(s), "
          f"tasks on hosts {', '.join(hosts)}, encrypted channels: {'yes' if result.encrypted else 'no'}")
    exact = final == dict(expected)
    print(f"committed output equals a plain-Python count: {'yes' if exact else 'NO'} "
          f"({sum(expected.values())} words, {len(expected)} distinct)")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
