"""Savepoints are signed like checkpoints, and ``_metadata`` is read once (issue 51 §2).

* a job with ``signing_key`` writes savepoints whose ``_metadata`` carries the HMAC, so it
  restores its own savepoint (before: refused as "not signed", the only way out being to
  drop the key); the restored output equals the plain-Python oracle;
* a savepoint changed without the key (a state file swapped, its digest fixed in
  ``_metadata``) is refused with the key;
* a ``_metadata`` swapped between reads (planted content read first, the genuine signed
  document put back right after) cannot be signed in: the document verified is the one used.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

import epochal as ep
from epochal.backends.storage import CheckpointStorage
from epochal.errors import ConfigError
from epochal.sinks import read_committed

from pipelines import canon, unique_dir
from test_savepoints import PER_SPLIT, SPLITS, counting, running, word_counts

KEY = b"the job's signing key, 32 bytes!"


@pytest.fixture(scope="module")
def signed_savepoint(tmp_path_factory):
    """``(out, savepoint dir)`` of a signed job stopped midway with a savepoint."""
    tmp = tmp_path_factory.mktemp("signed")
    out, url = unique_dir(tmp, "out"), str(tmp / "sp")
    handle = counting(out).start(runtime="local", checkpoint=ep.CheckpointConfig(
        interval=0.1, storage="file://" + unique_dir(tmp, "ckpt"), signing_key=KEY, inline_state=0))
    deadline = time.monotonic() + 60
    while len(handle.completed_epochs) < 2:
        assert time.monotonic() < deadline and handle.running, "no 2 epochs within 60 s"
        time.sleep(0.02)
    assert handle.stop_with_savepoint(url, timeout=60) == url
    handle.wait(30)
    return out, Path(url)


def _copy(signed_savepoint, tmp_path):
    out, sp = signed_savepoint
    mine_out, mine_sp = tmp_path / "out", tmp_path / "sp"
    shutil.copytree(out, mine_out)
    shutil.copytree(sp, mine_sp)
    return str(mine_out), mine_sp


def _metadata_path(sp: Path) -> Path:
    (path,) = sp.glob("chk-*/_metadata")
    return path


def _restore(out: str, sp: Path, tmp_path, key=KEY):
    return counting(out).run(runtime="local", restore_from=str(sp), checkpoint=ep.CheckpointConfig(
        interval=0.2, storage="file://" + unique_dir(tmp_path, "ckpt2"), signing_key=key))


def test_a_signed_job_restores_its_own_savepoint(signed_savepoint, tmp_path):
    out, sp = _copy(signed_savepoint, tmp_path)
    assert "signature" in json.loads(_metadata_path(sp).read_text())
    result = _restore(out, sp, tmp_path)
    assert result.restored_from is not None
    everything = word_counts({str(s): PER_SPLIT for s in range(SPLITS)})  # the oracle
    assert canon(read_committed(out)) == running(everything)


def test_a_tampered_savepoint_is_refused_with_the_key(signed_savepoint, tmp_path):
    out, sp = _copy(signed_savepoint, tmp_path)
    path = _metadata_path(sp)
    doc = json.loads(path.read_text())
    task, handle = next((t, e["handle"]) for t, e in doc["meta"]["tasks"].items() if "sha256" in (e.get("handle") or {}))
    state = sp / handle["path"]
    state.write_bytes(b"planted" + state.read_bytes())  # another state file, its digest "fixed"
    import hashlib

    handle["size"], handle["sha256"] = state.stat().st_size, hashlib.sha256(state.read_bytes()).hexdigest()
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="its _metadata is not trusted: its signature does not match its contents"):
        _restore(out, sp, tmp_path)
    # the oracle of the check: the change really is there, and without a key it would be taken
    assert ep.state.open_checkpoint(str(sp)).meta["tasks"][task]["handle"]["sha256"] == handle["sha256"]


def test_a_metadata_swapped_between_reads_is_not_signed_in(signed_savepoint, tmp_path, monkeypatch):
    out, sp = _copy(signed_savepoint, tmp_path)
    path = _metadata_path(sp)
    genuine = path.read_bytes()
    planted = json.loads(genuine)
    planted["meta"]["planted"] = True  # what the attacker wants restored (and re-signed)
    path.write_text(json.dumps(planted))
    swaps = []
    inspect = CheckpointStorage.inspect_metadata

    def read_then_swap_back(self, epoch):
        found = inspect(self, epoch)
        if self.root.rstrip("/").endswith(str(sp)) and not swaps:  # right after the first read
            path.write_bytes(genuine)
            swaps.append(epoch)
        return found

    monkeypatch.setattr(CheckpointStorage, "inspect_metadata", read_then_swap_back)
    with pytest.raises(ConfigError, match="its _metadata is not trusted: its signature does not match"):
        _restore(out, sp, tmp_path)
    assert swaps, "the swap was never injected"


def test_epochal_savepoint_create_verifies_and_signs_with_the_key_file(signed_savepoint, tmp_path, capsys):
    """The CLI's copy of a signed checkpoint: verified with ``--signing-key-file`` before it
    is copied and signed with it (so the job restores it); another key is refused."""
    from epochal.backends import signing
    from epochal.cli import main

    _out, sp = _copy(signed_savepoint, tmp_path)
    key_file = tmp_path / "key"
    key_file.write_text(KEY.decode() + "\n")
    target = tmp_path / "copy"
    assert main(["savepoint", "create", str(sp), str(target), "--signing-key-file", str(key_file)]) == 0
    assert signing.verify(json.loads(_metadata_path(target).read_text()), KEY) == ""
    key_file.write_text("another key of the same length!!")
    assert main(["savepoint", "create", str(sp), str(tmp_path / "copy2"), "--signing-key-file", str(key_file)]) == 1
    assert "not trusted: it is signed with another key" in capsys.readouterr().err
