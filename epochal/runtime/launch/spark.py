"""The Spark launcher — the only module that imports pyspark.

Each physical task runs as one long-running Spark task of a *barrier* stage
(``rdd.barrier().mapPartitions``): Spark gang-schedules all of them at once, one Python
worker process each, which is what a pipelined dataflow needs (every task must run
concurrently). The coordinator stays in the driver. Spark does not retry a failed
barrier ResultStage (DESIGN.md "Facts"), so a failure ends the Spark job and the epochal
driver restarts the whole attempt itself from the latest completed epoch.

On a cluster (any master but ``local[...]``; DESIGN.md "On a cluster"):

* **Addresses.** The coordinator binds the driver's address (``spark.driver.bindAddress``,
  else ``spark.driver.host``) and is advertised at ``spark.driver.host``;
  ``EPOCHAL_DRIVER_HOST`` / ``EPOCHAL_DRIVER_BIND_HOST`` in the driver's environment
  override both. Each task binds and advertises its executor's address as Spark knows it
  (``BarrierTaskContext.getTaskInfos()``), overridable per host with ``EPOCHAL_TASK_HOST``
  / ``EPOCHAL_TASK_BIND_HOST`` (``spark.executorEnv.*``). A task that cannot reach the
  coordinator raises :class:`~epochal.errors.TaskStartError`, which fails the barrier
  stage at once; its message becomes the attempt's cause.
* **Slots.** Before every attempt :meth:`SparkLauncher.prepare` waits (bounded by
  ``ClusterConfig.executor_wait``, logging progress) until the cluster offers a slot per
  task — executors registering at start-up, or replacing a lost host. Settings barrier
  stages cannot run under are refused up front.
* **Silent host loss.** A host that stops answering (``ClusterConfig.peer_timeout``) fails
  the attempt, but Spark keeps its executors registered until its own heartbeat timeout
  (``spark.network.timeout``) and would place tasks of the next attempt there, wasting
  it. :meth:`SparkLauncher.prepare` therefore also waits until every such host is either
  dropped by Spark or answers again.
* **Spark's RPC.** The attempt's key and TLS material reach the executors in the task
  closure, over Spark's RPC: a cluster whose RPC is neither authenticated nor encrypted is
  refused (:func:`check_rpc_security`, naming the settings that fix it) unless
  ``ClusterConfig(allow_insecure_spark_rpc=True)``.
"""
from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading
import time
import uuid

from epochal.config import ClusterConfig
from epochal.errors import ConfigError, EpochalError
from epochal.runtime.launch.launcher import Launcher, OnExit

log = logging.getLogger("epochal")

_owned_session = None
_session_lock = threading.Lock()  # one embedded session is created at a time (see start_local_session)
#: driver address overrides (a multi-homed driver)
DRIVER_HOST_ENV = "EPOCHAL_DRIVER_HOST"
DRIVER_BIND_HOST_ENV = "EPOCHAL_DRIVER_BIND_HOST"
#: seconds between "waiting for executors" log lines
WAIT_LOG_EVERY = 5.0
#: task slots of the embedded session at least (``local[K]``: K threads, not cores; DESIGN.md
#: "Facts": 32 tasks on 2 cores work), so that later jobs in the same process fit and reuse it
LOCAL_SLOTS = 16
#: JVM options of the embedded session (its driver JVM, and the short-lived launcher JVM
#: ``spark-submit`` runs first). The JVM of local Spark only schedules — records never
#: enter it — so the C2 compiler and a parallel collector buy nothing but threads that
#: compete with the tasks for the cores: with them off the session starts in 8.6 s instead
#: of 20 s on 2 busy cores (load 10; issue 24). An explicit ``spark.driver.extraJavaOptions``
#: / ``SPARK_LAUNCHER_OPTS`` wins.
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto"
#: Spark's Python worker daemon for the embedded session: pre-imports epochal, so each task's
#: worker is a fork (:mod:`epochal.runtime.launch.daemon`)
DAEMON_MODULE = "epochal.runtime.launch.daemon"


class SlotsUnavailable(EpochalError):
    """The cluster did not offer a task slot per task within ``ClusterConfig.executor_wait``."""


def _local_session(num_tasks: int):
    """A local SparkSession with at least ``num_tasks`` slots (created once per process,
    reused by every later job, grown only when a job needs more than it has)."""
    global _owned_session
    with _session_lock:
        if _owned_session is not None:
            if _owned_session.sparkContext._jsc is not None \
                    and _owned_session.sparkContext.defaultParallelism >= num_tasks:
                return _owned_session
            _owned_session.stop()
            _owned_session = None
        _owned_session = _create_local_session(max(num_tasks, LOCAL_SLOTS, os.cpu_count() or 2))
        return _owned_session


def _create_local_session(slots: int):
    from pyspark.sql import SparkSession

    from epochal.runtime.launch import jvm_archive
    from epochal.runtime.launch.java import ensure_java

    ensure_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # embedded local Spark stays on loopback
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", LOCAL_JAVA_OPTIONS)
    java_options = f"{LOCAL_JAVA_OPTIONS} {jvm_archive.java_options(LOCAL_JAVA_OPTIONS)}".strip()
    session = (
        SparkSession.builder.master(f"local[{slots}]")
        .appName("epochal")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.daemon.module", DAEMON_MODULE)
        .config("spark.driver.extraJavaOptions", java_options)
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    # epochal reports task failures (with their cause) itself; Spark would add a JVM stack
    # trace per expected, recovered failure
    session.sparkContext.setLogLevel("FATAL")
    return session


def start_local_session(num_tasks: int = LOCAL_SLOTS) -> threading.Thread | None:
    """Start the embedded session on a thread, so the JVM boots while the driver plans
    and checks the job (:func:`epochal.runtime.driver.job.start_job`); ``None`` when the
    job will not use it (a session is active, or ``spark-submit`` set one up) or it exists.

    A later :func:`_local_session` waits for this one; if creating it failed (no Java),
    that call fails again with the error, where the caller sees it.
    """
    from pyspark.sql import SparkSession

    if _owned_session is not None or SparkSession.getActiveSession() is not None \
            or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None

    def create():
        try:
            _local_session(num_tasks)
        except Exception as exc:  # the caller's own _local_session raises it again
            log.debug("starting the embedded Spark session early failed: %s", exc)

    thread = threading.Thread(target=create, name="epochal-spark-start", daemon=True)
    thread.start()
    return thread


def _session(spark, num_tasks: int):
    """The session to run on: the one given, the active one, the one ``spark-submit`` set up
    (its master and configuration come from the command line), else embedded local Spark."""
    from pyspark.sql import SparkSession

    if spark is not None:
        return spark
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # started by spark-submit: honour its --master
        return SparkSession.builder.appName("epochal").getOrCreate()
    return _local_session(num_tasks)


def session_for(spark, num_tasks: int):
    """The session jobs of ``num_tasks`` tasks in all will share (:func:`_session`): a job of
    several regions runs one barrier stage per region at once in it (:mod:`epochal.regions.run`)."""
    return _session(spark, num_tasks)


#: what protects Spark's RPC: the fix an insecure cluster is told to apply
RPC_FIX = ("--conf spark.authenticate=true --conf spark.network.crypto.enabled=true (with "
           "spark.authenticate.secret; YARN and Kubernetes generate one per application, a standalone "
           "cluster's master and workers need the same secret: "
           "SPARK_DAEMON_JAVA_OPTS='-Dspark.authenticate=true -Dspark.authenticate.secret=...')")


def check_rpc_security(conf, master: str, allow_insecure: bool) -> None:
    """Refuse (or with ``allow_insecure`` warn about) a cluster whose Spark RPC is neither
    authenticated nor encrypted; warn when it is authenticated only (readable in transit).

    Why: the per-attempt TLS key and the job secret reach the executors inside Spark's task
    closure (:class:`~epochal.runtime.task.attempt.AttemptSpec`): whoever can read Spark's
    RPC can then authenticate as a task of the job and send pickles to the others.

    Raises:
        ConfigError: naming the settings that fix it and the opt-out.
    """
    def on(key: str) -> bool:
        return str(conf.get(key, "false") or "false").strip().lower() == "true"

    authenticated = on("spark.authenticate")
    encrypted = on("spark.network.crypto.enabled") or on("spark.ssl.rpc.enabled")
    if encrypted:
        return
    if authenticated:
        log.warning("Spark's RPC on %s is authenticated but not encrypted: epochal's job secret and per-attempt TLS "
                    "key cross it readable in Spark's task closure; set spark.network.crypto.enabled=true", master)
        return
    message = (f"Spark's RPC on {master} is neither authenticated nor encrypted: epochal's job secret and per-attempt "
               "TLS key reach the executors in Spark's task closure over it, so whoever can read or join Spark's "
               f"traffic could impersonate the job's tasks and send them pickles. Secure it: {RPC_FIX}")
    if not allow_insecure:
        raise ConfigError(message + "; or, on a network only you can reach, accept the risk with "
                                    "ClusterConfig(allow_insecure_spark_rpc=True)")
    log.warning("%s (running anyway: cluster.allow_insecure_spark_rpc=True)", message)


def _check_cluster_conf(conf, num_tasks: int, master: str) -> None:
    """Refuse settings a long-running barrier stage cannot run under, saying why."""
    if conf.get("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
        raise ConfigError(
            "spark.dynamicAllocation.enabled=true: epochal runs every task of a job at once as one Spark "
            "barrier stage, which Spark refuses under dynamic allocation (and removing an idle-looking "
            "executor would kill a running task); set spark.dynamicAllocation.enabled=false and size the "
            "application with spark.executor.instances / spark.cores.max")
    cores_max = conf.get("spark.cores.max", None)
    task_cpus = int(conf.get("spark.task.cpus", "1") or 1)
    if cores_max is not None and int(cores_max) // task_cpus < num_tasks:
        raise ConfigError(
            f"spark.cores.max={cores_max} (with spark.task.cpus={task_cpus}) gives at most "
            f"{int(cores_max) // task_cpus} concurrent task slots on {master}, but the job runs {num_tasks} "
            "long-running tasks at once (one per physical task); raise spark.cores.max or lower the "
            "dataflow's parallelism")


def _executor_host() -> str:
    """This task's executor address as Spark knows it (what the driver reaches it at)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    address = ctx.getTaskInfos()[ctx.partitionId()].address
    return address.rsplit(":", 1)[0].strip("[]")


_TASK_START = re.compile(r"TaskStartError: (.+)")
_NO_MODULE = re.compile(r"ModuleNotFoundError: (No module named '([^']+)')")
_REASON = re.compile(r"Most recent failure reason:\s*(.+)")


def summarize_failure(text: str, python: str = "python3") -> tuple[str, bool, bool]:
    """``(cause, primary, fatal)`` from the text of a failed Spark job.

    A task's own :class:`~epochal.errors.TaskStartError` message is the primary cause; an
    executor Python that cannot import epochal or a dependency is fatal (every restart
    would fail the same way) and says how to ship the code; otherwise Spark's "most recent
    failure reason" (e.g. a lost executor) or the first line.
    """
    m = _TASK_START.search(text)
    if m:
        return m.group(1).strip(), True, False
    m = _NO_MODULE.search(text)
    if m:
        return (f"the executors' Python ({python}, from PYSPARK_PYTHON / spark.pyspark.python) cannot load the "
                f"job: {m.group(1)} — install epochal and the pipeline's dependencies on every executor, or ship "
                "them in a packed virtualenv with spark-submit --archives (README, 'Running on a cluster')",
                True, True)
    m = _REASON.search(text)
    if m:
        return f"spark job failed: {m.group(1).strip()[:1000]}", False, False
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return f"spark job failed: {first[:1000]}", False, False


class SparkLauncher(Launcher):
    """Runs every task of an attempt as one task of a Spark barrier stage.

    Args:
        spark: a SparkSession to use; ``None`` uses the active session, the one
            ``spark-submit`` configured, or creates a local one sized for the task count.
        num_tasks: tasks per attempt (checked against the session's task slots).
        cluster: waits and storage rules on a cluster (:class:`~epochal.config.ClusterConfig`).

    Raises:
        ConfigError: a local session with too few slots, or cluster settings a barrier
            stage cannot run under (dynamic allocation, too small ``spark.cores.max``).
    """

    def __init__(self, spark, num_tasks: int, cluster: ClusterConfig | None = None):
        spark = _session(spark, num_tasks)
        self.spark = spark
        self.cluster = cluster or ClusterConfig()
        sc = spark.sparkContext
        self.master = sc.master
        self.is_cluster = not self.master.startswith("local")
        conf = sc.getConf()
        if self.is_cluster:
            _check_cluster_conf(conf, num_tasks, self.master)
            check_rpc_security(conf, self.master, self.cluster.allow_insecure_spark_rpc)
            advertised = os.environ.get(DRIVER_HOST_ENV) or conf.get("spark.driver.host")
            self.advertised_host = advertised
            self.bind_host = (os.environ.get(DRIVER_BIND_HOST_ENV) or conf.get("spark.driver.bindAddress", None)
                              or advertised)
            self.startup_timeout = self.cluster.startup_timeout
        else:
            slots = sc.defaultParallelism
            if slots < num_tasks:
                raise ConfigError(
                    f"spark: the job needs {num_tasks} concurrent task slots (one long-running task per "
                    f"physical task) but the SparkSession offers {slots}; use a larger master (e.g. "
                    f"local[{num_tasks}]) or lower the dataflow's parallelism"
                )
            self.bind_host = "127.0.0.1"
            self.startup_timeout = 300.0  # a cold Spark starts one Python worker per task
        self._units: list[tuple[str, threading.Thread]] = []  # (job group, thread) per launch
        self._lost: set[str] = set()  # hosts that stopped answering (hosts_lost), until Spark drops them

    def hosts_lost(self, hosts: set[str]) -> None:
        if self.is_cluster:
            self._lost |= set(hosts)

    def _executor_addresses(self) -> dict[str, list[int]]:
        """host → block manager ports of the executors (and driver) Spark has registered."""
        found: dict[str, list[int]] = {}
        keys = self.spark.sparkContext._jsc.sc().getExecutorMemoryStatus().keySet().mkString(",")
        for address in keys.split(","):
            if address:
                host, _, port = address.rpartition(":")
                found.setdefault(host, []).append(int(port))
        return found

    def _silent_hosts(self) -> list[str]:
        """The lost hosts Spark still lists executors on and that still do not answer a TCP
        connect to their block manager; the others are forgotten."""
        registered = self._executor_addresses()
        silent = []
        for host in sorted(self._lost):
            ports = registered.get(host)
            if not ports:
                self._lost.discard(host)  # Spark removed its executors: no task can land there
                continue
            try:
                socket.create_connection((host, ports[0]), timeout=1.0).close()
                self._lost.discard(host)  # it answers again (a healed partition)
            except OSError:
                silent.append(host)
        return silent

    # ------------------------------------------------------------------ slots
    def slots(self) -> int:
        """Concurrent task slots the registered executors offer now (what Spark's own
        barrier check compares against)."""
        jsc = self.spark.sparkContext._jsc.sc()
        try:
            return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
        except Exception:  # an older Spark without the method: its default parallelism
            return self.spark.sparkContext.defaultParallelism

    def prepare(self, num_tasks: int) -> None:
        """Wait until the cluster offers ``num_tasks`` slots, logging progress; raise
        :class:`SlotsUnavailable` after ``ClusterConfig.executor_wait``."""
        if not self.is_cluster:
            return
        wait = self.cluster.executor_wait
        timeout = self.spark.sparkContext.getConf().get("spark.network.timeout", "120s")  # for messages
        t0 = time.monotonic()
        next_log = t0
        while True:
            silent = self._silent_hosts() if self._lost else []
            have = self.slots()
            if have >= num_tasks and not silent:
                return
            now = time.monotonic()
            if silent and now - t0 >= wait:
                raise SlotsUnavailable(
                    f"Spark still lists executors on {', '.join(silent)}, which stopped answering, after waiting "
                    f"{wait:.0f} s (cluster.executor_wait): it drops them after spark.network.timeout ({timeout}); "
                    "lower that, or raise cluster.executor_wait")
            if silent:
                if now >= next_log:
                    log.info("waiting for Spark to drop the executors of %s, which stopped answering, before the "
                             "next attempt (spark.network.timeout=%s; %.0f s of %.0f s, cluster.executor_wait)",
                             ", ".join(silent), timeout, now - t0, wait)
                    next_log = now + WAIT_LOG_EVERY
                time.sleep(0.5)
                continue
            if now - t0 >= wait:
                raise SlotsUnavailable(
                    f"the job runs {num_tasks} long-running tasks at once but the Spark cluster {self.master} "
                    f"offers {have} concurrent task slots after waiting {wait:.0f} s "
                    "(cluster.executor_wait): add workers or cores (spark.cores.max, spark.executor.cores, "
                    "spark.executor.instances), or lower the dataflow's parallelism")
            if now >= next_log:
                log.info("waiting for executors on %s: %d of %d task slots (%.0f s of %.0f s, "
                         "cluster.executor_wait)", self.master, have, num_tasks, now - t0, wait)
                next_log = now + WAIT_LOG_EVERY
            time.sleep(0.25)

    # ------------------------------------------------------------------ attempts
    def launch(self, attempt: bytes, tasks: list[int], on_exit: OnExit) -> object:
        """One barrier stage (its own Spark job group) for the tasks ``tasks``: the whole
        attempt, or one failover region — each failover region runs as a stage of its own,
        so Spark ends only that stage when one of its tasks dies."""
        sc = self.spark.sparkContext
        group = f"epochal-{uuid.uuid4().hex[:12]}"
        on_cluster = self.is_cluster
        tasks = list(tasks)

        def task_fn(iterator):
            # A task failure is reported to the coordinator, which restarts the attempt; the
            # Spark task itself returns normally so Spark keeps its Python worker for the
            # next attempt (a failed or killed task costs a fresh worker: seconds per task).
            # Only a task that cannot reach the coordinator fails its Spark task: nothing
            # else could report for it, and failing the barrier stage stops the others now.
            from epochal.errors import TaskStartError
            from epochal.runtime.launch.worker import run_task

            host = _executor_host() if on_cluster else None
            for index in iterator:
                try:
                    yield {"ok": True, "metrics": run_task(attempt, index, host)}
                except TaskStartError:
                    raise
                except Exception as exc:
                    yield {"ok": False, "task": index, "cause": f"{type(exc).__name__}: {exc}"[:1500]}

        def run():
            sc.setJobGroup(group, "epochal dataflow attempt", interruptOnCancel=True)
            try:
                results = sc.parallelize(tasks, len(tasks)).barrier().mapPartitions(task_fn).collect()
            except Exception as exc:  # a crashed worker, a lost executor, a cancelled job
                cause, primary, fatal = summarize_failure(str(exc), sc.pythonExec)
                on_exit(False, cause, primary, fatal)
                return
            failed = [r for r in results if not r["ok"]]
            if failed:
                on_exit(False, f"task #{failed[0]['task']} failed: {failed[0]['cause']}")
            else:
                on_exit(True, "")

        thread = threading.Thread(target=run, name="epochal-spark-launcher", daemon=True)
        unit = (group, thread)
        self._units.append(unit)
        thread.start()
        return unit

    def cancel(self, unit: object = None) -> None:
        units = list(self._units) if unit is None else [unit]
        for group, _ in units:
            self.spark.sparkContext.cancelJobGroup(group)
        for u in units:
            u[1].join(60)
            if u in self._units:
                self._units.remove(u)
