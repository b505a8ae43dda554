"""What running on a cluster requires, checked without a cluster: storage every host
sees, Spark settings a barrier stage cannot run under, task addresses, failure summaries;
and encryption and fail-fast address errors on the local runtime."""
from __future__ import annotations

import time

import pytest

import epochal as ep
from epochal.errors import ConfigError, JobFailedError
from epochal.runtime.launch.cluster import check_storage_visible_from_every_host
from epochal.runtime.launch.spark import _check_cluster_conf, summarize_failure
from epochal.runtime.launch.worker import task_addresses
from epochal.sinks import FileSink, read_committed

from pipelines import canon, unique_dir, wordcount, wordcount_oracle


def _plan(tmp_path, sink_path=None, source_dir=None):
    flow = ep.Dataflow("job")
    src = (ep.sources.DirectorySource(source_dir) if source_dir else ep.sources.CollectionSource([1, 2]))
    flow.source("src", src).sink("out", FileSink(sink_path or str(tmp_path / "out")))
    return flow.plan()


def test_local_paths_are_refused_on_a_cluster_with_every_offender_listed(tmp_path):
    (tmp_path / "in").mkdir()
    plan = _plan(tmp_path, source_dir=str(tmp_path / "in"))
    with pytest.raises(ConfigError) as e:
        check_storage_visible_from_every_host(plan, "file:///var/ckpt", (), "spark://m:7077")
    text = str(e.value)
    assert "checkpoint.storage: file:///var/ckpt" in text
    assert f"sink 'out': {tmp_path / 'out'}" in text and f"source 'src': {tmp_path / 'in'}" in text
    assert "s3://" in text and "shared_paths" in text and "spark://m:7077" in text


def test_memory_and_unset_storage_are_refused_s3_and_shared_paths_pass(tmp_path):
    plan = _plan(tmp_path, sink_path="s3://bucket/out")
    with pytest.raises(ConfigError, match="in-memory storage of one process"):
        check_storage_visible_from_every_host(plan, "memory://ckpt", (), "yarn")
    with pytest.raises(ConfigError, match="checkpoint.storage is not set"):
        check_storage_visible_from_every_host(plan, None, (), "yarn")
    check_storage_visible_from_every_host(plan, "s3://bucket/ckpt", (), "yarn")
    shared = _plan(tmp_path, sink_path=str(tmp_path / "nfs" / "out"))
    check_storage_visible_from_every_host(shared, f"file://{tmp_path}/nfs/ckpt", (str(tmp_path / "nfs"),), "yarn")
    with pytest.raises(ConfigError, match="sink 'out'"):  # a sibling of the shared path is not shared
        check_storage_visible_from_every_host(_plan(tmp_path, sink_path=str(tmp_path / "nfs2")),
                                              "s3://b/c", (str(tmp_path / "nfs"),), "yarn")


class _Conf(dict):
    def get(self, key, default=None):
        return super().get(key, default)


def test_spark_settings_a_barrier_stage_cannot_run_under_are_refused():
    with pytest.raises(ConfigError, match="spark.dynamicAllocation.enabled=false"):
        _check_cluster_conf(_Conf({"spark.dynamicAllocation.enabled": "true"}), 4, "spark://m:7077")
    with pytest.raises(ConfigError, match=r"spark.cores.max=6 .*at most 3 concurrent task slots.*runs 4"):
        _check_cluster_conf(_Conf({"spark.cores.max": "6", "spark.task.cpus": "2"}), 4, "spark://m:7077")
    _check_cluster_conf(_Conf({"spark.cores.max": "8", "spark.task.cpus": "2"}), 4, "spark://m:7077")


def test_failure_summaries_name_the_task_or_the_missing_module():
    text = ("py4j ... Job aborted due to stage failure: Could not recover ...\nTraceback ...\n"
            "epochal.errors.TaskStartError: task a[0] on host 10.0.0.2 cannot connect to the coordinator at "
            "10.0.0.9:4000: OSError: [Errno 113] No route to host — ...\n\tat org.apache...")
    cause, primary, fatal = summarize_failure(text)
    assert cause.startswith("task a[0] on host 10.0.0.2 cannot connect to the coordinator at 10.0.0.9:4000")
    assert primary and not fatal
    cause, primary, fatal = summarize_failure("...\nModuleNotFoundError: No module named 'epochal'\n...",
                                              "python3")
    assert fatal and "No module named 'epochal'" in cause and "--archives" in cause and "python3" in cause
    cause, primary, fatal = summarize_failure("x\nMost recent failure reason: ExecutorLostFailure (executor 1 "
                                              "exited)\nmore")
    assert cause == "spark job failed: ExecutorLostFailure (executor 1 exited)" and not primary and not fatal


class _Attempt:
    bind_host = "127.0.0.1"


def test_task_addresses_default_to_the_executor_and_honour_overrides(monkeypatch):
    monkeypatch.delenv("EPOCHAL_TASK_HOST", raising=False)
    monkeypatch.delenv("EPOCHAL_TASK_BIND_HOST", raising=False)
    assert task_addresses(_Attempt(), "10.0.0.2") == ("10.0.0.2", "10.0.0.2")
    assert task_addresses(_Attempt(), None) == ("127.0.0.1", "127.0.0.1")
    monkeypatch.setenv("EPOCHAL_TASK_HOST", "203.0.113.7")
    monkeypatch.setenv("EPOCHAL_TASK_BIND_HOST", "0.0.0.0")
    assert task_addresses(_Attempt(), "10.0.0.2") == ("203.0.113.7", "0.0.0.0")


def test_cluster_config_validates_its_keys():
    with pytest.raises(ConfigError, match="cluster.executor_wait"):
        ep.ClusterConfig(executor_wait="soon")
    with pytest.raises(ConfigError, match="cluster.shared_paths"):
        ep.ClusterConfig(shared_paths=[3])
    assert ep.ClusterConfig(shared_paths="/nfs").shared_paths == ("/nfs",)
    with pytest.raises(ConfigError, match="cluster.peer_timeout"):
        ep.ClusterConfig(peer_timeout="200ms")
    assert ep.ClusterConfig(peer_timeout="2min").peer_timeout == 120.0
    with pytest.raises(ConfigError, match="channels.encryption"):
        ep.ChannelConfig(encryption="yes")


def test_encrypted_word_count_on_the_local_runtime_equals_the_oracle(tmp_path):
    out = unique_dir(tmp_path, "out")
    result = wordcount("tlswc", out, n_lines=2000).run(
        runtime="local", channels=ep.ChannelConfig(encryption=True),
        checkpoint=ep.CheckpointConfig(interval=0.3, storage="file://" + unique_dir(tmp_path, "c")))
    assert result.encrypted
    assert canon(read_committed(out)) == wordcount_oracle(2000)
    plain = wordcount("plainwc", unique_dir(tmp_path, "o2"), n_lines=400).run(
        runtime="local", checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c2")))
    assert not plain.encrypted, "local runs stay unencrypted unless asked"


def test_a_task_that_cannot_bind_fails_the_attempt_at_once_naming_itself(tmp_path, monkeypatch):
    """A task told to bind an address its host does not have (TEST-NET-1) reports that
    before its hello; the attempt fails at once with the task, host and address named —
    not after the start-up timeout while the other tasks wait for a start."""
    monkeypatch.setenv("EPOCHAL_TASK_BIND_HOST", "192.0.2.1")
    t0 = time.monotonic()
    with pytest.raises(JobFailedError) as e:
        wordcount("nobind", unique_dir(tmp_path, "out"), n_lines=400).run(
            runtime="local", restart=ep.RestartStrategy(max_attempts=0),
            checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))
    assert time.monotonic() - t0 < 20
    assert "cannot bind its data server to 192.0.2.1" in str(e.value)
    assert "on host 127.0.0.1" in str(e.value)
