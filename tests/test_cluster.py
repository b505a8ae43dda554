"""epochal on a real multi-host Spark standalone cluster (issue: "epochal on a real
multi-host Spark cluster").

The cluster (``standalone.py``): a Master, the drivers and an S3 server in the root
namespace, two Workers in two network namespaces — two hosts. Every job runs exactly-once
from a separate driver process (``cluster_driver.py``) with checkpoints and output on S3;
this test process injects the faults from outside (SIGKILL of a task process, the loss of
a whole host) and compares the committed output, read from S3, with a plain-Python oracle.
"""
from __future__ import annotations

import glob
import json
import os
import random
import signal
import threading
import time

import pytest

from epochal.sinks import read_committed

from pipelines import canon, collatz_golden, wordcount_oracle

pytest_plugins = ["standalone"]
pytestmark = pytest.mark.cluster

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "cluster_driver.py")


def _drive(cluster, tmp_path, jobs, *extra, name="run", env=None):
    """Start a driver for ``jobs``; returns (process, result path, log path, storage, out)."""
    storage, out = cluster.fresh_s3_url(f"{name}-ckpt"), cluster.fresh_s3_url(f"{name}-out")
    result, log = str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}.log")
    args = [DRIVER, *jobs, "--master", cluster.master_url, "--driver-host", cluster.driver_host,
            "--storage", storage, "--out", out, "--result", result, "--app", name, *extra]
    proc = cluster.start_driver(args, log, env=env)
    return proc, result, log, storage, out


def _finish(proc, result, log, timeout=240) -> list[dict]:
    try:
        proc.wait(timeout)
    except Exception:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"driver did not finish within {timeout} s; log tail:\n{_tail(log)}")
    assert os.path.exists(result), f"driver wrote no result (exit {proc.returncode}); log tail:\n{_tail(log)}"
    with open(result) as f:
        return json.load(f)


def _tail(path, n=60) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def _oracle(entry, args) -> object:
    if entry["kind"] == "wordcount":
        return wordcount_oracle(args["lines"])
    return collatz_golden(args["numbers"])


def _check_output(entry, out, args, log):
    assert entry["ok"], f"{entry['job']} failed: {entry.get('error')}\n{_tail(log)}"
    got = canon(read_committed(f"{out}/{entry['job']}"))
    want = _oracle(entry, args)
    assert got == want, (f"{entry['job']}: committed output differs from the plain-Python oracle: "
                         f"{sum((got - want).values())} extra, {sum((want - got).values())} missing")


# --------------------------------------------------------------------------- healthy run
HEALTHY = {"lines": 4000, "numbers": 300}


@pytest.fixture(scope="module")
def healthy(standalone_cluster, tmp_path_factory):
    """Word count and Collatz loop, failure-free, with an event log and the job's secrets
    recorded for the log check."""
    tmp = tmp_path_factory.mktemp("healthy")
    events, secrets = str(tmp / "events"), str(tmp / "secrets.jsonl")
    proc, result, log, storage, out = _drive(
        standalone_cluster, tmp, ["wordcount", "collatz"], "--lines", str(HEALTHY["lines"]),
        "--numbers", str(HEALTHY["numbers"]), "--event-log", events, "--secrets-out", secrets, "--ui", name="healthy")
    entries = _finish(proc, result, log)
    return {"entries": entries, "log": log, "storage": storage, "out": out, "events": events, "secrets": secrets}


def test_wordcount_and_loop_run_exactly_once_across_two_hosts(s3, healthy):
    cluster = s3
    workers = {h.address for h in cluster.hosts}
    for entry in healthy["entries"]:
        _check_output(entry, healthy["out"], HEALTHY, healthy["log"])
        assert entry["attempts"] == 1, entry["failures"]
        assert set(entry["hosts"].values()) == workers, f"tasks did not use both hosts: {entry['hosts']}"
        assert entry["encrypted"], "channels must be encrypted by default on a cluster"
        epochs = cluster.completed_epochs(healthy["storage"], entry["job"])
        assert epochs, f"no completed checkpoint of {entry['job']} on S3"
        ui = entry["ui"]  # the driver's dashboard shows the job whose tasks run on the workers
        assert ui["polls"] and set(entry["operators"]) <= set(ui["operators"]), ui


def test_job_secrets_never_reach_spark_logs_or_event_log(s3, healthy):
    """The HMAC secret, the per-attempt keys and the TLS private keys travel in the task
    closure only: none of them appears in the driver's output, Spark's event log or any
    master/worker/executor log."""
    with open(healthy["secrets"]) as f:
        records = [json.loads(line) for line in f]
    needles = set()
    for r in records:
        needles.add(r["secret"])
        needles.update(r["keys"])
        for pem in r["tls_keys"]:
            body = "".join(pem.strip().splitlines()[1:-1])
            needles.update({body[:40], body[-40:]})
        needles.update(bytes.fromhex(h).decode("latin-1") for h in [r["secret"], *r["keys"]])
    assert records and all(r["tls_keys"] for r in records), "the driver recorded no TLS material"
    files = [healthy["log"]] + s3.logs()
    for root, _, names in os.walk(healthy["events"]):
        files += [os.path.join(root, n) for n in names]
    assert os.listdir(healthy["events"]), "Spark wrote no event log to check"
    for path in files:
        with open(path, "rb") as f:
            text = f.read().decode("latin-1")
        for needle in needles:
            assert needle not in text, f"a job secret appears in {path}"


# --------------------------------------------------------------------------- faults from outside
def _kill_after_first_checkpoint(cluster, storage, jobs, pick, killed, stop):
    """For each job in turn: once its first checkpoint completed on S3, ``pick()`` the
    processes to SIGKILL and kill them; record what was killed."""
    for job in jobs:
        while not stop.is_set():
            if cluster.completed_epochs(storage, job):
                break
            time.sleep(0.2)
        if stop.is_set():
            return
        killed.append((job, pick()))


@pytest.mark.slow  # opt-in (-m slow): keeps the default suite under 30 minutes
def test_sigkill_of_a_task_process_from_outside(s3, tmp_path):
    """A task process (a Python worker of an executor) SIGKILLed from outside the engine,
    once per job after its first checkpoint: the job restarts from that checkpoint and the
    committed output still equals the oracle."""
    cluster = s3
    args = {"lines": 8000, "numbers": 300}
    proc, result, log, storage, out = _drive(
        cluster, tmp_path, ["wordcount", "collatz"], "--lines", str(args["lines"]), "--numbers",
        str(args["numbers"]), "--rate", "500", name="sigkill")
    killed, stop = [], threading.Event()

    def pick():
        host = cluster.host(0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            tasks = host.task_processes()
            if tasks:
                pid, task = random.Random(7).choice(sorted(tasks.items()))
                os.kill(pid, signal.SIGKILL)
                return task
            time.sleep(0.05)
        return None

    watcher = threading.Thread(target=_kill_after_first_checkpoint,
                               args=(cluster, storage, ["wordcount", "collatz"], pick, killed, stop), daemon=True)
    watcher.start()
    try:
        entries = _finish(proc, result, log)
    finally:
        stop.set()
    assert [k for k in killed if k[1]] and len(killed) == 2, f"the SIGKILLs did not fire: {killed}"
    for entry in entries:
        _check_output(entry, out, args, log)
        assert entry["attempts"] >= 2, f"{entry['job']}: the kill caused no restart ({killed})"
        assert any(e for e in entry["restored_from"][1:]), f"{entry['job']} restarted without a checkpoint"


def _wordcount_losing_host_2(cluster, tmp_path, args, *extra, name):
    """Start a word count whose host 2 a watcher SIGKILLs after its first checkpoint; returns
    (process, result path, log path, out, watcher, killed, stop)."""
    proc, result, log, storage, out = _drive(cluster, tmp_path, ["wordcount"], "--lines", str(args["lines"]),
                                             "--rate", "500", *extra, name=name)
    killed, stop = [], threading.Event()
    watcher = threading.Thread(target=_kill_after_first_checkpoint,
                               args=(cluster, storage, ["wordcount"], lambda: cluster.kill_host(1), killed, stop),
                               daemon=True)
    watcher.start()
    return proc, result, log, out, watcher, killed, stop


def test_loss_of_a_whole_worker_host(s3, tmp_path):
    """Every process of a host (Worker, executor JVM, Python workers) SIGKILLed mid-run: the
    word count (8 tasks) restarts from its latest checkpoint on the remaining host, which has
    8 slots; the final attempt runs entirely there and the output equals the oracle."""
    cluster = s3
    survivors = {cluster.host(0).address}
    args = {"lines": 12000, "numbers": 0}
    proc, result, log, out, watcher, killed, stop = _wordcount_losing_host_2(cluster, tmp_path, args, name="hostloss")
    try:
        (entry,) = _finish(proc, result, log)
    finally:
        stop.set()
        watcher.join(5)
        cluster.start_worker(1)
    assert killed and killed[0][1], f"host 2 was not killed: {killed}"
    _check_output(entry, out, args, log)
    assert entry["attempts"] >= 2, entry
    assert set(entry["hosts"].values()) == survivors, f"the final attempt used a lost host: {entry['hosts']}"
    cluster.wait_registered()


@pytest.mark.slow  # opt-in (-m slow): 65 s; keeps the default suite under 30 minutes
def test_a_job_that_needs_the_lost_host_waits_for_it(s3, tmp_path):
    """A word count of 11 tasks loses host 2 mid-run; one host (8 slots) cannot run it, so
    the driver waits (logging it) until the test brings the host back, then finishes on both
    hosts with the oracle's output."""
    cluster = s3
    args = {"lines": 12000, "numbers": 0}
    proc, result, log, out, _watcher, killed, stop = _wordcount_losing_host_2(cluster, tmp_path, args, "--parallelism",
                                                                             "3", name="hostwait")
    try:
        deadline = time.monotonic() + 180
        while "waiting for executors" not in _tail(log, 400) and proc.poll() is None:
            assert time.monotonic() < deadline, f"the driver never waited for executors:\n{_tail(log)}"
            time.sleep(0.5)
        cluster.start_worker(1)
        (entry,) = _finish(proc, result, log)
    finally:
        stop.set()
    assert killed and killed[0][1], f"host 2 was not killed: {killed}"
    _check_output(entry, out, args, log)
    assert entry["attempts"] >= 2, entry
    assert len(set(entry["hosts"].values())) == 2, entry["hosts"]
    cluster.wait_registered()


@pytest.mark.slow  # opt-in (-m slow): keeps the default suite under 30 minutes
def test_a_host_that_vanishes_silently(s3, tmp_path):
    """Host 2's cable is pulled mid-run (its bridge port goes down): no process dies and no
    connection is reset, the host just stops answering. epochal's peer timeout breaks the
    connections to it within seconds and fails the attempt naming the host; the driver
    then waits until Spark's heartbeat timeout (lowered here as README "Running on a
    cluster" recommends) removes its executors, so the next attempt does not land on the
    silent host, and the job finishes on the remaining host with the oracle's output.
    Before: the attempt stalled until Spark's timeout, and with the peer timeout alone the
    second attempt was placed on the silent host and wasted."""
    cluster = s3
    lost = cluster.host(1).address
    args = {"lines": 12000, "numbers": 0}
    proc, result, log, storage, out = _drive(
        cluster, tmp_path, ["wordcount"], "--lines", str(args["lines"]), "--rate", "500",
        "--peer-timeout", "5", "--conf", "spark.network.timeout=20s",
        "--conf", "spark.network.timeoutInterval=5s", "--conf", "spark.executor.heartbeatInterval=2s", name="silent")
    cut, stop = [], threading.Event()

    def pull_cable():
        cluster.partition_host(1)
        return time.time()

    watcher = threading.Thread(target=_kill_after_first_checkpoint,
                               args=(cluster, storage, ["wordcount"], pull_cable, cut, stop), daemon=True)
    watcher.start()
    try:
        (entry,) = _finish(proc, result, log)
    finally:
        stop.set()
        watcher.join(5)
        cluster.heal_host(1)
        cluster.kill_host(1)  # the partitioned processes are zombies of a finished job
        cluster.start_worker(1)
    assert entry["ok"], f"the job failed: {entry.get('error')}\n{_tail(log)}"
    assert cut and cut[0][1], f"host 2 was never cut off: {cut}"
    _check_output(entry, out, args, log)
    # the next attempt waited for Spark to drop the silent host instead of landing on it
    assert entry["attempts"] == 2, entry["failures"]
    assert f"waiting for Spark to drop the executors of {lost}" in _tail(log, 2000), _tail(log)
    assert set(entry["hosts"].values()) == {cluster.host(0).address}, entry["hosts"]
    first = entry["failures"][0]
    assert lost in first and "stopped answering" in first, f"the failure does not name the lost host: {first}"
    detected = entry["started"] + entry["timeline"][0]["failed_s"] - cut[0][1]
    assert detected < 30, f"the silent host loss took {detected:.0f} s to detect"
    cluster.wait_registered()


# --------------------------------------------------------------------------- fail fast
@pytest.mark.slow  # opt-in (-m slow): keeps the default suite under 30 minutes
def test_unreachable_or_misaddressed_tasks_fail_within_seconds(s3, tmp_path):
    """Three mis-configured clusters, each run once without restarts: a task advertising an
    address nobody can reach, a task told to bind an address its host does not have, a
    driver advertising an address the executors cannot reach. Each attempt fails within
    seconds (not the 300 s start-up timeout) with an error naming the task, its host and
    the address. A fourth driver's local checkpoint path is refused before anything runs.

    The four drivers share the machine, so on a busy one each may take a minute to start:
    the bound that tells an early failure from the start-up timeout is relative to that
    timeout (set to 600 s here), and the drivers share one deadline rather than each its own."""
    cluster = s3
    bogus = f"10.77.{cluster.subnet}.250"
    startup_timeout = 600
    base = ["--max-attempts", "0", "--parallelism", "1", "--conf", "spark.cores.max=4",
            "--startup-timeout", str(startup_timeout)]
    runs = {
        "advertise": (["--executor-env", f"EPOCHAL_TASK_HOST={bogus}", "--executor-env",
                       "EPOCHAL_TASK_BIND_HOST=0.0.0.0"], None,
                      ["cannot connect to task", f"at {bogus}:", f"(advertised as {bogus})", "on host 10.77."]),
        "bind": (["--executor-env", f"EPOCHAL_TASK_BIND_HOST={bogus}"], None,
                 [f"cannot bind its data server to {bogus}", "on host 10.77."]),
        "driver": ([], cluster.driver_env(EPOCHAL_DRIVER_HOST=bogus, EPOCHAL_DRIVER_BIND_HOST=cluster.driver_host),
                   [f"cannot connect to the coordinator at {bogus}:", "on host 10.77."]),
    }
    started = {}
    for name, (extra, env, _) in runs.items():
        started[name] = _drive(cluster, tmp_path, ["wordcount"], *base, *extra, name=name, env=env)
    # a checkpoint path on the local disk (nobody declared it shared) is refused at start
    local_dir = str(tmp_path / "ckpt")
    args = [DRIVER, "wordcount", "--master", cluster.master_url, "--driver-host", cluster.driver_host,
            "--storage", "file://" + local_dir, "--out", cluster.fresh_s3_url("o"), "--result",
            str(tmp_path / "local.json"), *base]
    local = cluster.start_driver(args, str(tmp_path / "local.log"))
    deadline = time.monotonic() + 400
    for name, (proc, result, log, _, _) in started.items():
        (entry,) = _finish(proc, result, log, timeout=max(1.0, deadline - time.monotonic()))
        assert not entry["ok"], f"{name}: the job should fail"
        for text in runs[name][2]:
            assert text in entry["error"], f"{name}: {text!r} not in the error:\n{entry['error']}"
        # well inside the start-up timeout: the failure was detected, not waited out
        assert entry["elapsed"] < startup_timeout / 4, f"{name}: took {entry['elapsed']:.0f} s to fail"
    (entry,) = _finish(local, str(tmp_path / "local.json"), str(tmp_path / "local.log"),
                       timeout=max(1.0, deadline - time.monotonic()))
    assert not entry["ok"]
    assert "checkpoint.storage: file://" + local_dir in entry["error"] and "s3://" in entry["error"], entry["error"]
    assert "shared_paths" in entry["error"]


@pytest.mark.slow  # opt-in (-m slow): keeps the default suite under 30 minutes
def test_more_tasks_than_slots_fails_with_the_counts(s3, tmp_path):
    """23 tasks on a 16-slot cluster: after cluster.executor_wait the attempt fails naming
    both counts (a too small spark.cores.max is refused up front: test_cluster_config)."""
    cluster = s3
    proc, result, log, _, _ = _drive(cluster, tmp_path, ["wordcount"], "--parallelism", "6", "--max-attempts", "0",
                                     "--executor-wait", "3", name="slots")
    (entry,) = _finish(proc, result, log, timeout=120)
    assert not entry["ok"]
    assert "runs 23 long-running tasks at once" in entry["error"] and "offers 16 concurrent task slots" in \
        entry["error"], entry["error"]


# --------------------------------------------------------------------------- shipping code
@pytest.mark.slow  # 70 s: opt-in (-m slow) to keep the default run under its 30 minutes
def test_spark_submit_with_a_packed_virtualenv(s3, tmp_path):
    """README "Running on a cluster", followed literally: pack a virtualenv with epochal
    (pyspark left out: executors have Spark's own), ship it with ``spark-submit
    --archives``, run examples/cluster_wordcount.py on executors whose Python has no
    epochal. The example checks its output against a plain-Python count."""
    import subprocess
    import sys

    cluster = s3
    base_python = getattr(sys, "_base_executable", sys.executable)
    bare = subprocess.run([base_python, "-c", "import epochal"], capture_output=True)
    if bare.returncode == 0:
        pytest.skip(f"{base_python} imports epochal: executors would not need the archive")
    repo = os.path.dirname(HERE)
    pack, archive = str(tmp_path / "pack"), str(tmp_path / "epochal-env.tar.gz")
    for cmd in ([base_python, "-m", "venv", pack],
                [f"{pack}/bin/pip", "install", "-q", f"{repo}[s3]", "venv-pack"],
                [f"{pack}/bin/venv-pack", "-q", "-p", pack, "-o", archive, "--exclude",
                 "lib/python*/site-packages/pyspark/*"]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{cmd[:2]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    base = cluster.fresh_s3_url("submit")
    env = cluster.driver_env(PYSPARK_DRIVER_PYTHON=sys.executable, PYSPARK_PYTHON="./env/bin/python")
    submit = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", cluster.master_url,
              "--archives", f"{archive}#env", "--conf", f"spark.driver.host={cluster.driver_host}"]
    for k, v in cluster.spark_conf.items():  # the cluster's authenticated, encrypted RPC
        submit += ["--conf", f"{k}={v}"]
    for k, v in cluster.s3_env.items():
        submit += ["--conf", f"spark.executorEnv.{k}={v}"]
    done = subprocess.run([*submit, os.path.join(repo, "examples", "cluster_wordcount.py"), base],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, f"spark-submit failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "committed output equals a plain-Python count: yes" in done.stdout, done.stdout
    assert "encrypted channels: yes" in done.stdout, done.stdout
    unpacked = [p for h in cluster.hosts for p in glob.glob(f"{h.workdir}/app-*/*/env/lib/python*/site-packages/epochal")]
    assert unpacked, "no executor unpacked the archive"


@pytest.mark.bench
def test_cluster_benchmark_smoke(s3, tmp_path):
    """benchmarks/cluster.py measures local and cluster runs whose output equals its oracle."""
    import argparse
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
    import cluster as bench

    args = argparse.Namespace(lines=8000, parallelism=2, repetitions=1, variants=["local", "cluster"],
                              run_timeout=240, tmp=str(tmp_path))
    runs = bench.run_all(s3, args)
    assert [r.get("error") for r in runs] == [None, None], runs
    summary = bench.summarize(runs)
    assert summary["cluster"]["hosts"] == sorted(h.address for h in s3.hosts)
    assert all(r["output_equals_oracle"] and r["steady_records_per_s"] > 0 for r in runs)
    assert {r["variant"]: r["encrypted"] for r in runs} == {"local": False, "cluster": True}
