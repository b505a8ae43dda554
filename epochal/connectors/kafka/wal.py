"""The Kafka sink's write-ahead log: an epoch's records as they were produced, kept in
memory up to a byte budget per writer and spilled to a local file beyond it.

librdkafka cannot resume another producer's transaction after a crash, so every epoch's
records must survive until its Kafka commit (:mod:`~epochal.connectors.kafka.sink`). A
:class:`WalSegment` is part of the epoch's picklable handle, hence of the checkpoint:

* records in memory (``records``, ``(key, value, headers, timestamp_ms)``: the very bytes
  objects handed to the producer, no copy) travel in the checkpoint itself;
* once the writer holds more than its budget (:class:`Budget`, all epochs not yet
  committed), later records of the epoch go to the segment's **spill file**
  (``<wal_dir>/<prefix>/<lineage>-<subtask>-g<generation>-e<epoch>.wal``, chunks of pickled
  record lists); the checkpoint holds only its path, size and SHA-256. The file is closed
  at the barrier (task thread), fsynced by the epoch's durability step (uploader thread),
  read back only when the epoch must be produced again, and deleted once Kafka holds the epoch.

Spill files are private (issue 51): ``<wal_dir>/<prefix>`` is created 0700 and must be a
directory (not a symlink) owned by this user, or the spill is refused naming it
(:class:`WalUnsafeError`); each file is created ``O_EXCL | O_NOFOLLOW`` 0600; its SHA-256
is computed as it is written and kept in the segment, so in the checkpoint, and a replay
hashes the file through the one descriptor it then unpickles from: a file changed or
replaced by someone else is refused (:class:`WalUnsafeError`), never unpickled. The
sink's default ``wal_dir`` is ``<tmp>/epochal-<random>/epochal-kafka-wal``
(:func:`default_dir`): a name nobody can create first.

A spill file lives on the task's host: a restart on another host finds it only if
``wal_dir`` is a path every host shares (the sink refuses to replay a missing file, naming
it, rather than losing its records silently).
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from epochal.errors import ConfigError

#: bytes of bookkeeping counted per record held in memory (the tuple and list slot)
RECORD_OVERHEAD = 100


_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_bytes(value, key: str) -> int:
    """``value`` (an int >= 0, or ``"64MB"``, ``"512KiB"``, ...) as bytes; ConfigError naming ``key``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ConfigError(f"{key}: expected a byte count (an int >= 0, or a string such as '64MB'), got {value!r}")


class WalMissingError(OSError):
    """A spill file that a replay needs is gone (another host, or deleted by hand)."""


class WalUnsafeError(OSError):
    """A spill directory or file that others could have written: not owned by this user,
    open to others, a symlink, or (a file at replay) not the bytes the checkpoint recorded."""


def default_dir() -> str:
    """The sink's default ``wal_dir``: under a random directory of the temp dir (created
    0700 on each host at the first spill, owner checked), never a predictable name."""
    return os.path.join(tempfile.gettempdir(), f"epochal-{secrets.token_hex(8)}", "epochal-kafka-wal")


def private_dir(path: str) -> str:
    """Create ``path`` (0700) unless it exists; either way it must be a real directory owned
    by this user and closed to group and others. Idempotent; returns ``path``.

    Raises:
        WalUnsafeError: naming the path, its owner and mode (``KafkaSink wal_dir``).
    """
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    problem = ("is a symlink" if stat.S_ISLNK(st.st_mode) else "is not a directory" if not stat.S_ISDIR(st.st_mode)
               else f"is owned by uid {st.st_uid}, not this user ({os.geteuid()})" if st.st_uid != os.geteuid()
               else f"is open to group or others (mode {stat.S_IMODE(st.st_mode):o}, expected 700)"
               if st.st_mode & 0o077 else "")
    if problem:
        raise WalUnsafeError(f"the write-ahead log spill directory {path!r} {problem}: someone else could read or "
                             "replace the spill files (KafkaSink wal_dir: use a directory only you can write)")
    return path


class Budget:
    """The bytes one writer holds in memory for epochs not yet committed (one per writer,
    task thread only)."""

    def __init__(self, limit: int | None):
        self.limit = limit  # None: no budget, nothing spills (the whole log in checkpoints)
        self.held = 0
        self.peak = 0

    def take(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)

    def give_back(self, n: int) -> None:
        self.held = max(0, self.held - n)


@dataclass
class WalSegment:
    """One epoch's write-ahead log (picklable: it travels in the checkpoint)."""

    records: list = field(default_factory=list)  # in memory, oldest first
    mem_bytes: int = 0  # what ``records`` counts against the budget
    path: str | None = None  # the spill file, once the budget was exceeded
    spilled: int = 0  # records in the spill file
    spilled_bytes: int = 0
    first_ts: int | None = None  # the first record's timestamp (recovery looks for it from there)
    file_bytes: int = 0  # the spill file's size, once sealed
    sha256: str | None = None  # the spill file's SHA-256, once sealed (checked before a replay unpickles it)

    def __getstate__(self):
        """The records in memory as one pickled blob, pickled without a memo: the
        checkpoint's pickler would memoize each record's tuple, key and value (10x the CPU,
        on the uploader thread, holding the GIL the task thread needs). Rows hold no
        cycles and share nothing that must stay shared, so no memo is needed."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("_file", "_hash", "records")}
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.fast = True
        pickler.dump(self.records)
        state["records_blob"] = buffer.getvalue()
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        blob = state.pop("records_blob", None)
        if blob is not None:  # handles pickled before the blob carry ``records`` itself
            state["records"] = pickle.loads(blob)
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.records) + self.spilled

    def append_many(self, rows: list, nbytes: int, budget: Budget, spill_path) -> None:
        """Keep ``rows`` (``nbytes`` of keys and values) in memory while the writer's
        ``budget`` allows, else append them to the spill file (``spill_path()`` names it on
        first use). Task thread, while the epoch is open."""
        if not rows:
            return
        if self.first_ts is None:
            self.first_ts = rows[0][3]
        cost = nbytes + RECORD_OVERHEAD * len(rows)
        if self.path is None and (budget.limit is None or budget.held + cost <= budget.limit):
            self.records.extend(rows)
            self.mem_bytes += cost
            budget.take(cost)
            return
        f = getattr(self, "_file", None)
        if f is None:
            if self.sha256 is not None:
                raise RuntimeError(f"write-ahead log {self.path!r}: appended to after it was sealed")
            if self.path is None:
                self.path = spill_path()
                private_dir(os.path.dirname(self.path))
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                raise WalUnsafeError(f"the write-ahead log spill file {self.path!r} exists already: it was not "
                                     "written by this epoch (KafkaSink wal_dir)") from None
            f = self._file = os.fdopen(fd, "wb")  # closed by seal()
            self._hash = hashlib.sha256()
        data = pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL)
        f.write(data)
        self._hash.update(data)
        self.file_bytes += len(data)
        self.spilled += len(rows)
        self.spilled_bytes += nbytes

    def seal(self) -> None:
        """At the barrier (task thread): close the spill file; nothing is appended after."""
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()
            self._file = None
            self.sha256 = self._hash.hexdigest()

    def sync(self) -> None:
        """The durability step's part (uploader thread): the spill file is on disk."""
        if self.path is None:
            return
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def __iter__(self) -> Iterator[tuple]:
        """Every record, in the order written: memory first, then the spill file."""
        yield from self.records
        if self.path is None or not self.spilled:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise WalMissingError(f"the write-ahead log spill file {self.path!r} ({self.spilled} records) is "
                                  "missing: was the task restarted on another host? (KafkaSink wal_dir must "
                                  "be a path every host shares)") from None
        except OSError as exc:  # ELOOP: a symlink put in its place
            raise WalUnsafeError(f"the write-ahead log spill file {self.path!r} cannot be opened safely: {exc}") from None
        f = os.fdopen(fd, "rb")
        with f:
            self._check_file(f)
            n = 0
            while n < self.spilled:
                rows = pickle.load(f)
                n += len(rows)
                yield from rows
        if n != self.spilled:
            raise WalMissingError(f"the write-ahead log spill file {self.path!r} holds {n} records, "
                                  f"{self.spilled} expected")

    def _check_file(self, f) -> None:
        """Before anything of ``f`` (the open spill file) is unpickled: it is this user's, and
        its bytes are those the checkpoint recorded (hashed through ``f`` itself, then
        rewound, so a file swapped after the check is not the one read)."""
        st = os.fstat(f.fileno())
        where = f"the write-ahead log spill file {self.path!r}"
        if st.st_uid != os.geteuid():
            raise WalUnsafeError(f"{where} is owned by uid {st.st_uid}, not this user: replaced by someone else? "
                                 "refused, not unpickled")
        if self.sha256 is None:  # a handle checkpointed before digests: its file must at least be private
            if st.st_mode & 0o022:
                raise WalUnsafeError(f"{where} has no recorded digest and others may write it "
                                     f"(mode {stat.S_IMODE(st.st_mode):o}): refused, not unpickled")
            return
        digest = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
        if st.st_size != self.file_bytes or digest.hexdigest() != self.sha256:
            raise WalUnsafeError(f"{where} is not the file this epoch's checkpoint recorded ({st.st_size} bytes, "
                                 f"expected {self.file_bytes}; SHA-256 differs): changed or replaced after it was "
                                 "written — refused, not unpickled")
        f.seek(0)

    def release(self, budget: Budget | None) -> None:
        """The epoch is in Kafka (or discarded): give its memory back, delete its spill file."""
        self.seal()
        if budget is not None:
            budget.give_back(self.mem_bytes)
        self.records = []
        self.mem_bytes = 0
        if self.path is not None:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


def remove_orphans(folder: str, lineage: str, subtask: int, generation: int, restored_epoch: int) -> int:
    """Delete spill files of ``lineage`` and ``subtask`` written by generations before
    ``generation`` for epochs after ``restored_epoch``: rolled back, no checkpoint holds
    them. Returns how many were deleted. Idempotent."""
    pattern = re.compile(rf"{re.escape(lineage)}-{subtask}-g(\d+)-e(\d+)\.wal")
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        m = pattern.fullmatch(name)
        if m and int(m.group(1)) < generation and int(m.group(2)) > restored_epoch:
            try:
                os.remove(os.path.join(folder, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed
