"""A first pipeline: a running count of words, exactly once, on embedded local Spark.

The getting-started page builds this file step by step. Run it with
``python first_pipeline.py``; it prints each word's final count read back from the committed
output and checks it against a count made in plain Python.
"""
import collections
import tempfile

import epochal as ep
from epochal.sinks import FileSink, read_committed

LINES = ["to be or not to be", "that is the question", "to sleep perchance to dream"] * 1000


# --8<-- [start:function]
class RunningCount(ep.KeyedProcessFunction):
    """Per word: the count so far, in keyed state that every checkpoint snapshots."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, word, value):
        self.count.update(self.count.value() + 1)
        yield {"word": word, "n": self.count.value()}
# --8<-- [end:function]


def main(runtime: str = "spark") -> None:
    work = tempfile.mkdtemp(prefix="first-pipeline-")
    out = f"{work}/out"

    # --8<-- [start:graph]
    flow = ep.Dataflow("first-pipeline", parallelism=2)
    (flow.source("lines", ep.sources.CollectionSource(LINES))
         .flat_map("split", str.split)
         .key_by(lambda word: word)
         .process("count", RunningCount())
         .sink("out", FileSink(out, format="jsonl")))
    # --8<-- [end:graph]

    # --8<-- [start:run]
    result = flow.run(guarantee="exactly-once",
                      checkpoint=ep.CheckpointConfig(interval="1s", storage=f"file://{work}/checkpoints"),
                      runtime=runtime)
    # --8<-- [end:run]

    # --8<-- [start:read]
    final: dict = {}
    for record in read_committed(out):  # only what completed epochs published
        final[record["word"]] = max(final.get(record["word"], 0), record["n"])
    # --8<-- [end:read]
    expected = collections.Counter(w for line in LINES for w in line.split())
    print(f"{result.attempts} attempt(s), {len(result.completed_epochs)} checkpoint(s)")
    print("counts: " + ", ".join(f"{w}={n}" for w, n in sorted(final.items())))
    print("equal to a plain-Python count:", final == dict(expected))
    if final != dict(expected):
        raise SystemExit("the committed output differs from the plain-Python count")


if __name__ == "__main__":
    import os

    main(os.environ.get("EPOCHAL_RUNTIME", "spark"))
