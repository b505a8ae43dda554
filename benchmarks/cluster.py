"""The word count on a two-host Spark standalone cluster vs embedded local Spark — one run.

The cluster is the test suite's (``tests/standalone.py``): a Master and the drivers in the
root network namespace, two Workers (8 cores each) in two namespaces joined by a bridge,
so every record between tasks on different "hosts" crosses a veth pair and a bridge, TLS-
encrypted by default. All variants run the same two-shuffle keyed word count
(``throughput.wordcount`` plus a time stamp on every output record) on the same
unthrottled input, exactly-once, 1 s checkpoints, with checkpoints and output on a path all
hosts share (``ClusterConfig.shared_paths``; the namespaces share this machine's disk) so
that storage is the same for every variant:

==================  ==========================================================
local               embedded local Spark (``local[16]``), its own driver process
cluster             the two-host cluster, channels encrypted (the default there)
cluster-plain       the same with ``ChannelConfig(encryption=False)``
cluster-host-loss   the cluster; every process of worker host 2 SIGKILLed after the
                    first completed checkpoint; the job restarts on host 1 alone
==================  ==========================================================

Each run is its own driver process (``--driver``), as a user's would be. Measured per run:
the steady rate at the sink — output records / (last − first record time stamp at the
sink), so start-up never counts — checkpoint p50 / p99 of the periodic epochs, and for the
host loss the restart: failure seen by the coordinator → every task of the next attempt
restored and running (``JobResult.attempt_timeline``). Every run's committed output is
checked against a plain-Python count. Repetitions are interleaved (rotated order).

    sudo python benchmarks/cluster.py                   # 400k lines, 2 repetitions
    sudo python benchmarks/cluster.py --smoke           # small, temp output
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import harness  # noqa: E402
import workload  # noqa: E402

VARIANTS = ("local", "cluster", "cluster-plain", "cluster-host-loss")


# ---------------------------------------------------------------------- the driver process
def driver(args) -> int:
    """Run one job (in its own process) and write its measurements to ``args.result``."""
    import cloudpickle

    import throughput

    cloudpickle.register_pickle_by_value(workload)
    cloudpickle.register_pickle_by_value(throughput)
    import epochal as ep
    from epochal.sinks import read_committed
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(args.master).appName(f"bench-{args.variant}")
    builder = (builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", args.driver_host).config("spark.python.worker.reuse", "true"))
    if args.master.startswith("local"):
        builder = builder.config("spark.driver.bindAddress", args.driver_host)
    else:  # the cluster's authenticated, encrypted RPC (tests/standalone.py)
        for k, v in json.loads(os.environ.get("EPOCHAL_TEST_SPARK_CONF", "{}")).items():
            builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if not args.master.startswith("local"):  # start on a warm cluster: executors on both hosts
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            execs = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().keySet().mkString(",")
            if len({a.rsplit(":", 1)[0] for a in execs.split(",")} - {args.driver_host}) >= 2:
                break
            time.sleep(0.2)
    out, ckpt = os.path.join(args.work, "out"), "file://" + os.path.join(args.work, "ckpt")
    flow = stamped_wordcount(ep, throughput, out, args.lines, args.parallelism)
    t0 = time.monotonic()
    result = flow.run(spark=spark, guarantee="exactly-once",
                      checkpoint=ep.CheckpointConfig(interval=1.0, storage=ckpt),
                      channels=ep.ChannelConfig(encryption=None if args.encryption == "auto"
                                                else args.encryption == "on"),
                      cluster=ep.ClusterConfig(shared_paths=[args.work]),
                      restart=ep.RestartStrategy(max_attempts=3))
    wall = time.monotonic() - t0
    rows = list(read_committed(out))
    stamps = sorted(r[-1] for r in rows)
    got = collections.Counter(json.dumps(r[:-1]) for r in rows)
    doc = {
        "wall_s": wall, "attempts": result.attempts, "failures": result.failures,
        "encrypted": result.encrypted, "output_records": len(rows),
        "steady_records_per_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None,
        "sink_span_s": stamps[-1] - stamps[0] if stamps else None,
        "lines": result.records_in,
        "hosts": sorted({m.get("host") for m in result.task_metrics.values()}),
        "checkpoints_s": [e["duration_s"] for e in result.completed_epochs if e["reason"] == "periodic"],
        "timeline": result.attempt_timeline,
        "output_equals_oracle": got == oracle(args.lines),
    }
    with open(args.result, "w") as f:
        json.dump(doc, f)
    spark.stop()
    return 0


def stamped_wordcount(ep, throughput, out: str, lines: int, parallelism: int):
    """``throughput.wordcount`` (same source, operators and sink) with one more map before
    the sink that stamps every output record with the time it reached the sink task."""
    from epochal.sinks import FileSink

    flow = ep.Dataflow("cluster-bench", parallelism=parallelism)
    source = ep.sources.GeneratorSource(workload.lines_from, num_splits=4, limit=lines // 4)
    counts = (flow.source("lines", source)
              .flat_map("split", str.split)
              .map("pair", lambda w: (w, 1))
              .key_by(lambda p: p[0])
              .reduce("count", lambda a, b: (a[0], a[1] + b[1])))
    buckets = counts.key_by(lambda wc: wc[1] % 5).process("bucket", throughput.BucketCount())
    counts.union(buckets).map("stamp", _stamp).sink("out", FileSink(out, format="jsonl"))
    return flow


def _stamp(record):
    return (*record, time.time())


def oracle(lines: int) -> collections.Counter:
    """The word count's output in plain Python (``throughput.wordcount``: (w, n) per word
    update and ("bucket", b, n) per bucket update)."""
    words = collections.Counter(w for s in range(4) for i in range(lines // 4) for w in workload.line(s, i).split())
    out = [[w, k] for w, c in words.items() for k in range(1, c + 1)]
    buckets = collections.Counter(k % 5 for _, k in out)
    out += [["bucket", b, n] for b, c in buckets.items() for n in range(1, c + 1)]
    return collections.Counter(json.dumps(r) for r in out)


# ---------------------------------------------------------------------- the benchmark
def run_variant(variant: str, cluster, args, rep: int) -> dict:
    work = tempfile.mkdtemp(prefix=f"epochal-cluster-bench-{variant}-", dir=args.tmp)
    os.chmod(work, 0o755)
    result = os.path.join(work, "result.json")
    local = variant == "local"
    cmd = [sys.executable, __file__, "--driver", "--variant", variant, "--work", work, "--result", result,
           "--lines", str(args.lines), "--parallelism", str(args.parallelism),
           "--master", "local[16]" if local else cluster.master_url,
           "--driver-host", "127.0.0.1" if local else cluster.driver_host,
           "--encryption", "off" if variant == "cluster-plain" else "auto"]
    env = cluster.driver_env()
    if local:
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
    rec = {"variant": variant, "repetition": rep, "loadavg_1m_before": os.getloadavg()[0],
           "started_at": harness.now_iso()}
    log = os.path.join(work, "driver.log")
    proc = cluster.start_driver(cmd[1:], log, env=env)
    killer = None
    if variant == "cluster-host-loss":
        killer = threading.Thread(target=_kill_host_after_first_checkpoint, args=(cluster, work, rec), daemon=True)
        killer.start()
    try:
        proc.wait(args.run_timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rec["error"] = f"hung: not finished after {args.run_timeout} s"
    finally:
        if killer is not None:
            killer.join(5)
            cluster.start_worker(1)
            cluster.wait_registered()
    if "error" not in rec:
        if os.path.exists(result):
            with open(result) as f:
                rec.update(json.load(f))
            if not rec["output_equals_oracle"]:
                rec["error"] = "committed output differs from the plain-Python oracle"
        else:
            with open(log, errors="replace") as f:
                rec["error"] = "driver failed: " + "".join(f.readlines()[-15:])[-3000:]
    if variant == "cluster-host-loss" and "error" not in rec:
        _restart(rec)
    shutil.rmtree(work, ignore_errors=True)
    return rec


def _restart(rec: dict) -> None:
    """Restart after the host loss: the first failure seen → the first later attempt whose
    tasks all ran. Attempts that failed in between (e.g. launched onto the lost host before
    Spark noticed it was gone) count in the restart and are named in ``restart_attempts``."""
    t = rec["timeline"]
    if len(t) < 2 or rec.get("killed_at") is None:
        rec["error"] = f"the host loss did not happen or cause a restart: {len(t)} attempt(s)"
        return
    running = next((a for a in t[1:] if a.get("running_s") is not None), None)
    if running is None:
        rec["error"] = f"no attempt after the host loss ran: {rec.get('failures')}"
        return
    lost = t[0]
    rec["restart_attempts"] = t.index(running)  # 1: the first restart ran
    rec["restart_s"] = running["running_s"] - lost["failed_s"]
    rec["restart_parts_s"] = {"detect_to_stopped": lost["stopped_s"] - lost["failed_s"],
                              "stopped_to_launched": running["launched_s"] - lost["stopped_s"],
                              "launched_to_running": running["running_s"] - running["launched_s"]}


def _kill_host_after_first_checkpoint(cluster, work, rec):
    deadline = time.monotonic() + 300
    ckpt = os.path.join(work, "ckpt", "cluster-bench")
    while time.monotonic() < deadline:
        if any(os.path.exists(os.path.join(ckpt, d, "_metadata")) for d in _ls(ckpt)):
            rec["killed_at"] = time.time()
            rec["killed_pids"] = len(cluster.kill_host(1))
            return
        time.sleep(0.1)


def _ls(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def summarize(runs: list[dict]) -> dict:
    out = {}
    for v in VARIANTS:
        ok = [r for r in runs if r["variant"] == v and "error" not in r]
        ck = [c for r in ok for c in r["checkpoints_s"]]
        out[v] = {"runs_ok": len(ok), "runs_failed": sum(1 for r in runs if r["variant"] == v and "error" in r),
                  "steady_records_per_s": harness.summary([r["steady_records_per_s"] for r in ok]),
                  "wall_s": harness.summary([r["wall_s"] for r in ok]),
                  "checkpoint_p50_s": harness.percentile(ck, 50), "checkpoint_p99_s": harness.percentile(ck, 99),
                  "checkpoints": len(ck),
                  "restart_s": harness.summary([r["restart_s"] for r in ok if "restart_s" in r]),
                  "restart_attempts": [r["restart_attempts"] for r in ok if "restart_attempts" in r],
                  "hosts": sorted({h for r in ok for h in r["hosts"]})}
    base = out["local"]["steady_records_per_s"]["median"]
    for v in VARIANTS:
        m = out[v]["steady_records_per_s"]["median"]
        out[v]["ratio_to_local"] = m / base if m and base else None
    return out


def run_all(cluster, args) -> list[dict]:
    """Every variant ``args.repetitions`` times, interleaved, on ``cluster``."""
    runs = []
    for rep in range(args.repetitions):
        for variant in harness.rotated(list(args.variants), rep):
            print(f"rep {rep} {variant} ...", flush=True)
            try:
                rec = run_variant(variant, cluster, args, rep)
            except Exception as exc:  # noqa: BLE001 — one broken run is reported, the others still run
                rec = {"variant": variant, "repetition": rep, "error": f"{type(exc).__name__}: {exc}"}
            runs.append(rec)
            if "error" in rec:
                print(f"  error: {rec['error']}", flush=True)
            else:
                print(f"  {rec['steady_records_per_s']:,.0f} records/s, {rec['attempts']} attempt(s)", flush=True)
    return runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    p.add_argument("--master", default=None, help=argparse.SUPPRESS)
    p.add_argument("--driver-host", default=None, help=argparse.SUPPRESS)
    p.add_argument("--encryption", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--lines", type=int, default=400_000)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--repetitions", type=int, default=2)
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--run-timeout", type=float, default=600)
    p.add_argument("--tmp", default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="20k lines, 1 repetition, no host loss, temp output")
    args = p.parse_args(argv)
    if args.driver:
        return driver(args)
    if args.smoke:
        args.lines, args.repetitions = 20_000, 1
        args.variants = [v for v in args.variants if v != "cluster-host-loss"]
    args.out = args.out or (Path(tempfile.mkdtemp(prefix="epochal-bench-smoke-")) / "cluster.json" if args.smoke
                            else harness.RESULTS / "cluster.json")
    import standalone

    why = standalone.cannot_create_hosts()
    if why:
        print(f"cannot run the cluster benchmark: {why}", file=sys.stderr)
        return 2
    info = harness.machine()
    doc = harness.new_doc("cluster", args, info)
    doc["setup"] = ("two Spark standalone workers (8 cores, 3 GB each) in two network namespaces on one bridge; "
                    "master, drivers and storage in the root namespace; checkpoints and output on a shared path")
    with standalone.start_cluster(workers=2, cores=8) as cluster:
        runs = run_all(cluster, args)
    doc["runs"] = runs
    doc["summary"] = summarize(runs)
    doc["errors"] = [f"{r['variant']} rep {r['repetition']}: {r['error']}" for r in runs if "error" in r]
    harness.finish(doc, info)
    harness.write_json(args.out, doc)
    print(json.dumps(doc["summary"], indent=1))
    print(f"wrote {args.out}")
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
