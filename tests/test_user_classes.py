"""Classes defined in the user's script (``__main__``) on every path (issue "No silent data
loss", item 3): records crossing channels, keyed state on heap (forked snapshots included)
and RocksDB, a loop's in-transit log, unaligned channel state and a sink's transaction
handle — each checkpointed and restored after a crash, locally and on Spark (-m slow).

On the old main the first record of such a class to cross a channel failed with a
``PicklingError`` (no operator named) and, kept as state, every checkpoint was declined.
The job runs as a real ``__main__`` script in a subprocess, as a user's would, and compares
its output with a plain-Python oracle itself.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import json, os, sys
    from dataclasses import dataclass
    import epochal as ep
    from epochal.sinks import FileSink, read_committed
    from epochal.sinks.base import Sink, TwoPhaseCommitSink
    from epochal.testing import CrashAtRecord

    @dataclass(frozen=True)
    class Word:                      # a record class only this script defines
        text: str

    @dataclass
    class Tally:                     # kept in keyed state
        word: Word
        n: int

    @dataclass
    class Batch:                     # a sink's transaction handle, kept in checkpoints
        epoch: int
        rows: list

    class Count(ep.KeyedProcessFunction):
        def open(self, ctx):
            self.tally = ctx.value_state("tally")
            self.seen = ctx.map_state("seen")
        def process(self, key, word):
            t = self.tally.value() or Tally(word, 0)
            t.n += 1
            self.tally.update(t)
            self.seen.put(word.text, Tally(word, t.n))  # map keys: builtins (RocksDB encodes them)
            yield Tally(t.word, t.n)  # a copy: t stays in state and changes

    class BatchSink(Sink):           # a two-phase-commit sink of __main__ classes
        def __init__(self, path): self.path = path
        def create_writer(self, ctx): return BatchWriter(self.path, ctx)

    class BatchWriter(TwoPhaseCommitSink):
        def __init__(self, path, ctx):
            super().__init__(ctx)
            self.path = os.path.join(path, f"s{ctx.subtask}")
            os.makedirs(self.path, exist_ok=True)
        def begin_transaction(self, epoch): return Batch(epoch, [])
        def write_to(self, txn, record): txn.rows.append(record)
        def pre_commit(self, txn): return None
        def commit(self, txn):
            with open(os.path.join(self.path, f"e{txn.epoch}.json"), "w") as f:
                json.dump([[t.word.text, t.n] for t in txn.rows], f)
        def abort(self, txn): pass
        def cleanup_orphans(self, restored_epoch): pass

    def words(split, offset):
        i = offset
        while True:
            yield Word("w%d" % ((i * 7 + split) % 13))
            i += 1

    def step(r):                     # a loop over records of a __main__ class
        return Tally(r.word, r.n - 1)

    def body(s):
        s = s.map("step", step)
        return s.filter("more", lambda r: r.n > 0).key_by(lambda r: r.word.text), s.filter("done", lambda r: r.n <= 0)

    runtime, backend, out, ckpt = sys.argv[1:5]
    from epochal.backends.choice import BackendSpec
    backends = {"heap": "heap", "heap-fork": BackendSpec("heap", {"snapshot_mode": "fork"}),
                "rocksdb": "rocksdb"}
    flow = ep.Dataflow("userclasses", parallelism=2)
    src = flow.source("words", ep.sources.GeneratorSource(words, num_splits=2, limit=600, records_per_second=300))
    counts = src.key_by(lambda w: w.text).process("count", Count())
    counts.sink("tallies", BatchSink(os.path.join(out, "tallies")))
    (counts.map("small", lambda t: Tally(t.word, t.n % 3)).iterate("loop", body)
           .map("plain", lambda t: {"w": t.word.text, "n": t.n}).sink("loopout", FileSink(os.path.join(out, "loop"))))
    result = flow.run(runtime=runtime, backend=backends[backend],
                      checkpoint=ep.CheckpointConfig(interval=0.2, storage="file://" + ckpt, unaligned=True),
                      faults=[CrashAtRecord("count", record=300, subtask=1, how="exit", after_epoch=2)])
    from collections import Counter
    expected = Counter("w%d" % ((i * 7 + s) % 13) for s in range(2) for i in range(600))
    got = Counter()
    finals = {}
    for d in os.listdir(os.path.join(out, "tallies")):
        for f in os.listdir(os.path.join(out, "tallies", d)):
            for w, n in json.load(open(os.path.join(out, "tallies", d, f))):
                got[(w, n)] += 1
                finals[w] = max(finals.get(w, 0), n)
    want = Counter((w, n) for w, c in expected.items() for n in range(1, c + 1))
    loop = Counter(json.dumps(r, sort_keys=True) for r in read_committed(os.path.join(out, "loop")))
    want_loop = Counter(json.dumps({"w": w, "n": -1 if n % 3 == 0 else 0}, sort_keys=True) for w, n in want)
    print(json.dumps({"attempts": result.attempts, "counts_ok": got == want, "loop_ok": loop == want_loop,
                      "restored": result.restored_from}))
''')


# On Spark (a cold Spark session in the script's own process: the file's slowest case by far) under
# -m slow: the tasks of both runtimes unpickle the same plan blob (runtime/launch/worker.py), and
# Spark's workers unpickling by-value classes and functions stay in the default run
# (test_cold_start.py, every Spark test of a test module's classes).
@pytest.mark.parametrize("runtime, backend", [("local", "heap"), ("local", "heap-fork"), ("local", "rocksdb"),
                                              pytest.param("spark", "heap",
                                                           marks=[pytest.mark.spark, pytest.mark.slow])])
def test_main_script_classes_cross_channels_state_loops_and_sinks(tmp_path, runtime, backend):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(script), runtime, backend, str(tmp_path / "out"), str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=240, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-4000:]}"
    import json

    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["attempts"] == 2, report  # the crash fired and state was restored
    assert report["restored"][1] is not None
    assert report["counts_ok"] and report["loop_ok"], report
