"""The same keyed word count on epochal and on the engines users would pick instead — in one run.

Two measurements, one invocation, every engine in its own process with a timeout:

**Capacity on a backlog** (``capacity_runners.py``, the headline): every engine reads the
same directory of text files (``workload.zipf_files``: a Zipf vocabulary of 20k words,
1–8 words a line, written before anything is timed), splits lines on one space, counts per
word, parallelism 2 on this 2-core machine. Each engine runs in one process: a warm-up run
(Spark's JIT and Python workers, epochal's task processes), then a *small* and a *large*
input (the first k files), each a new query / dataflow over files that all exist when it
starts. **Marginal words/s** = (words_large − words_small) / (T_large − T_small): start-up
cancels, what remains is the rate at which the engine works off a backlog — the figure a
user sizing a cluster needs. Spark runs with large micro-batches
(``trigger(availableNow=True)``, ``maxFilesPerTrigger``). Also per engine: words per CPU
second (the same subtraction on the CPU time of the process tree: on a shared machine less
sensitive to other tenants than wall time), and the **single-process Arrow ceiling**
(``arrow-ceiling``: epochal's file reader, Arrow split and ``group_by`` in one process, no
engine), so the report shows the fraction of (ceiling × 2 cores) the columnar engine reaches.
Every run's final count per word is checked against a plain-Python count of its files.
``--capacity-repetitions N`` runs every engine N times, interleaved in rotated order; the
table shows each engine's median repetition with the range, and ratios are computed per
repetition (the engines of one repetition ran side by side) — on this noisy machine one
invocation's ratio moved between 2.0× and 2.75× before repetitions were added.

**Steady at 1 s** (``peer_runners.py``, the earlier measurement, kept as a second column):
the generated lines of ``tests/pipelines.py`` ``line(split, i)`` with a 1 s checkpoint /
trigger interval; each engine's own throughput samples (epochal's progress events, Spark's
``processedRowsPerSecond``) and the marginal lines/s between two input sizes.

    python benchmarks/peers.py                                  # all engines (~25 min)
    python benchmarks/peers.py --skip-steady --capacity-engines epochal-columnar arrow-ceiling spark-ss-builtin
    python benchmarks/peers.py --skip-steady --merge --capacity-repetitions 3   # re-run the capacity table only
    python benchmarks/peers.py --smoke
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import peers_capacity  # noqa: E402

RUNNER = Path(__file__).resolve().parent / "peer_runners.py"
DEFAULT_FLINK_PYTHON = "/work/venv-flink/bin/python"

SETTINGS = {
    "epochal": {
        "engine": "epochal on embedded Spark (local mode)",
        "guarantee_short": "exactly-once, 1 s epochs",
        "settings": "guarantee='exactly-once', CheckpointConfig(interval=1.0, storage=file://), heap backend; "
                    "GeneratorSource (4 splits) → flat_map(split) → key_by(word) → KeyedProcessFunction running "
                    "count → transactional jsonl FileSink (published at epoch completion); 5 tasks, parallelism 2",
        "exactly_once": "end to end: aligned barriers + two-phase-commit file sink; a restart replays from the "
                        "last completed epoch and the committed output equals a failure-free run",
    },
    "epochal-columnar": {
        "engine": "epochal on embedded Spark (local mode), columnar path (Arrow batches)",
        "guarantee_short": "exactly-once, 1 s epochs",
        "settings": "guarantee='exactly-once', CheckpointConfig(interval=1.0), heap backend; ArrowFileSource over "
                    "the same text files Spark reads → map_batches(pyarrow.compute split) → key_by('word') → "
                    "vectorized count() emitting the updated words per epoch → transactional jsonl FileSink; "
                    "parallelism 2. Output volume like Spark's update mode (one row per word updated in an epoch)",
        "exactly_once": "as epochal: aligned barriers + two-phase-commit file sink",
    },
    "spark-ss-builtin": {
        "engine": "Spark Structured Streaming, micro-batch, built-in expressions",
        "guarantee_short": "micro-batch, checkpointLocation, 1 s trigger",
        "settings": "readStream.text(dir) of files written upfront (10k lines each, maxFilesPerTrigger=2) → "
                    "explode(split(value, ' ')) → groupBy(word).count() → outputMode('update') memory sink; "
                    "trigger(processingTime='1 second'), checkpointLocation on local disk, "
                    "spark.sql.shuffle.partitions=2, local[2]; timed until processAllAvailable() returns. "
                    "Output volume differs: update mode writes one row per word changed in a micro-batch "
                    "(at most 11 per batch), the other engines one running count per input word",
        "exactly_once": "offsets + state checkpointed per micro-batch (write-ahead log), so state is exactly-once; "
                        "the memory sink is not idempotent/transactional, so output after a driver restart is "
                        "at-least-once (exactly-once needs an idempotent sink such as the file sink in append "
                        "mode, which cannot take update-mode aggregations). Checkpoints are per micro-batch, "
                        "synchronous with processing: latency ≥ batch duration",
    },
    "spark-ss-python-udf": {
        "engine": "Spark Structured Streaming, micro-batch, Python UDF for splitting",
        "guarantee_short": "micro-batch, checkpointLocation, 1 s trigger",
        "settings": "as spark-ss-builtin, but explode(udf(lambda s: s.split())) — a row-at-a-time Python UDF "
                    "(Arrow optimisation off: pandas is not installed)",
        "exactly_once": "as spark-ss-builtin",
    },
    "spark-continuous-builtin": {
        "engine": "Spark continuous processing (trigger continuous='1 second'), stateless half only",
        "guarantee_short": "continuous, at-least-once",
        "settings": "rate source (the only bundled continuous source besides Kafka) at an offered rate; the line "
                    "formula in SQL; split + explode → memory sink; local[4]",
        "exactly_once": "no: continuous processing is at-least-once and supports no aggregation (no keyed count)",
    },
    "spark-continuous-python-udf": {
        "engine": "Spark continuous processing, Python UDF for splitting, stateless half only",
        "guarantee_short": "continuous, at-least-once",
        "settings": "as spark-continuous-builtin with a Python UDF",
        "exactly_once": "no (as spark-continuous-builtin)",
    },
    "pyflink": {
        "engine": "Apache Flink (PyFlink DataStream API, local mini-cluster)",
        "guarantee_short": "exactly-once checkpoints, 1 s",
        "settings": "enable_checkpointing(1000, CheckpointingMode.EXACTLY_ONCE), parallelism 2, default "
                    "hashmap state backend; NumberSequenceSource → map(line) → flat_map(split) → key_by(word) → "
                    "reduce (running count) → FileSink row format (commits part files on checkpoints); "
                    "restart-strategy none; Python functions run in Flink's Beam Python workers",
        "exactly_once": "end to end with FileSink (two-phase commit on checkpoint completion)",
    },
    "bytewax": {
        "engine": "Bytewax (Rust/Timely dataflow, Python operators)",
        "guarantee_short": "recovery on, 1 s epochs",
        "settings": "cluster_main(worker_count_per_proc=2, epoch_interval=1 s, RecoveryConfig(db_dir) with 2 "
                    "partitions initialised by init_db_dir); partitioned resumable source (4 splits) → flat_map "
                    "→ key_on → stateful_map count → DirSink (2 files)",
        "exactly_once": "state and source offsets snapshotted per epoch; DirSink truncates files on resume, so "
                        "output is exactly-once for this batch-like input ('Can support exactly-once processing "
                        "in a batch context'); workers are threads of one process",
    },
}
ENGINES = list(SETTINGS)
IMPORTS = {"epochal": "epochal", "epochal-columnar": "epochal", "spark-ss-builtin": "pyspark", "spark-ss-python-udf": "pyspark",
           "spark-continuous-builtin": "pyspark", "spark-continuous-python-udf": "pyspark",
           "pyflink": "pyflink", "bytewax": "bytewax"}


def interpreter(engine: str, args) -> str:
    return args.flink_python if engine == "pyflink" else sys.executable


def check_installed(engine: str, args) -> str | None:
    """None if the engine imports in its interpreter, else the error text."""
    python = interpreter(engine, args)
    if not os.path.exists(python):
        return (f"no interpreter {python}: apache-flink cannot share epochal's environment (through apache-beam "
                "it pins cloudpickle~=2.2.1, epochal needs cloudpickle>=3; it also downgrades py4j and pyarrow). "
                "Create one: "
                f"python -m venv /work/venv-flink && /work/venv-flink/bin/pip install apache-flink")
    proc = subprocess.run([python, "-c", f"import {IMPORTS[engine]}"], capture_output=True, text=True, timeout=120,
                          check=False)
    if proc.returncode != 0:
        return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    return None


def run_engine(engine: str, lines: int, args, work: str) -> dict:
    out = os.path.join(work, f"{engine}-{lines}.json")
    cmd = [interpreter(engine, args), str(RUNNER), engine, "--lines", str(lines), "--splits", str(args.splits),
           "--parallelism", str(args.parallelism), "--work", os.path.join(work, f"{engine}-{lines}"), "--out", out]
    # continuous queries run a fixed 15 s; one that has not answered a minute later is stuck
    timeout = min(args.run_timeout, 90.0) if "continuous" in engine else args.run_timeout
    t0 = time.monotonic()
    load = os.getloadavg()[0]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        partial = json.loads(Path(out + ".partial").read_text()) if os.path.exists(out + ".partial") else {}
        return {"status": "timeout", **partial,
                "error": "; ".join(filter(None, [partial.get("explode_error"),
                                                 f"no result after {timeout:.0f} s; stderr: {_errors(err)}"])),
                "loadavg_1m_before": load}
    res = json.loads(Path(out).read_text()) if os.path.exists(out) else {
        "status": "failed", "error": f"exit {proc.returncode}, no result; stderr: {_errors(proc.stderr)}"}
    res["process_wall_s"] = time.monotonic() - t0
    res["loadavg_1m_before"] = load
    return res


def _errors(stderr: str, limit: int = 1500) -> str:
    """The telling lines of a JVM/Python stderr: errors and exceptions, not stack frames."""
    keep = [ln.strip() for ln in stderr.splitlines()
            if any(k in ln for k in ("Error", "Exception", "error:", "Caused by")) and not ln.strip().startswith("at ")]
    text = " | ".join(dict.fromkeys(keep)) or stderr.strip()[-limit:]
    return text[:limit]


def summarise(engine: str, small: dict, large: dict) -> dict:
    entry = {"name": engine, **SETTINGS[engine], "small": small, "large": large}
    bad = next((r for r in (large, small) if r.get("status") != "ok"), None)
    if bad is not None:
        entry.update(status=bad["status"], error=bad.get("error"))
        return entry
    entry["status"] = "ok"
    if "words" in large:  # continuous: a stateless stream at an offered rate, not comparable
        entry["words_per_s"] = large["words_per_s"]
        entry["note"] = (f"ran {large['seconds']:.0f} s at an offered {large['offered_lines_per_s']:,} lines/s "
                         f"(rate source, 2 partitions), {large.get('sink_rows', 0):,} rows / {large['words']:,} words "
                         "reached the memory sink — an offered-load run, not a maximum throughput; "
                         f"{large.get('explode_error', '')}").strip("; ")
        return entry
    entry["counts_verified"] = bool(small.get("counts_verified") and large.get("counts_verified"))
    if large.get("steady_lines_per_s"):  # the engine's own steady-state rate (see the runner)
        entry["engine_steady_lines_per_s"] = large["steady_lines_per_s"]
        entry["engine_steady_words_per_s"] = large["steady_lines_per_s"] * WORDS_PER_LINE
        entry["engine_steady_source"] = large.get("steady_source")
    dt = large["seconds"] - small["seconds"]
    entry["steady_lines_per_s"] = (large["lines"] - small["lines"]) / dt if dt > 0 else None
    entry["fixed_cost_s"] = (small["seconds"] - small["lines"] / entry["steady_lines_per_s"]
                             if entry["steady_lines_per_s"] else None)
    return entry


#: words per line of the shared input (``peer_runners.line``: 1–6 words, uniform): 3.5
WORDS_PER_LINE = 3.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--capacity-engines", nargs="+", choices=peers_capacity.ENGINES, default=None,
                   help="default: all (with --smoke: epochal-columnar, arrow-ceiling, spark-ss-builtin)")
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=ENGINES, help="engines of the steady-at-1 s runs")
    p.add_argument("--capacity-repetitions", type=int, default=1,
                   help="capacity: runs of every engine, interleaved in rotated order (ratios per repetition)")
    p.add_argument("--skip-capacity", action="store_true")
    p.add_argument("--skip-steady", action="store_true")
    p.add_argument("--input", default=None, help="capacity input directory (default: <tmp>/epochal-zipf-FxW, "
                                                 "generated once and reused)")
    p.add_argument("--input-files", type=int, default=None, help="capacity input files (default 40, 2 with --smoke)")
    p.add_argument("--words-per-file", type=int, default=None, help="default 5,000,000 (200,000 with --smoke)")
    p.add_argument("--files-per-trigger", type=int, default=10,
                   help="Spark's maxFilesPerTrigger in the capacity runs (large micro-batches)")
    p.add_argument("--tmp", default=None)
    p.add_argument("--small-lines", type=int, default=None, help="default 20000 (2000 with --smoke)")
    p.add_argument("--large-lines", type=int, default=None, help="default 200000 (8000 with --smoke)")
    p.add_argument("--columnar-scale", type=int, default=None,
                   help="the columnar engine reads this many times more lines (default 50, 2 with --smoke): at "
                        "millions of words/s, 200k lines last 0.1 s — too short for a steady state")
    p.add_argument("--epochal-scale", type=int, default=None,
                   help="the epochal record-path engine reads this many times more lines (default 5, 1 with "
                        "--smoke), for enough progress events in its steady state")
    p.add_argument("--splits", type=int, default=4)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--run-timeout", type=float, default=300.0, help="s per engine run")
    p.add_argument("--flink-python", default=os.environ.get("EPOCHAL_FLINK_PYTHON", DEFAULT_FLINK_PYTHON),
                   help="interpreter with apache-flink installed (a separate venv; see SETTINGS)")
    p.add_argument("--merge", action="store_true",
                   help="keep the other engines' entries of an existing --out JSON (re-run some engines only)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    args.small_lines = args.small_lines or (2000 if args.smoke else 20_000)
    args.large_lines = args.large_lines or (8000 if args.smoke else 200_000)
    args.columnar_scale = args.columnar_scale or (2 if args.smoke else 50)
    args.epochal_scale = args.epochal_scale or (1 if args.smoke else 5)
    args.input_files = args.input_files or (2 if args.smoke else 40)
    args.capacity_engines = args.capacity_engines or (["epochal-columnar", "arrow-ceiling", "spark-ss-builtin"]
                                                      if args.smoke else peers_capacity.ENGINES)
    args.words_per_file = args.words_per_file or (200_000 if args.smoke else 5_000_000)
    if args.out is None:
        args.out = (Path(tempfile.mkdtemp(prefix="epochal-bench-smoke-")) / "peers.json" if args.smoke
                    else harness.RESULTS / "peers.json")
    if args.smoke and args.input is None:
        args.tmp = args.tmp or str(args.out.parent)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    info = harness.machine()
    doc = {**harness.new_doc("peers", args, info), "peers": []}
    print(f"peers benchmark: capacity={[] if args.skip_capacity else args.capacity_engines} "
          f"steady={[] if args.skip_steady else args.engines} cores={info['cpu_count']} "
          f"load={info['loadavg_at_start']}", flush=True)
    kept = []
    if args.merge and args.out.exists():  # the earlier invocation stays the document; this one is listed
        earlier = json.loads(args.out.read_text())
        kept = [p for p in earlier["peers"] if p["name"] not in args.engines or args.skip_steady]
        for p in kept:
            p.setdefault("from_earlier_invocation", True)
        merged = earlier.get("merges", []) + [{
            "command": doc["command"], "started_at": doc["started_at"],
            "engines": [] if args.skip_steady else args.engines,  # steady-at-1 s runs re-done
            "capacity_engines": [] if args.skip_capacity else args.capacity_engines or peers_capacity.ENGINES}]
        doc.update({k: earlier[k] for k in ("command", "started_at", "machine", "config", "capacity") if k in earlier})
        doc["merges"] = merged
    work = tempfile.mkdtemp(prefix="epochal-peers-", dir=args.tmp)
    t_start = time.monotonic()
    if not args.skip_capacity:
        doc["capacity"] = peers_capacity.run_capacity(args, work, t_start)
        harness.write_json(args.out, doc)
    for engine in [] if args.skip_steady else args.engines:
        started = harness.now_iso()
        missing = check_installed(engine, args)
        if missing:
            entry = {"name": engine, **SETTINGS[engine], "status": "not installed", "error": missing}
        else:
            scale = {"epochal-columnar": args.columnar_scale, "epochal": args.epochal_scale}.get(engine, 1)
            small = run_engine(engine, args.small_lines * scale, args, work)
            once = "continuous" in engine  # a fixed-duration run at an offered rate: once is enough
            large = run_engine(engine, args.large_lines * scale, args, work) if small.get("status") == "ok" \
                and not once else small
            entry = summarise(engine, small, large)
        entry["started_at"] = started
        doc["peers"].append(entry)
        print(f"[{time.monotonic() - t_start:5.0f} s] steady {engine:28s} {entry['status']:13s} "
              + (f"marginal {harness.fmt(entry.get('steady_lines_per_s'))} lines/s, whole "
                 f"{harness.fmt(entry['large'].get('lines_per_s'))} lines/s, counts ok: {entry.get('counts_verified')}"
                 if entry["status"] == "ok" and "words_per_s" not in entry
                 else f"{harness.fmt(entry.get('words_per_s'))} words/s {entry.get('note', '')}"
                 if entry["status"] == "ok" else str(entry.get("error"))[:300]), flush=True)
        harness.write_json(args.out, doc)  # partial results survive an interrupted run
    doc["finished_at"] = harness.now_iso()
    doc["loadavg_at_end"] = list(os.getloadavg())
    order = {name: i for i, name in enumerate(ENGINES)}
    doc["peers"] = sorted(kept + doc["peers"], key=lambda p: order.get(p["name"], len(order)))
    harness.write_json(args.out, doc)
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
