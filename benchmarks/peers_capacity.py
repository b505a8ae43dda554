"""``peers.py``'s capacity measurement: every engine works off the same backlog of files
(see ``peers.py`` and ``capacity_runners.py``). Settings, run plan and summary."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import workload  # noqa: E402

RUNNER = Path(__file__).resolve().parent / "capacity_runners.py"

#: the common part of every engine's settings
COMMON = ("reads the files of one directory that all exist before the run starts (a backlog), splits lines on "
          "one space, counts per word; parallelism 2, local mode on this machine")

SETTINGS = {
    "epochal-columnar": {
        "engine": "epochal on embedded Spark (local mode), columnar path (Arrow batches)",
        "guarantee_short": "exactly-once, 1 s epochs",
        "settings": "guarantee='exactly-once', CheckpointConfig(interval=1.0), heap backend; ArrowFileSource "
                    "(1 MiB blocks) → map_batches(pc.split_pattern(line, ' ')) → key_by('word') → "
                    "aggregate(n=count()) (pre-aggregated before the shuffle, merged into state once per epoch) → "
                    "transactional parquet FileSink of the per-epoch updates (like Spark's update mode)",
        "exactly_once": "end to end: aligned barriers + two-phase-commit file sink",
    },
    "arrow-ceiling": {
        "engine": "single-process ceiling: the same read + split + group_by without the engine",
        "guarantee_short": "none (one process, no engine)",
        "settings": "one Python process, one core: ArrowFileSource's reader (1 MiB blocks) → pc.split_pattern → "
                    "Table.group_by count per ~1M words → partials combined into one table; nothing written",
        "exactly_once": "no fault tolerance",
    },
    "spark-ss-builtin": {
        "engine": "Spark Structured Streaming, micro-batch, built-in expressions",
        "guarantee_short": "micro-batch, checkpointLocation, availableNow",
        "settings": "readStream.text(dir) with maxFilesPerTrigger → explode(split(value, ' ')) → "
                    "groupBy(word).count() → outputMode('update') memory sink; trigger(availableNow=True), "
                    "checkpointLocation on local disk, spark.sql.shuffle.partitions=2, local[2], driver memory 3g; "
                    "the JVM warmed up by a first query in the same session",
        "exactly_once": "offsets + state checkpointed per micro-batch (write-ahead log); the memory sink is not "
                        "transactional (at-least-once output after a driver restart)",
    },
    "spark-ss-arrow-udf": {
        "engine": "Spark Structured Streaming, Python logic as an Arrow UDF (mapInArrow)",
        "guarantee_short": "micro-batch, checkpointLocation, availableNow",
        "settings": "as spark-ss-builtin, but the split is Python: lines.mapInArrow(f, 'word string') with f "
                    "yielding pa.record_batch([pc.list_flatten(pc.split_pattern(batch['value'], ' '))]) per "
                    "Arrow batch — the way a PySpark user writes vectorized Python logic",
        "exactly_once": "as spark-ss-builtin",
    },
    "spark-ss-python-udf": {
        "engine": "Spark Structured Streaming, row-at-a-time Python UDF for splitting",
        "guarantee_short": "micro-batch, checkpointLocation, availableNow",
        "settings": "as spark-ss-builtin, but explode(udf(lambda s: s.split(' '))) — a row-at-a-time Python UDF",
        "exactly_once": "as spark-ss-builtin",
    },
    "epochal": {
        "engine": "epochal on embedded Spark (local mode), record path (Python objects)",
        "guarantee_short": "exactly-once, 1 s epochs",
        "settings": "guarantee='exactly-once', CheckpointConfig(interval=1.0), heap backend; DirectorySource → "
                    "flat_map(s.split(' ')) → map((w, 1)) → key_by → reduce (a running count per input word) → "
                    "transactional jsonl FileSink",
        "exactly_once": "end to end: aligned barriers + two-phase-commit file sink",
    },
    "bytewax": {
        "engine": "Bytewax (Rust/Timely dataflow, Python operators)",
        "guarantee_short": "recovery on, 1 s epochs",
        "settings": "cluster_main(worker_count_per_proc=2, epoch_interval=1 s, RecoveryConfig with 2 partitions); "
                    "DirSource (one partition per file) → flat_map → key_on → stateful_map running count → "
                    "DirSink (2 files)",
        "exactly_once": "state and offsets snapshotted per epoch; DirSink truncates on resume",
    },
}
ENGINES = list(SETTINGS)
#: (warm-up, small, large) file counts for engines that process millions of words a second, and
#: (warm-up, small, large) for the slow ones (a warm-up of 0 files: none)
FAST, SLOW = (2, 4, None), (1, 1, 2)
PLAN = {"epochal-columnar": FAST, "arrow-ceiling": FAST, "spark-ss-builtin": FAST, "spark-ss-arrow-udf": FAST,
        "spark-ss-python-udf": SLOW, "epochal": SLOW, "bytewax": (0, 1, 2)}
IMPORTS = {"bytewax": "bytewax", "spark-ss-arrow-udf": "pandas"}  # beyond epochal's own dependencies


def input_dir(args) -> str:
    return args.input or os.path.join(args.tmp or "/tmp", f"epochal-zipf-{args.input_files}x{args.words_per_file}")


def run_engine(engine: str, args, doc: dict, work: str) -> dict:
    warm, small, large = PLAN[engine]
    large = large or args.input_files
    if args.smoke:
        warm, small, large = min(warm, 1), 1, 2
    files = ([warm] if warm else []) + [small, large]
    out = os.path.join(work, f"capacity-{engine}.json")
    cmd = [sys.executable, str(RUNNER), engine, "--input", input_dir(args), "--files", *map(str, files),
           "--parallelism", str(args.parallelism), "--files-per-trigger", str(args.files_per_trigger),
           "--work", os.path.join(work, f"capacity-{engine}"), "--out", out]
    if not warm:
        cmd += ["--no-warm-up"]
    t0, load = time.monotonic(), os.getloadavg()[0]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout * len(files), check=False)
        stderr = proc.stderr
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        partial = json.loads(Path(out + ".partial").read_text()) if os.path.exists(out + ".partial") else {}
        return {**partial, "status": "timeout", "error": f"no result after {args.run_timeout * len(files):.0f} s; "
                                                          f"stderr: {stderr[-1500:]}"}
    res = json.loads(Path(out).read_text()) if os.path.exists(out) else {
        "status": "failed", "error": f"exit {proc.returncode}, no result; stderr: {stderr[-1500:]}"}
    res["process_wall_s"] = time.monotonic() - t0
    res["loadavg_1m_before"] = load
    return res


def summarise(engine: str, res: dict) -> dict:
    entry = {"name": engine, **SETTINGS[engine], **res}
    timed = [r for r in res.get("runs", []) if not r.get("warm_up")]
    if res.get("status") != "ok" or len(timed) < 2:
        entry.setdefault("status", "failed")
        return entry
    small, large = timed[0], timed[-1]
    dt, dcpu, dw = large["seconds"] - small["seconds"], large["cpu_s"] - small["cpu_s"], large["words"] - small["words"]
    entry.update(small=small, large=large, marginal_words_per_s=dw / dt if dt > 0 else None,
                 words_per_cpu_s=dw / dcpu if dcpu > 0 else None,
                 whole_words_per_s=large["words"] / large["seconds"],
                 counts_verified=all(r["counts_verified"] for r in res["runs"]))
    return entry


def ratios(entries: list[dict], parallelism: int) -> dict:
    """Every engine against Spark SS built-in and the columnar engine against the ceiling
    (× the cores its job uses), from this invocation's figures."""
    by = {e["name"]: e for e in entries if e.get("marginal_words_per_s")}
    out = {}
    spark = by.get("spark-ss-builtin")
    if spark:
        out["vs_spark_builtin"] = {n: e["marginal_words_per_s"] / spark["marginal_words_per_s"] for n, e in by.items()}
    ceiling, columnar = by.get("arrow-ceiling"), by.get("epochal-columnar")
    if ceiling and columnar:
        cores = min(parallelism, os.cpu_count() or parallelism)
        out["columnar_fraction_of_ceiling"] = {
            "cores": cores, "ceiling_words_per_s": ceiling["marginal_words_per_s"],
            "fraction": columnar["marginal_words_per_s"] / (cores * ceiling["marginal_words_per_s"]),
            "fraction_per_cpu_s": (columnar["words_per_cpu_s"] / ceiling["words_per_cpu_s"]
                                   if columnar.get("words_per_cpu_s") and ceiling.get("words_per_cpu_s") else None)}
    return out


def check_installed(engine: str) -> str | None:
    module = IMPORTS.get(engine)
    if module is None:
        return None
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120,
                          check=False)
    if proc.returncode:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1] + \
            "  (pip install -e '.[bench,peers]')"
    return None


def run_capacity(args, work: str, t_start: float) -> dict:
    """Generate (or reuse) the input, run every engine ``--capacity-repetitions`` times
    (repetitions interleaved, engines in rotated order), summarise. Returns the JSON part:
    per engine the median repetition's figures plus every repetition's; ratios per
    repetition (engines of one repetition ran side by side) with their median."""
    t0 = time.monotonic()
    doc = workload.zipf_files(input_dir(args), args.input_files, args.words_per_file)
    part = {"input": {"directory": input_dir(args), "files": len(doc["files"]), "words_per_file": doc["words"],
                      "vocabulary": doc["spec"]["vocabulary"], "generated_or_checked_s": time.monotonic() - t0,
                      "bytes": sum(os.path.getsize(os.path.join(input_dir(args), f)) for f in doc["files"])},
            "plan": {e: PLAN[e] for e in args.capacity_engines}, "engines": []}
    reps = max(1, getattr(args, "capacity_repetitions", 1))
    runs: dict = {e: [] for e in args.capacity_engines}
    for rep in range(reps):
        for engine in harness.rotated(args.capacity_engines, rep):
            started = harness.now_iso()
            missing = check_installed(engine)
            entry = {"name": engine, **SETTINGS[engine], "status": "not installed", "error": missing} if missing \
                else summarise(engine, run_engine(engine, args, doc, work))
            entry["started_at"], entry["repetition"] = started, rep
            runs[engine].append(entry)
            print(f"[{time.monotonic() - t_start:5.0f} s] capacity rep {rep} {engine:20s} "
                  f"{entry.get('status', '?'):10s} "
                  + (f"marginal {harness.fmt(entry.get('marginal_words_per_s'))} words/s, "
                     f"{harness.fmt(entry.get('words_per_cpu_s'))} words/CPU-s, counts ok: "
                     f"{entry.get('counts_verified')}"
                     if entry.get("marginal_words_per_s") else str(entry.get("error"))[:300]), flush=True)
    part["engines"] = [_median_entry(runs[e]) for e in args.capacity_engines]
    per_rep = [ratios([runs[e][rep] for e in args.capacity_engines], args.parallelism) for rep in range(reps)]
    part["ratios"] = _median_ratios(per_rep)
    part["repetitions"] = reps
    return part


def _median_entry(entries: list[dict]) -> dict:
    """An engine's entry: its median repetition (by marginal rate) with every repetition's
    headline figures under ``repetitions``."""
    ok = sorted((e for e in entries if e.get("marginal_words_per_s")), key=lambda e: e["marginal_words_per_s"])
    base = dict(ok[(len(ok) - 1) // 2] if ok else entries[-1])
    base["repetitions"] = [{k: e.get(k) for k in ("repetition", "status", "marginal_words_per_s", "words_per_cpu_s",
                                                   "whole_words_per_s", "counts_verified", "loadavg_1m_before")}
                           for e in entries]
    base["counts_verified"] = bool(ok) and all(e.get("counts_verified") for e in ok) and len(ok) == len(entries)
    return base


def _median_ratios(per_rep: list[dict]) -> dict:
    """Per-repetition :func:`ratios` → their medians, with the raw values (``*_raw``)."""
    out: dict = {}
    vs = [r["vs_spark_builtin"] for r in per_rep if "vs_spark_builtin" in r]
    if vs:
        names = sorted({n for r in vs for n in r})
        out["vs_spark_builtin"] = {n: harness.median([r[n] for r in vs if n in r]) for n in names}
        out["vs_spark_builtin_raw"] = {n: [r[n] for r in vs if n in r] for n in names}
    fr = [r["columnar_fraction_of_ceiling"] for r in per_rep if "columnar_fraction_of_ceiling" in r]
    if fr:
        out["columnar_fraction_of_ceiling"] = {
            "cores": fr[0]["cores"],
            "ceiling_words_per_s": harness.median([f["ceiling_words_per_s"] for f in fr]),
            "fraction": harness.median([f["fraction"] for f in fr]),
            "fraction_raw": [f["fraction"] for f in fr],
            "fraction_per_cpu_s": harness.median([f["fraction_per_cpu_s"] for f in fr if f["fraction_per_cpu_s"]])}
    return out
