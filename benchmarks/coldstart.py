"""Cold start: a fresh Python process → the first committed record of a tiny exactly-once job.

Each measurement starts a new Python process (``--child``) that imports epochal, builds a
1,000-record job (collection source → map → key_by → reduce → jsonl FileSink, parallelism
2, exactly-once) and runs it on embedded Spark; a reader thread lists the sink directory
every 2 ms. The child reports, in seconds since the parent spawned it:

* ``import_s`` — ``import epochal`` done;
* ``session_s`` — the SparkSession exists (JVM up; reported by the launcher, which starts
  it while the graph is planned, see :mod:`epochal.runtime.launch.spark`);
* ``launched_s`` / ``connected_s`` / ``running_s`` — the driver's attempt milestones: the
  barrier stage submitted, every task said hello (Python workers started), every task
  restored and opened its operators;
* ``first_trigger_s`` / ``first_complete_s`` — the first epoch triggered / completed;
* ``first_visible_s`` — the reader saw the first committed record;
* ``done_s`` — ``run()`` returned; ``exit_s`` (parent side) — the process ended.

``--runs N`` spawns N children per mode, interleaved; with ``--warm`` one child runs the job N
times (session reuse across ``run()`` calls in one process). The README example is timed
too (``--example``: ``examples/wordcount.py`` whole, as a user runs it). Modes:

* ``now`` — this checkout, with the JVM class archive (:mod:`epochal.runtime.launch.jvm_archive`)
  made beforehand, as every run after a machine's first finds it;
* ``no-archive`` — this checkout with ``EPOCHAL_JVM_CACHE=off`` (a machine's first run);
* ``base`` — the epochal source tree given by ``--base DIR`` (e.g. a worktree of the commit
  before issue 24) on ``PYTHONPATH``, same Python and Spark: the side-by-side reference.

    python benchmarks/coldstart.py [--runs 3] [--example] [--warm 3] [--base DIR] [--smoke] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "coldstart.json"
CACHE_ENV = "EPOCHAL_JVM_CACHE"
REPO = Path(__file__).resolve().parent.parent


def _child(spawned_at: float, runs: int) -> None:
    """One fresh process: import, build, run ``runs`` times; print the milestones as JSON."""
    since = lambda t: round(t - spawned_at, 4)  # noqa: E731 - wall-clock seconds since spawn
    import epochal as ep
    from epochal.sinks import FileSink, read_committed

    out = {"import_s": since(time.time()), "runs": []}
    for i in range(runs):
        tmp = tempfile.mkdtemp(prefix="epochal-coldstart-")
        sink_dir = os.path.join(tmp, "out")
        t_start = time.time()
        flow = ep.Dataflow("coldstart", parallelism=2)
        (flow.source("numbers", ep.sources.CollectionSource(list(range(1000))))
             .map("double", lambda x: x * 2)
             .key_by(lambda x: x % 10)
             .reduce("sum", lambda a, b: a + b)
             .sink("out", FileSink(sink_dir, format="jsonl")))
        seen: dict = {}
        stop = threading.Event()

        def watch():
            while not stop.is_set() and "first_visible" not in seen:
                if os.path.isdir(sink_dir) and any(n.startswith("part-") for n in os.listdir(sink_dir)):
                    seen["first_visible"] = time.time()
                    return
                time.sleep(0.002)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        result = flow.run(guarantee="exactly-once", checkpoint=ep.CheckpointConfig(interval="1s",
                                                                                   storage=f"file://{tmp}/ckpt"))
        t_done = time.time()
        stop.set()
        watcher.join()
        attempt = result.attempt_timeline[0]
        t0 = t_done - result.duration_s  # the driver's start, on the wall clock
        epochs = result.completed_epochs
        first = epochs[0] if epochs else None
        rec = {
            "run": i, "start_s": since(t_start),
            "launched_s": since(t0 + attempt["launched_s"]),
            "connected_s": since(t0 + attempt["connected_s"]) if attempt.get("connected_s") else None,
            "running_s": since(t0 + attempt["running_s"]) if attempt.get("running_s") else None,
            "first_trigger_s": since(first["wall_time"] - first["duration_s"]) if first else None,
            "first_complete_s": since(first["wall_time"]) if first else None,
            "first_visible_s": since(seen["first_visible"]) if "first_visible" in seen else None,
            "done_s": since(t_done),
            "epochs": len(epochs),
            "records": sum(1 for _ in read_committed(sink_dir)),
            "startup": dict(result.startup) if getattr(result, "startup", None) else {},
        }
        out["runs"].append(rec)
    print("COLDSTART " + json.dumps(out), flush=True)


def _env(mode: str, base: str | None) -> dict:
    env = dict(os.environ)
    if mode == "base":
        env["PYTHONPATH"] = base
        env[CACHE_ENV] = "off"
    elif mode == "no-archive":
        env[CACHE_ENV] = "off"
    return env


def _spawn(args: list[str], env: dict, timeout: float = 300.0) -> tuple[float, float, str]:
    """Run a child process; return (spawn wall time, its wall duration, stdout)."""
    t0 = time.time()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    elapsed = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return t0, elapsed, proc.stdout


def measure_job(runs_in_process: int, env: dict) -> dict:
    t0, elapsed, stdout = _spawn([sys.executable, __file__, "--child", repr(time.time()), str(runs_in_process)], env)
    line = next(ln for ln in stdout.splitlines() if ln.startswith("COLDSTART "))
    data = json.loads(line[len("COLDSTART "):])
    data["exit_s"] = elapsed
    return data


def measure_example(env: dict) -> dict:
    _t0, elapsed, stdout = _spawn([sys.executable, str(REPO / "examples" / "wordcount.py")], env)
    ok = "committed output equals a failure-free count: yes" in stdout
    return {"whole_s": elapsed, "exact": ok, "stdout": stdout.strip().splitlines()[-8:]}


def _ensure_archive() -> None:
    """Make the JVM class archive now if this machine has none (mode ``now`` measures runs
    that find it), waiting for it."""
    from epochal.runtime.launch import jvm_archive
    from epochal.runtime.launch.spark import LOCAL_JAVA_OPTIONS

    path = jvm_archive.archive_path(LOCAL_JAVA_OPTIONS)
    if path is not None and not path.is_file():
        print(f"making the JVM class archive {path} ...", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        jvm_archive.generate(path, LOCAL_JAVA_OPTIONS)


def main() -> None:
    parser = argparse.ArgumentParser(description="cold start to the first committed record")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=3, help="fresh processes running the tiny job")
    parser.add_argument("--warm", type=int, default=3, help="runs of the tiny job inside one process")
    parser.add_argument("--example", action="store_true", help="also time examples/wordcount.py whole")
    parser.add_argument("--base", help="an epochal source tree to compare with (mode 'base')")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.child:
        _child(float(args.child[0]), int(args.child[1]))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness

    if args.smoke:
        args.runs, args.warm, args.example = 1, 2, False
    modes = ["now", "no-archive"] + (["base"] if args.base else [])
    if args.smoke:
        modes = ["now"]
    out = args.out or (Path(tempfile.mkdtemp()) / "coldstart.json" if args.smoke else RESULTS)
    started = harness.now_iso()
    machine = harness.machine()
    if "now" in modes:
        _ensure_archive()
    cold, examples = [], []
    for r in range(args.runs):
        for mode in harness.rotated(modes, r):
            env = _env(mode, args.base)
            load = os.getloadavg()[0]
            data = measure_job(1, env)
            data.update(mode=mode, repetition=r, loadavg=load)
            cold.append(data)
            run = data["runs"][0]
            print(f"{mode:>10} {r}: import {data['import_s']:.2f} s, launched {run['launched_s']:.2f} s, connected "
                  f"{run['connected_s']:.2f} s, running {run['running_s']:.2f} s, first commit "
                  f"{run['first_complete_s']:.2f} s, first visible {run['first_visible_s']:.2f} s, done "
                  f"{run['done_s']:.2f} s, exit {data['exit_s']:.2f} s (load {load:.1f})", flush=True)
            if args.example:
                load = os.getloadavg()[0]
                ex = measure_example(env)
                ex.update(mode=mode, repetition=r, loadavg=load)
                examples.append(ex)
                print(f"{mode:>10} {r}: example {ex['whole_s']:.2f} s whole, output exact: {ex['exact']} "
                      f"(load {load:.1f})", flush=True)
    warm = None
    if args.warm > 1:
        warm = measure_job(args.warm, _env("now", None))
        for run in warm["runs"]:
            print(f"warm run {run['run']}: first visible {run['first_visible_s'] - run['start_s']:.2f} s after "
                  f"run() began, whole run {run['done_s'] - run['start_s']:.2f} s", flush=True)
    summary = {}
    for mode in modes:
        firsts = [c["runs"][0]["first_visible_s"] for c in cold if c["mode"] == mode]
        whole = [e["whole_s"] for e in examples if e["mode"] == mode]
        summary[mode] = {"first_visible_s": harness.summary(firsts), "example_s": harness.summary(whole)}
    for mode in modes:
        first = harness.fmt(summary[mode]["first_visible_s"]["median"], ".2f")
        print(f"{mode:>10}: first committed record median {first} s"
              + (f", example median {harness.fmt(summary[mode]['example_s']['median'], '.2f')} s" if examples else ""))
    harness.write_json(out, {"benchmark": "coldstart", "command": " ".join(sys.argv), "started_at": started,
                             "finished_at": harness.now_iso(), "machine": machine,
                             "modes": modes, "summary": summary, "cold": cold, "warm": warm,
                             "example": examples})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
