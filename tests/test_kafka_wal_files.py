"""The Kafka sink's spill files are private and verified before they are unpickled (issue
51 §3), tested on :class:`~epochal.connectors.kafka.wal.WalSegment` directly (no broker:
what the sink does with a segment is tests/test_kafka_wal.py's):

* a spill directory is created 0700, files ``O_EXCL | O_NOFOLLOW`` 0600; the segment that
  travels in the checkpoint carries the file's SHA-256, and a replay of an intact file gives
  back every record once, in order (the oracle: the rows written);
* a spill file replaced by another user (``nobody``) — or rewritten by anyone — with a
  pickle whose ``__reduce__`` would create a marker is refused at replay, and the marker
  never appears;
* a directory someone else made first (another owner, open to others, a symlink) and a
  file planted at the spill path are refused, naming them;
* the default ``wal_dir`` is not a predictable name.
"""
from __future__ import annotations

import os
import pickle
import pwd
import stat
import tempfile

import pytest

from epochal.connectors.kafka import wal
from epochal.sinks import KafkaSink

ROWS = [(b"k%d" % i, b"value-%04d-" % i + b"x" * 40, None, 1_700_000_000_000 + i) for i in range(300)]


class _Plant:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def _spilled(tmp_path) -> wal.WalSegment:
    """A sealed segment of ROWS with a 1 KB budget (most rows spill), as the checkpoint holds it."""
    segment, budget = wal.WalSegment(), wal.Budget(1000)
    spill = str(tmp_path / "wal" / "prefix" / "lineage-0-g0-e1.wal")
    for i in range(0, len(ROWS), 10):
        rows = ROWS[i:i + 10]
        segment.append_many(rows, sum(len(r[1]) for r in rows), budget, lambda: spill)
    segment.seal()
    segment.sync()
    assert segment.spilled > 0 and segment.path == spill
    return pickle.loads(pickle.dumps(segment))  # through the checkpoint


def test_spill_files_are_private_and_an_intact_one_replays_every_record_once(tmp_path):
    segment = _spilled(tmp_path)
    assert stat.S_IMODE(os.stat(segment.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(segment.path)).st_mode) == 0o700
    assert segment.sha256 and segment.file_bytes == os.path.getsize(segment.path)
    assert list(segment) == ROWS


@pytest.mark.parametrize("who", ["nobody", "same user"])
def test_a_replaced_spill_file_is_refused_at_replay_and_runs_nothing(tmp_path, who):
    segment = _spilled(tmp_path)
    marker = tmp_path / "marker"
    os.remove(segment.path)  # the fault: someone replaces the file with a pickle of their own
    with open(segment.path, "wb") as f:
        pickle.dump([_Plant(str(marker))], f)
    if who == "nobody":
        if os.geteuid() != 0:
            pytest.skip("needs root to hand the file to nobody")
        os.chown(segment.path, pwd.getpwnam("nobody").pw_uid, -1)
        assert os.stat(segment.path).st_uid != os.geteuid()  # the fault is in place
    with pytest.raises(wal.WalUnsafeError, match="refused, not unpickled"):
        list(segment)
    assert not marker.exists(), "the replay unpickled a replaced spill file: code ran"
    pickle.load(open(segment.path, "rb"))  # the oracle of the check: the file does run code when unpickled
    assert marker.exists()


def test_a_directory_or_file_someone_else_made_first_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
        with pytest.raises(wal.WalUnsafeError, match="is owned by uid"):
            wal.private_dir(str(theirs))
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(wal.WalUnsafeError, match="open to group or others"):
        wal.private_dir(str(open_dir))
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(wal.WalUnsafeError, match="is a symlink"):
        wal.private_dir(str(tmp_path / "link"))
    ours = wal.private_dir(str(tmp_path / "a" / "b"))
    assert stat.S_IMODE(os.stat(ours).st_mode) == 0o700 and wal.private_dir(ours) == ours  # idempotent
    planted = os.path.join(ours, "lineage-0-g0-e1.wal")
    open(planted, "wb").close()
    segment = wal.WalSegment()
    with pytest.raises(wal.WalUnsafeError, match="exists already"):
        segment.append_many(ROWS, 10**6, wal.Budget(0), lambda: planted)


def test_the_default_wal_dir_is_not_predictable():
    a, b = KafkaSink("k:9092", "t").wal_dir, KafkaSink("k:9092", "t").wal_dir
    assert a != b and a.startswith(tempfile.gettempdir()) and a.endswith("epochal-kafka-wal")
