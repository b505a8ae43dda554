"""Cold start (issue 24): the embedded session is reused by every job of a process, its
Python workers are forked from epochal's pre-importing daemon, and the JVM's class archive
is found (or made once) per JVM, Spark and options. The timing goals live in
``benchmarks/coldstart.py``; these tests check the mechanisms and the output."""
from __future__ import annotations

import os

import epochal as ep
from epochal.runtime.launch import daemon, jvm_archive
from epochal.runtime.launch.spark import DAEMON_MODULE, LOCAL_JAVA_OPTIONS, start_local_session
from epochal.sinks import FileSink, read_committed
from pipelines import unique_dir


def _worker(x: int) -> dict:
    """Which process handled ``x``, and the command line of the process it was forked from."""
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\0", b" ").decode()
    return {"x": x, "pid": os.getpid(), "parent": parent}


def _run_once(tmp_path, n: int = 300):
    out = unique_dir(tmp_path, "out")
    flow = ep.Dataflow("reuse", parallelism=2)
    flow.source("numbers", ep.sources.CollectionSource(list(range(n)), num_splits=2)).map("where", _worker).sink(
        "out", FileSink(out))
    result = flow.run(runtime="spark", checkpoint=ep.CheckpointConfig(
        interval=0.2, storage="file://" + unique_dir(tmp_path, "ckpt")))
    return result, read_committed(out)


def test_jobs_of_one_process_reuse_the_session_and_its_forked_workers(spark, tmp_path):
    from pyspark.sql import SparkSession

    first, rows1 = _run_once(tmp_path)
    second, rows2 = _run_once(tmp_path)
    for rows in (rows1, rows2):  # exactly once each: the plain-Python oracle is range(n)
        assert sorted(r["x"] for r in rows) == list(range(300))
    assert SparkSession.getActiveSession() is spark  # no second session, no second JVM
    pids1, pids2 = {r["pid"] for r in rows1}, {r["pid"] for r in rows2}
    assert len(pids1) == 2, pids1  # both subtasks read a split: every worker of the first job is seen
    assert pids2 <= pids1, "the second job's tasks ran in new Python workers"
    assert all(DAEMON_MODULE in r["parent"] for r in rows1 + rows2), {r["parent"] for r in rows1}
    # (how fast the second job connects is benchmarks/coldstart.py's to measure, not a timed assertion's)


def test_an_existing_session_is_not_started_again(spark):
    assert start_local_session() is None


def test_the_daemon_preloads_the_task_runtime():
    assert daemon.preload() == []


def test_the_class_archive_is_keyed_by_jvm_spark_and_options(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm_archive.CACHE_ENV, str(tmp_path))
    path = jvm_archive.archive_path(LOCAL_JAVA_OPTIONS)
    assert path.parent == tmp_path and path.suffix == ".jsa"
    assert jvm_archive.archive_path(LOCAL_JAVA_OPTIONS + " -Xmx2g") != path
    path.write_bytes(b"x")  # present: used, never regenerated
    options = jvm_archive.java_options(LOCAL_JAVA_OPTIONS)
    assert f"-XX:SharedArchiveFile={path}" in options and "-Xshare:auto" in options
    assert not path.with_suffix(".lock").exists()


def test_the_class_archive_is_made_once_and_can_be_switched_off(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm_archive.CACHE_ENV, str(tmp_path))
    path = jvm_archive.archive_path(LOCAL_JAVA_OPTIONS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".lock").write_text("")  # another process is making it
    assert jvm_archive.java_options(LOCAL_JAVA_OPTIONS) == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.with_suffix(".lock").name]  # no second maker
    monkeypatch.setenv(jvm_archive.CACHE_ENV, "off")
    assert jvm_archive.archive_path(LOCAL_JAVA_OPTIONS) is None
    assert jvm_archive.java_options(LOCAL_JAVA_OPTIONS) == ""


def test_a_recent_failure_to_make_the_archive_is_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv(jvm_archive.CACHE_ENV, str(tmp_path))
    path = jvm_archive.archive_path(LOCAL_JAVA_OPTIONS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".failed").write_text("0\n")
    assert jvm_archive.java_options(LOCAL_JAVA_OPTIONS) == ""
    assert not path.with_suffix(".lock").exists()  # no maker started
