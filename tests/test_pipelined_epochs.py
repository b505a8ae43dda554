"""Low-latency checkpointing (issue 24): epochs of a few milliseconds, several in flight at
once (``max_concurrent`` > 1), small task state inline in ``_metadata``.

System tests compare with the plain-Python word count (:func:`pipelines.wordcount_oracle`);
each asserts that epochs really overlapped (an epoch triggered before its predecessor
completed), and the fault tests that their fault fired. Pure tests cover inline state
handles in checkpoint storage and the coordinator's periodic due time.
"""
from __future__ import annotations

import base64
import os
import re

import pytest

import epochal as ep
from epochal.backends.layout import StateHandle, state_handles
from epochal.backends.storage import CheckpointStorage
from epochal.config import CheckpointConfig
from epochal.epochs.coordinator import EpochCoordinator
from epochal.errors import CheckpointStorageError, ConfigError
from epochal.testing import CrashDuringCommit, CrashDuringDurability
from pipelines import output, running_counts, unique_dir, wordcount, wordcount_oracle

N_LINES = 2000
CHANNELS = ep.ChannelConfig(batch_size=32, linger="1ms")
_PART = re.compile(r"^part-[0-9a-f]{8}-e(\d+)-s(\d+)-")


def _run(tmp_path, faults=(), **ckpt):
    out = unique_dir(tmp_path, "out")
    storage = "file://" + unique_dir(tmp_path, "ckpt")
    cfg = ep.CheckpointConfig(storage=storage, **{"interval": 0.005, "max_concurrent": 3, **ckpt})
    result = wordcount("pipelined", out, n_lines=N_LINES, rate=500.0).run(
        checkpoint=cfg, restart=ep.RestartStrategy(max_attempts=2), channels=CHANNELS, runtime="local",
        faults=faults)
    return result, out, CheckpointStorage(storage, "pipelined")


def _overlaps(completed: list[dict]) -> int:
    """Epochs triggered before the previous epoch completed (wall clock of the driver)."""
    return sum(1 for a, b in zip(completed, completed[1:])
               if b["wall_time"] - b["duration_s"] < a["wall_time"])


def _commit_order(out: str) -> list[tuple[int, int]]:
    """``(subtask, epoch)`` of the committed part files in the order they were renamed into
    place (their inode change time), as an outside observer of the directory sees it."""
    files = [(os.stat(os.path.join(out, n)).st_ctime_ns, n) for n in os.listdir(out) if _PART.match(n)]
    return [(int(_PART.match(n).group(2)), int(_PART.match(n).group(1))) for _t, n in sorted(files)]


def test_concurrent_epochs_commit_in_order_and_equal_the_oracle(tmp_path):
    result, out, storage = _run(tmp_path)
    assert output(out) == wordcount_oracle(N_LINES)
    epochs = [e["epoch"] for e in result.completed_epochs]
    assert epochs == sorted(epochs) and len(epochs) >= 5, epochs
    assert _overlaps(result.completed_epochs) >= 1, "no two epochs were ever in flight at once"
    per_subtask: dict[int, list[int]] = {}
    for subtask, epoch in _commit_order(out):
        per_subtask.setdefault(subtask, []).append(epoch)
    assert per_subtask and all(e == sorted(e) for e in per_subtask.values()), per_subtask
    # the state travelled inline: the latest checkpoint references no state file at all
    epoch, meta = storage.latest_completed()
    handles = [StateHandle.from_dict(t["handle"]) for t in meta["tasks"].values()]
    assert handles and all(h.is_inline for h in handles)
    assert state_handles(meta) == []
    assert os.listdir(storage.epoch_dir(epoch).split("://")[-1]) == ["_metadata"]
    # ... and reads back offline: the reduce's state is one running count per distinct word
    table = ep.state.read(storage.root_url, "count")
    words = {w for w, _n in (tuple(r) for r in running_counts(N_LINES))}
    assert table.num_rows == len(words)


@pytest.mark.parametrize("inline_state", [16 * 1024, 0], ids=["inline", "files"])
def test_a_crash_between_pipelined_completions_recovers_exactly_once(tmp_path, inline_state):
    """The sink's process dies when told epoch 6 completed, before committing it, while
    later epochs are in flight: the restart re-commits 6 from its restored state, drops
    the later ones, and the output equals the oracle."""
    fault = CrashDuringCommit("out", epoch=6, subtask=1, how="exit")
    result, out, storage = _run(tmp_path, faults=[fault], inline_state=inline_state)
    assert result.attempts == 2 and "disconnected" in result.failures[0], result.failures
    assert result.restored_from[1] is not None and result.restored_from[1] >= 6, result.restored_from
    assert output(out) == wordcount_oracle(N_LINES)
    assert _overlaps(result.completed_epochs) >= 1
    _epoch, meta = storage.latest_completed()
    assert all(StateHandle.from_dict(t["handle"]).is_inline == bool(inline_state) for t in meta["tasks"].values())


def test_a_crash_before_a_pipelined_epoch_is_durable_recovers_exactly_once(tmp_path):
    """The sink's process dies in the durability step of epoch 5 while older epochs may
    still be completing: 5 never completes, the restart restores an older epoch."""
    fault = CrashDuringDurability("out", epoch=5, subtask=0, how="exit")
    result, out, _storage = _run(tmp_path, faults=[fault])
    assert result.attempts == 2, result.failures
    assert result.restored_from[1] is None or result.restored_from[1] < 5, result.restored_from
    assert output(out) == wordcount_oracle(N_LINES)


# ------------------------------------------------------------------------- inline state
def test_inline_state_round_trips_and_is_not_a_file(tmp_path):
    storage = CheckpointStorage(f"file://{tmp_path}/ckpt", "job")
    handle = storage.inline_state(b"small state")
    assert handle.is_inline and handle.size == 11
    assert storage.read_state(handle) == b"small state"
    assert storage.read_state(handle.to_dict()) == b"small state"
    big = storage.write_state(1, "t-0.state", b"x" * 100)
    assert big.to_dict().keys() == {"path", "size", "sha256"}  # format 1 of a file handle, unchanged
    storage.write_metadata(1, {"tasks": {"a": {"handle": handle.to_dict()}, "b": {"handle": big.to_dict()}}})
    assert state_handles(storage.read_metadata(1)) == [big]
    storage.write_metadata(2, {"tasks": {"a": {"handle": handle.to_dict()}}})
    storage.write_metadata(3, {"tasks": {"a": {"handle": handle.to_dict()}}})
    assert storage.retain(2) == [1]
    assert storage.read_state(StateHandle.from_dict(storage.read_metadata(3)["tasks"]["a"]["handle"])) == b"small state"
    assert storage.latest_restorable()[0] == 3


def test_corrupt_inline_state_is_refused(tmp_path):
    storage = CheckpointStorage(f"file://{tmp_path}/ckpt", "job")
    handle = storage.inline_state(b"small state").to_dict()
    handle["inline"] = base64.b64encode(b"small stat!").decode()
    with pytest.raises(CheckpointStorageError, match="inline state .* corrupt: sha256 mismatch"):
        storage.read_state(handle)


def test_inline_state_is_validated():
    with pytest.raises(ConfigError, match="checkpoint.inline_state"):
        CheckpointConfig(inline_state=-1)
    assert CheckpointConfig().inline_state == 16 * 1024


def test_the_coordinator_says_when_the_next_periodic_trigger_is_due():
    c = EpochCoordinator(CheckpointConfig(interval=0.005, max_concurrent=2), ["a"])
    assert c.next_periodic_due is None  # no time observed yet
    assert c.maybe_trigger(10.0) is None
    assert c.next_periodic_due == pytest.approx(10.005)
    assert c.maybe_trigger(10.005).epoch == 1
    assert c.next_periodic_due == pytest.approx(10.010)
    assert EpochCoordinator(CheckpointConfig(interval=None), ["a"]).next_periodic_due is None
