"""Secure defaults on a cluster (issue 51 §4), decided where the runtime is configured
(:mod:`epochal.runtime.driver.secure_defaults`): the decisions as pure units — every
combination against a table written out by hand (the oracle) — the generated key file, and
one refusal through ``flow.start`` (the config path), raised before anything runs."""
from __future__ import annotations

import os
import pwd
import stat

import pytest

import epochal as ep
from epochal.errors import ConfigError
from epochal.runtime.driver import secure_defaults as sd

KEY = b"k" * 16


@pytest.mark.parametrize("is_cluster, key, allow_unsigned, expected", [
    (True, None, False, sd.GENERATE),   # a cluster without a key: signed anyway
    (True, None, True, sd.UNSIGNED),    # ... unless opted out by name
    (True, KEY, False, sd.GIVEN),
    (True, KEY, True, sd.GIVEN),        # a given key wins over the opt-out
    (False, None, False, sd.UNSIGNED),  # local runs: the user's own disk
    (False, KEY, False, sd.GIVEN),
])
def test_checkpoints_on_a_cluster_are_signed_unless_opted_out_by_name(is_cluster, key, allow_unsigned, expected):
    assert sd.signing(is_cluster, key, allow_unsigned) == expected


@pytest.mark.parametrize("is_cluster, bind, encryption, allow, expected", [
    (True, "10.0.0.5", None, False, True),
    (True, "10.0.0.5", True, False, True),
    (True, "10.0.0.5", False, True, False),  # opted out by name
    (True, "10.0.0.5", False, False, "refused"),
    (False, "127.0.0.1", None, False, False),  # local, loopback: no TLS needed
    (False, "127.0.0.1", False, False, False),
    (False, "::1", False, False, False),
    (False, "localhost", True, False, True),
    (False, "0.0.0.0", None, False, True),  # a local master bound beyond loopback: TLS by default
    (False, "192.168.1.7", False, False, "refused"),
    (False, "192.168.1.7", False, True, False),
    (False, "driver.example", False, False, "refused"),  # a name resolves to the network
])
def test_plaintext_between_hosts_is_refused_unless_opted_out_by_name(is_cluster, bind, encryption, allow, expected):
    if expected == "refused":
        with pytest.raises(ConfigError, match=r"channels.encryption=False.*channels.allow_plaintext=True"):
            sd.encryption(is_cluster, bind, encryption, allow)
    else:
        assert sd.encryption(is_cluster, bind, encryption, allow) is expected


def test_the_generated_key_is_private_kept_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv(sd.HOME_ENV, str(tmp_path / "home"))
    key, path = sd.job_key()
    assert len(key) == 64 and path == str(tmp_path / "home" / "signing.key")
    assert ep.CheckpointConfig(signing_key=open(path).read().strip()).signing_key == key  # passed on as text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "home").st_mode) == 0o700
    assert sd.job_key() == (key, path)  # the next start (a resume) signs with the same key
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="signing key file .* is open to group or others"):
        sd.job_key()
    os.chmod(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
        with pytest.raises(ConfigError, match="is owned by uid"):
            sd.job_key()
    os.remove(path)
    os.symlink(tmp_path / "elsewhere", path)
    with pytest.raises(ConfigError, match="is a symlink"):
        sd.job_key()


def test_the_config_keys_are_checked_and_a_plaintext_start_beyond_loopback_is_refused(tmp_path, monkeypatch):
    from epochal.runtime.launch.launcher import LocalLauncher

    with pytest.raises(ConfigError, match="channels.allow_plaintext"):
        ep.ChannelConfig(allow_plaintext="yes")
    with pytest.raises(ConfigError, match="checkpoint.allow_unsigned"):
        ep.CheckpointConfig(allow_unsigned=1)
    monkeypatch.setattr(LocalLauncher, "bind_host", "192.0.2.10")  # a driver bound to a network address
    flow = ep.Dataflow("plain")
    flow.source("s", ep.sources.CollectionSource([1, 2])).sink("out", ep.sinks.FileSink(str(tmp_path / "out")))
    storage = tmp_path / "c"
    with pytest.raises(ConfigError, match="the driver binds 192.0.2.10, not loopback.*channels.allow_plaintext"):
        flow.start(runtime="local", channels=ep.ChannelConfig(encryption=False),
                   checkpoint=ep.CheckpointConfig(storage=f"file://{storage}"))
    assert not storage.exists(), "the refusal came after the job started writing"
