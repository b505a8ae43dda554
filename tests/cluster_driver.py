"""A driver program for the standalone-cluster tests and benchmark: runs pipelines of
``pipelines.py`` on a Spark cluster, exactly as a user's driver script would, and writes
what happened to a JSON file. The test process stays outside: it injects faults (SIGKILL
of a task process or of a whole host) and reads the output from S3 itself.

    python cluster_driver.py --master spark://10.77.5.1:7077 --driver-host 10.77.5.1 \\
        --storage s3://bucket/ckpt --out s3://bucket/out --result r.json wordcount collatz

Options mirror what a user sets: executor environment (``--executor-env K=V``), restart
budget, ``ClusterConfig`` waits, encryption, an event log directory. Every job's
checkpoints go to ``<storage>/<job>`` and its output to ``<out>/<job>``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cloudpickle  # noqa: E402

import pipelines  # noqa: E402
import test_failover as failover  # noqa: E402
import test_queryable_state as bank  # noqa: E402

cloudpickle.register_pickle_by_value(pipelines)  # executors cannot import the tests' modules
cloudpickle.register_pickle_by_value(bank)
cloudpickle.register_pickle_by_value(failover)

import epochal as ep  # noqa: E402

JOBS = {
    # name: (builder(job, out, args), oracle kind)
    "wordcount": lambda job, out, a: pipelines.wordcount(job, out, n_lines=a.lines, parallelism=a.parallelism,
                                                         rate=a.rate),
    "collatz": lambda job, out, a: pipelines.collatz(job, out, n=a.numbers, parallelism=a.parallelism,
                                                     body_parallelism=a.parallelism, rate=a.rate / 4),
    "bank": lambda job, out, a: bank.bank(job, out, per_split=a.transfers, rate=a.rate),
    # forward-only pipelines (failover regions): a.lines records per split
    "pipelines": lambda job, out, a: failover.pipelines(job, out, None, n=a.lines, rate=a.rate),
}


def _query_while_running(handle) -> dict:
    """A ``QueryClient`` in this (driver-host) process, as an external client would build it
    (address, token, pinned TLS), asking every account's balance read-committed, then
    read-uncommitted, until the job ends: answers as ``[epoch, [[account, balance], ...]]``,
    and the hosts its routes pointed at."""
    from epochal.query import JobEnded
    from epochal.state import QueryClient

    seen: dict = {"committed": [], "uncommitted": [], "route_hosts": [], "error": None}
    accounts = list(range(bank.N))
    try:
        with QueryClient(handle.query_address, handle.query_token, timeout=120, tls=handle.query_tls) as client:
            while True:
                r = client.query("accounts", "balance", accounts)
                seen["committed"].append([r.epoch, [[k, r.values[k]] for k in accounts]])
                seen["route_hosts"] = sorted({a[3][0] for a in (client._routes or {}).get("operators", {})
                                              .get("accounts", [])} | set(seen["route_hosts"]))
                u = client.query("accounts", "balance", accounts, isolation="read-uncommitted")
                seen["uncommitted"].append([[k, u.values[k]] for k in accounts])
    except JobEnded:
        pass
    except Exception as exc:
        seen["error"] = f"{type(exc).__name__}: {exc}"
    seen["client_address"] = list(handle.query_address)
    return seen


def _session(args):
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(args.master).appName(args.app)
               .config("spark.driver.host", args.driver_host)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}  # S3 from every host
    env.update(dict(kv.split("=", 1) for kv in args.executor_env))
    for k, v in env.items():
        builder = builder.config(f"spark.executorEnv.{k}", v)
    for k, v in json.loads(os.environ.get("EPOCHAL_TEST_SPARK_CONF", "{}")).items():  # authenticated RPC
        builder = builder.config(k, v)
    for kv in args.conf:
        k, v = kv.split("=", 1)
        builder = builder.config(k, v)
    if args.event_log:
        os.makedirs(args.event_log, exist_ok=True)
        builder = builder.config("spark.eventLog.enabled", "true").config("spark.eventLog.dir",
                                                                          "file://" + args.event_log)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    deadline = time.monotonic() + 90
    while len(_executor_hosts(spark, args.driver_host)) < args.wait_hosts:  # a warm cluster
        if time.monotonic() > deadline:
            raise TimeoutError(f"executors on {args.wait_hosts} hosts did not register within 90 s")
        time.sleep(0.2)
    return spark


def _executor_hosts(spark, driver_host: str) -> set[str]:
    addresses = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().keySet().mkString(",")
    return {a.rsplit(":", 1)[0] for a in addresses.split(",") if a} - {driver_host}


def _record_secrets(handle, path: str, generated: list) -> None:
    """For the test that the job's secrets never reach a log: write them where it finds them."""
    d = handle._driver
    from epochal.runtime.transport import wire

    keys = [wire.derive_key(d.secret, d.plan.job, g).hex() for g in range(8)]
    with open(path, "a") as f:
        f.write(json.dumps({"secret": d.secret.hex(), "keys": keys,
                            "tls_keys": [m.key_pem.decode() for m in generated]}) + "\n")


def _watch_dashboard(handle) -> dict:
    """Poll the driver's dashboard (``/api/state``, with the token) while the job runs: what
    a page on the driver's host would show of a job whose tasks run on the workers."""
    import json as _json
    import urllib.request

    base, token = handle.ui_url.split("/?token=")
    request = urllib.request.Request(base + "/api/state", headers={"X-Epochal-Token": token})
    seen = {"polls": 0, "operators": [], "completed": 0, "rates": False}
    while handle.running:
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                doc = _json.loads(r.read())
        except OSError:
            if handle.running and handle._driver.state not in ("finished", "failed"):
                raise
            break  # the job ended: its driver closes the page's server before its thread exits
        seen["polls"] += 1
        seen["operators"] = sorted(n["name"] for n in doc["graph"]["nodes"])
        seen["completed"] = max(seen["completed"], doc["counts"]["completed"])
        seen["rates"] = seen["rates"] or any(o.get("records_in_per_s") for o in doc["operators"].values())
        time.sleep(0.2)
    return seen


def run_job(kind: str, args, spark) -> dict:
    job = f"{kind}{args.suffix}"
    flow = JOBS[kind](job, f"{args.out}/{job}", args)
    generated: list = []
    if args.secrets_out:
        from epochal.runtime.transport import tls

        original = tls.TLSMaterial.generate.__func__

        def generate(cls, name):
            material = original(cls, name)
            generated.append(material)
            return material

        tls.TLSMaterial.generate = classmethod(generate)
    options = dict(
        runtime="spark", spark=spark, guarantee=args.guarantee,
        checkpoint=ep.CheckpointConfig(interval=args.interval, storage=f"{args.storage}",
                                       **({} if args.retained is None else {"retained": args.retained})),
        restart=ep.RestartStrategy(max_attempts=args.max_attempts, delay=0),
        cluster=ep.ClusterConfig(executor_wait=args.executor_wait, startup_timeout=args.startup_timeout,
                                 peer_timeout=args.peer_timeout,
                                 shared_paths=tuple(args.shared_path)),
        channels=ep.ChannelConfig(encryption={"auto": None, "on": True, "off": False}[args.encryption],
                                  allow_plaintext=args.encryption == "off"),  # the test cluster's private network
    )
    if args.ui:
        options["metrics"] = ep.MetricsConfig(ui=True, log=False)
    t0 = time.time()
    entry = {"job": job, "kind": kind, "started": t0}
    try:
        handle = flow.start(**options)
        if args.ui:
            entry["ui"] = _watch_dashboard(handle)
        if kind == "bank":
            entry["queries"] = _query_while_running(handle)
        result = handle.wait()
    except Exception as exc:
        entry.update(ok=False, error=f"{type(exc).__name__}: {exc}", elapsed=time.time() - t0,
                     causes=list(getattr(exc, "causes", [])), traceback=traceback.format_exc(limit=5))
        return entry
    finally:
        if args.secrets_out and "handle" in locals():
            _record_secrets(handle, args.secrets_out, generated)
    ckpt = sorted(e["duration_s"] for e in result.completed_epochs if e["reason"] == "periodic")
    entry.update(
        ok=True, elapsed=time.time() - t0, attempts=result.attempts, failures=result.failures,
        failovers=result.failovers,
        operators=sorted(flow.nodes),
        restored_from=result.restored_from, encrypted=result.encrypted,
        hosts={t: m.get("host") for t, m in result.task_metrics.items()},
        records_in=result.records_in, completed=len(result.completed_epochs),
        checkpoint_s=ckpt, timeline=result.attempt_timeline,
        tasks={t: {k: m.get(k) for k in ("records_in", "records_out", "host")} for t, m in result.task_metrics.items()},
    )
    return entry


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jobs", nargs="+", choices=sorted(JOBS))
    p.add_argument("--master", required=True)
    p.add_argument("--driver-host", required=True)
    p.add_argument("--storage", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--app", default="epochal-cluster-test")
    p.add_argument("--suffix", default="", help="appended to every job name")
    p.add_argument("--ui", action="store_true", help="serve the dashboard and poll it while each job runs")
    p.add_argument("--lines", type=int, default=4000)
    p.add_argument("--numbers", type=int, default=300)
    p.add_argument("--transfers", type=int, default=4000, help="bank: transfers per split")
    p.add_argument("--retained", type=int, default=None, help="completed checkpoints kept (default: epochal's)")
    p.add_argument("--rate", type=float, default=1000.0, help="source records/s per split")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--guarantee", default="exactly-once")
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--executor-wait", type=float, default=120.0)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--peer-timeout", type=float, default=30.0)
    p.add_argument("--encryption", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--shared-path", action="append", default=[])
    p.add_argument("--executor-env", action="append", default=[], metavar="K=V")
    p.add_argument("--conf", action="append", default=[], metavar="K=V", help="a Spark setting")
    p.add_argument("--event-log", default=None)
    p.add_argument("--wait-hosts", type=int, default=2, help="start once executors run on this many hosts")
    p.add_argument("--secrets-out", default=None)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    results = []
    try:
        spark = _session(args)
    except Exception as exc:
        results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        spark = None
    if spark is not None:
        for kind in args.jobs:
            results.append(run_job(kind, args, spark))
            with open(args.result, "w") as f:  # after every job: the test watches progress
                json.dump(results, f)
    with open(args.result, "w") as f:
        json.dump(results, f)
    if spark is not None:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
