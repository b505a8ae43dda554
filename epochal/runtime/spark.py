"""The Spark launcher — the only module that imports pyspark.

Each physical task runs as one long-running Spark task of a *barrier* stage
(``rdd.barrier().mapPartitions``): Spark gang-schedules all of them at once, one Python
worker process each, which is what a pipelined dataflow needs (every task must run
concurrently). The coordinator stays in the driver. Spark does not retry a failed
barrier ResultStage (DESIGN.md "Facts"), so a failure ends the Spark job and the epochal
driver restarts the whole attempt itself from the latest completed epoch.
"""
from __future__ import annotations

import os
import sys
import threading
import uuid

from epochal.errors import ConfigError
from epochal.runtime.launcher import Launcher, OnExit

_owned_session = None


def _local_session(num_tasks: int):
    """A local SparkSession with at least ``num_tasks`` slots (created once and grown)."""
    global _owned_session
    from pyspark.sql import SparkSession

    from epochal.runtime.java import ensure_java

    ensure_java()
    slots = max(num_tasks, os.cpu_count() or 2)
    if _owned_session is not None:
        if _owned_session.sparkContext.defaultParallelism >= num_tasks:
            return _owned_session
        _owned_session.stop()
        _owned_session = None
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # embedded local Spark stays on loopback
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    _owned_session = (
        SparkSession.builder.master(f"local[{slots}]")
        .appName("epochal")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    # epochal reports task failures (with their cause) itself; Spark would add a JVM stack
    # trace per expected, recovered failure
    _owned_session.sparkContext.setLogLevel("FATAL")
    return _owned_session


class SparkLauncher(Launcher):
    """Runs every task of an attempt as one task of a Spark barrier stage.

    Args:
        spark: a SparkSession to use; ``None`` uses the active session or creates a local
            one sized for the task count.
        num_tasks: tasks per attempt (checked against the session's task slots).
    """

    def __init__(self, spark, num_tasks: int):
        from pyspark.sql import SparkSession

        if spark is None:
            spark = SparkSession.getActiveSession() or _local_session(num_tasks)
        self.spark = spark
        sc = spark.sparkContext
        slots = sc.defaultParallelism
        if slots < num_tasks:
            raise ConfigError(
                f"spark: the job needs {num_tasks} concurrent task slots (one long-running task per "
                f"physical task) but the SparkSession offers {slots}; use a larger master (e.g. "
                f"local[{num_tasks}]) or lower the dataflow's parallelism"
            )
        master = sc.master
        self.bind_host = "127.0.0.1" if master.startswith("local") else sc.getConf().get("spark.driver.host")
        self._group: str | None = None
        self.startup_timeout = 300.0  # a cold Spark starts one Python worker per task
        self._thread: threading.Thread | None = None

    def launch(self, attempt: bytes, num_tasks: int, on_exit: OnExit) -> None:
        sc = self.spark.sparkContext
        group = f"epochal-{uuid.uuid4().hex[:12]}"
        self._group = group

        def task_fn(iterator):
            # A task failure is reported to the coordinator, which restarts the attempt; the
            # Spark task itself returns normally so Spark keeps its Python worker for the
            # next attempt (a failed or killed task costs a fresh worker: seconds per task).
            from epochal.runtime.worker import run_task

            for index in iterator:
                try:
                    yield {"ok": True, "metrics": run_task(attempt, index)}
                except Exception as exc:
                    yield {"ok": False, "task": index, "cause": f"{type(exc).__name__}: {exc}"[:1500]}

        def run():
            sc.setJobGroup(group, "epochal dataflow attempt", interruptOnCancel=True)
            try:
                results = sc.parallelize(range(num_tasks), num_tasks).barrier().mapPartitions(task_fn).collect()
            except Exception as exc:  # a crashed worker or a cancelled job
                text = str(exc)
                on_exit(False, f"spark job failed: {text[:1500]}")
                return
            failed = [r for r in results if not r["ok"]]
            if failed:
                on_exit(False, f"task #{failed[0]['task']} failed: {failed[0]['cause']}")
            else:
                on_exit(True, "")

        self._thread = threading.Thread(target=run, name="epochal-spark-launcher", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        if self._group is not None:
            self.spark.sparkContext.cancelJobGroup(self._group)
        if self._thread is not None:
            self._thread.join(60)
