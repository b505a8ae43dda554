"""The record path of the keyed word count, stage by stage: CPU nanoseconds per word.

The peers workload (``benchmarks/peers.py``: ``GeneratorSource`` of lines → ``flat_map``
``str.split`` → ``key_by(word)`` → a ``KeyedProcessFunction`` running count → jsonl
``FileSink``) runs as two kinds of task: *source+split* (read, split, route by key, pickle,
send) and *count+sink* (receive, unpickle, keyed count, write). This script drives the very
classes those tasks call — the source reader, ``FlatMapOperator``, ``Router`` (with
channels that only count), ``encode_batch`` / ``pickle.loads``, a loopback TCP
``wire.Connection``, ``KeyedProcessOperator`` on a ``HeapStateBackend``, ``SinkOperator``
with a ``FileSink`` writer — in one process, one stage at a time, on the same words in
batches of ``ChannelConfig.batch_size``, and reports each stage's CPU time
(``time.process_time``: robust to other processes on a shared machine) per word, the
median over ``--repetitions``. Component lines (the stable hash alone, ``json.dumps``
alone, ...) show what a stage is made of; they overlap the stage lines and are not added.

What it leaves out: the task loop, the input gate, credits and thread hand-offs (the
py-spy profile of a real run, quoted in the report, puts them at a few percent).

    python benchmarks/record_path.py                     # ~1 min, JSON to benchmarks/results/record_path.json
    python benchmarks/record_path.py --smoke             # seconds, JSON to a temp dir
    python benchmarks/record_path.py --baseline /path/to/old/checkout --baseline-label COMMIT   # old code first

Only entry points the runtime itself uses are called, so the script runs unchanged against
older commits (components an older commit lacks are skipped): ``--baseline DIR`` runs it
first with ``PYTHONPATH=DIR`` (a checkout of another commit, e.g. ``git archive`` into a
directory), then on this checkout, and reports both and the ratios per stage.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import workload  # noqa: E402

import epochal as ep  # noqa: E402
from epochal.alignment.factory import SinkMode  # noqa: E402
from epochal.backends.heap import HeapStateBackend  # noqa: E402
from epochal.backends.keygroups import key_group_for  # noqa: E402
from epochal.config import ChannelConfig  # noqa: E402
from epochal.graph import Partitioning, PartitionKind  # noqa: E402
from epochal.operators.base import OperatorContext  # noqa: E402
from epochal.operators.keyed import KeyedProcessOperator  # noqa: E402
from epochal.operators.sink import SinkOperator  # noqa: E402
from epochal.operators.stateless import FlatMapOperator  # noqa: E402
from epochal.plan import OutputGate  # noqa: E402
from epochal.runtime.transport import wire  # noqa: E402
from epochal.runtime.transport.channels import encode_batch  # noqa: E402
from epochal.runtime.task.router import Router  # noqa: E402
from epochal.sinks import FileSink  # noqa: E402

MAX_PARALLELISM = 128
BATCH = ChannelConfig().batch_size


class WordCount(ep.KeyedProcessFunction):
    """The peers benchmark's counting function (``peer_runners.run_epochal``)."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, word, value):
        n = self.count.value() + 1
        self.count.update(n)
        yield [word, n]


def _word(w):
    return w


class _CountingChannel:
    """An output channel that takes every batch (no credit, no socket): routing cost only."""

    def __init__(self):
        self.batches = []

    def send_batch(self, records, should_stop, frame=None):
        self.batches.append(records)

    send_now = send_batch

    def send_event(self, message):
        pass


def _ctx(operator: str, subtask: int = 0, parallelism: int = 1, backend=None, **extras) -> OperatorContext:
    return OperatorContext(operator=operator, task=f"{operator}[{subtask}]", subtask=subtask,
                           parallelism=parallelism, generation=0, job="record-path",
                           max_parallelism=MAX_PARALLELISM, keyed_backend=backend,
                           key_groups=range(MAX_PARALLELISM) if backend is not None else range(0),
                           extras=extras or None)


def _cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


# ----------------------------------------------------------------------------- stages
def stage_functions(lines: list[str], tmp: str) -> dict:
    """name -> (task kind, callable running the stage once over the input, words it covers)."""
    words = [w for line in lines for w in line.split()]
    n = len(words)
    line_batches = [lines[i:i + BATCH] for i in range(0, len(lines), BATCH)]
    word_batches = [words[i:i + BATCH] for i in range(0, n, BATCH)]
    frames = [encode_batch(b) for b in word_batches]
    counts = {}
    outputs = []
    for w in words:  # the count task's output: [word, running count]
        counts[w] = counts.get(w, 0) + 1
        outputs.append([w, counts[w]])
    out_batches = [outputs[i:i + BATCH] for i in range(0, n, BATCH)]
    stages = {}

    n_lines = len(lines)

    def source_read():
        src = ep.sources.GeneratorSource(workload.lines_from, num_splits=4, limit=n_lines // 4)
        reader = src.create_reader([0, 1, 2, 3], None)
        while not reader.poll(BATCH).finished:
            pass
    stages["source read (GeneratorSource, line())"] = ("source+split", source_read)

    split = FlatMapOperator(_ctx("split"), str.split)

    def split_stage():
        for b in line_batches:
            split.process_batch(b)
    stages["split (flat_map str.split)"] = ("source+split", split_stage)

    def route_stage():
        outs = {"c0": _CountingChannel(), "c1": _CountingChannel()}
        gate = OutputGate("count", Partitioning(PartitionKind.HASH, _word), ("c0", "c1"), "split")
        router = Router([gate], outs, BATCH, 0.005, MAX_PARALLELISM, "lines[0]", lambda: False)
        for b in word_batches:
            router.route(b)
        router.flush()
    stages["route by key (key_fn, key group, append, cut)"] = ("source+split", route_stage)

    def hash_only():
        for w in words:
            key_group_for(w, MAX_PARALLELISM)
    stages["  component: key_group_for alone"] = ("component", hash_only)

    try:
        from epochal.backends.keygroups import KeyGroupAssigner
    except ImportError:  # an older commit
        KeyGroupAssigner = None
    if KeyGroupAssigner is not None:
        def assigner_only():
            assign_all = KeyGroupAssigner(MAX_PARALLELISM).assign_all
            for b in word_batches:
                assign_all(b)
        stages["  component: KeyGroupAssigner.assign_all alone"] = ("component", assigner_only)

    def pickle_stage():
        for b in word_batches:
            encode_batch(b)
    stages["pickle batch (encode_batch)"] = ("source+split", pickle_stage)

    def socket_stage():
        _send_over_loopback(frames)
    stages["channel send + recv (loopback TCP, both ends)"] = ("both", socket_stage)

    def unpickle_stage():
        for f in frames:
            pickle.loads(f)
    stages["unpickle batch (pickle.loads)"] = ("count+sink", unpickle_stage)

    def keyed_stage():
        op = KeyedProcessOperator(_ctx("count", backend=HeapStateBackend(range(MAX_PARALLELISM))),
                                  _word, WordCount())
        for b in word_batches:
            op.process_batch(b)
    stages["keyed count (KeyedProcessOperator, heap state)"] = ("count+sink", keyed_stage)

    def backend_only():
        backend = HeapStateBackend(range(MAX_PARALLELISM))
        get, put = backend.get, backend.put
        for w in words:
            kg = 5
            put("count/count", kg, w, get("count/count", kg, w, 0) + 1)
    stages["  component: backend get + put alone"] = ("component", backend_only)

    def sink_stage():
        d = tempfile.mkdtemp(dir=tmp)
        op = SinkOperator(_ctx("out", sink_mode=SinkMode.TRANSACTIONAL), FileSink(os.path.join(d, "out")))
        op.restore(None)
        for b in out_batches:
            op.process_batch(b)
        op.snapshot(1).before_ack()  # the durability step (close + fsync) of the epoch
        shutil.rmtree(d, ignore_errors=True)
    stages["sink (SinkOperator, FileSink jsonl, one epoch)"] = ("count+sink", sink_stage)

    def json_only():
        dumps = json.dumps
        for r in outputs:
            dumps(r).encode("utf-8")
    stages["  component: json.dumps per record alone"] = ("component", json_only)
    return {name: (kind, fn, n) for name, (kind, fn) in stages.items()}


def _send_over_loopback(frames: list[bytes]) -> None:
    """Frames through one authenticated-style framed TCP connection, read on a thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    tx, rx = wire.Connection(client), wire.Connection(server)

    def drain():
        for _ in frames:
            rx.recv_bytes()
    t = threading.Thread(target=drain)
    t.start()
    for f in frames:
        tx.send_bytes(f)
    t.join()
    tx.close()
    rx.close()


# ----------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=None, help="input lines (default 200000, 8000 with --smoke)")
    p.add_argument("--repetitions", type=int, default=None, help="default 5 (2 with --smoke)")
    p.add_argument("--only", default=None, help="run only the stages whose name contains this text")
    p.add_argument("--baseline", type=Path, default=None,
                   help="a checkout of another commit: measured first, with PYTHONPATH=BASELINE")
    p.add_argument("--baseline-label", default=None, help="what the baseline is, e.g. its commit")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args(argv)
    args.lines = args.lines or (8000 if args.smoke else 200_000)
    args.repetitions = args.repetitions or (2 if args.smoke else 5)
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="epochal-bench-smoke-")) / "record_path.json" if args.smoke
                    else harness.RESULTS / "record_path.json")
    return args


def run_baseline(args) -> dict:
    """This script on the code in ``args.baseline``, in a subprocess; its JSON document."""
    out = Path(tempfile.mkdtemp(prefix="epochal-record-path-baseline-")) / "baseline.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--lines", str(args.lines),
           "--repetitions", str(args.repetitions), "--out", str(out)] + (["--only", args.only] if args.only else [])
    env = dict(os.environ, PYTHONPATH=str(args.baseline.resolve()))
    print(f"baseline: {args.baseline}", flush=True)
    subprocess.run(cmd, env=env, check=True, cwd=out.parent)
    doc = json.loads(out.read_text())
    shutil.rmtree(out.parent, ignore_errors=True)
    return doc


def main(argv=None) -> int:
    args = parse_args(argv)
    baseline = run_baseline(args) if args.baseline else None
    info = harness.machine()
    lines = [workload.line(s, i) for s in range(4) for i in range(args.lines // 4)]
    tmp = tempfile.mkdtemp(prefix="epochal-record-path-")
    stages = stage_functions(lines, tmp)
    if args.only:
        stages = {k: v for k, v in stages.items() if args.only in k}
    print(f"record path: {len(lines)} lines, {next(iter(stages.values()))[2]} words, batch {BATCH}, "
          f"{args.repetitions} repetitions, load {info['loadavg_at_start']}", flush=True)
    raw: dict[str, list[float]] = {name: [] for name in stages}
    for rep in range(args.repetitions):  # stages interleaved: a drift hits every stage alike
        for name, (_, fn, n) in stages.items():
            raw[name].append(_cpu(fn) / n * 1e9)
    results = []
    totals: dict[str, float] = {}
    for name, (kind, _, n) in stages.items():
        med = statistics.median(raw[name])
        results.append({"stage": name.strip(), "task": kind, "ns_per_word": med,
                        "min": min(raw[name]), "max": max(raw[name]), "raw": raw[name]})
        if kind != "component":
            totals[kind] = totals.get(kind, 0.0) + med
        print(f"  {kind:12s} {name:52s} {med:8.0f} ns/word  (min {min(raw[name]):.0f}, max {max(raw[name]):.0f})")
    for kind, total in totals.items():
        print(f"  {kind:12s} {'total':52s} {total:8.0f} ns/word  → {1e9 / total:,.0f} words/s per core")
    doc = {**harness.new_doc("record_path", args, info), "words": next(iter(stages.values()))[2],
           "batch_size": BATCH, "stages": results, "totals_ns_per_word": totals,
           "loadavg_at_end": list(os.getloadavg())}
    if baseline is not None:
        doc["baseline"] = {"label": args.baseline_label, "path": str(args.baseline),
                           **{k: baseline[k] for k in ("stages", "totals_ns_per_word", "loadavg_at_end")},
                           "loadavg_at_start": baseline["machine"]["loadavg_at_start"]}
        before = {st["stage"]: st["ns_per_word"] for st in baseline["stages"]}
        doc["speedup_vs_baseline"] = {st["stage"]: before[st["stage"]] / st["ns_per_word"]
                                      for st in results if st["stage"] in before}
        doc["speedup_vs_baseline"].update({f"total {k}": baseline["totals_ns_per_word"][k] / v
                                           for k, v in totals.items() if k in baseline["totals_ns_per_word"]})
        print("speed-up vs baseline (baseline ns / this ns):")
        for name, ratio in doc["speedup_vs_baseline"].items():
            print(f"  {name:62s} {ratio:5.2f}x")
    harness.write_json(args.out, doc)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
