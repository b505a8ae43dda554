"""The transactional log's storage (:class:`TransactionalLog`), its read_committed readers
and :class:`LogSource`, the replayable source over a topic (splits = partitions, state =
offsets). :class:`~epochal.sinks.log.LogSink` writes it; its docstring has the layout and
the comparison with Kafka.

A partition's offsets are dense, ``0, 1, 2, …``, over the records of its valid commit
markers in marker order (Kafka's offsets as a read_committed consumer sees them). Data of
open, pre-committed or aborted transactions is never returned: it has no marker. A commit
marker that follows a newer fence of its transactional id (a zombie's) is skipped, by every
reader alike, so all readers agree on every offset forever.

>>> import uuid
>>> root = f"memory://doc-{uuid.uuid4().hex}"
>>> log = TransactionalLog.create_topic(root, "t", 1)
>>> LogReader(root, "t", 0).read(0, 10), read_committed_log(root, "t")
([], {0: []})
"""
from __future__ import annotations

import bisect
import json
import os
import posixpath
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from epochal.config import parse_duration
from epochal.durable import fsync, fsync_dir
from epochal.errors import ConfigError
from epochal.sources.base import Poll, Source, SourceReader, check_max_records, check_positive_int

__all__ = ["CommittedBatch", "LogReader", "LogSource", "TransactionalLog", "UnknownTopicError",
           "read_committed_log"]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_MARKER = re.compile(r"^commit-(\d{12})\.json$")
_MEMORY_LOCK = threading.Lock()  # memory:// lives in one process: a lock makes creation exclusive


class UnknownTopicError(ConfigError, LookupError):
    """The topic has no ``_topic.json`` (it was never created)."""


def check_name(value, what: str) -> str:
    """``value`` if it is a valid topic / transactional id name, else ConfigError naming ``what``."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(f"{what}: expected a non-empty name of letters, digits, '_', '.', '-', got {value!r}")
    return value


class TransactionalLog:
    """The files of one topic: metadata, producer epochs and the partitions' marker logs.

    Markers are immutable once created and created only by :meth:`append_marker`, which
    never overwrites, so a reader that has seen marker ``seq`` has seen every marker before it.
    """

    def __init__(self, root: str, topic: str):
        if not isinstance(root, str) or not root:
            raise ConfigError(f"log root: expected a non-empty path or URL, got {root!r}")
        self.root, self.topic = root, check_name(topic, "topic")
        self.fs, base = fsspec.core.url_to_fs(root)
        self.dir = posixpath.join(base, topic)
        self._partitions: int | None = None
        self._tips: dict[int, int] = {}  # partition -> a lower bound of the last marker seq

    @classmethod
    def create_topic(cls, root: str, topic: str, partitions: int) -> TransactionalLog:
        """Create ``topic`` with ``partitions`` partitions, or open it if it exists with as many.

        Raises:
            ConfigError: ``partitions`` is not a positive int, or the topic exists with another count.
        """
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"topic {topic!r} partitions: expected an integer >= 1, got {partitions!r}")
        log = cls(root, topic)
        meta = json.dumps({"topic": topic, "partitions": partitions, "format": 1}).encode()
        log.create_exclusive(log.path("_topic.json"), meta)
        if log.partitions != partitions:
            raise ConfigError(f"topic {topic!r} under {root!r} exists with {log.partitions} partitions, "
                              f"not {partitions}; the partition count of a topic never changes")
        return log

    def exists(self) -> bool:
        return self.fs.exists(self.path("_topic.json"))

    @property
    def partitions(self) -> int:
        if self._partitions is None:
            try:
                self._partitions = int(json.loads(self.read_bytes(self.path("_topic.json")))["partitions"])
            except FileNotFoundError:
                raise UnknownTopicError(f"topic {self.topic!r} does not exist under {self.root!r}; create it "
                                        "with TransactionalLog.create_topic or LogSink(partitions=...)") from None
        return self._partitions

    def path(self, *parts) -> str:
        return posixpath.join(self.dir, *map(str, parts))

    def partition_path(self, p: int, *parts) -> str:
        return self.path(f"partition-{p}", *parts)

    # ------------------------------------------------------------------ markers

    def marker(self, p: int, seq: int) -> dict | None:
        """Marker ``seq`` of partition ``p``, or None if it does not exist (yet)."""
        try:
            return json.loads(self.read_bytes(self.partition_path(p, f"commit-{seq:012d}.json")))
        except FileNotFoundError:
            return None

    def tip(self, p: int) -> int:
        """A lower bound of the seq of partition ``p``'s last marker (-1: none); cached."""
        if p not in self._tips:
            try:
                names = [posixpath.basename(n) for n in self.fs.ls(self.partition_path(p), detail=False)]
            except FileNotFoundError:
                names = []
            self._tips[p] = max((int(m.group(1)) for m in map(_MARKER.match, names) if m), default=-1)
        return self._tips[p]

    def append_marker(self, p: int, content: dict) -> int:
        """Create the next marker of partition ``p`` (exclusive create; retries on a race)."""
        data = json.dumps(content, sort_keys=True).encode()
        seq = self.tip(p) + 1
        while True:
            path = self.partition_path(p, f"commit-{seq:012d}.json")
            if not self.fs.exists(path) and self.create_exclusive(path, data):
                break
            seq += 1
        self._tips[p] = seq
        return seq

    # ------------------------------------------------------------------ producers

    def producer_epoch(self, txid: str) -> int | None:
        try:
            return int(json.loads(self.read_bytes(self.path("_producers", f"{txid}.json")))["producer_epoch"])
        except FileNotFoundError:
            return None

    def init_producer(self, txid: str, **info) -> int:
        """Bump the producer epoch of ``txid`` (Kafka's ``initTransactions``) and fence every
        partition against older producers; returns the new epoch.

        Assumes writers of one transactional id do not initialise concurrently (the engine
        starts generation g + 1 only after generation g failed).
        """
        previous = self.producer_epoch(txid)
        epoch = 0 if previous is None else previous + 1
        record = {"transactional_id": txid, "producer_epoch": epoch, **info}
        self.write_atomic(self.path("_producers", f"{txid}.json"), json.dumps(record).encode())
        if previous is not None:  # older producers may still be alive
            for p in range(self.partitions):
                self.append_marker(p, {"type": "fence", "transactional_id": txid, "producer_epoch": epoch})
        return epoch

    # ------------------------------------------------------------------ file primitives

    def read_bytes(self, path: str) -> bytes:
        """Whole file contents; raises FileNotFoundError. Safe against concurrent readers."""
        if isinstance(self.fs, MemoryFileSystem):  # open() shares one file object (and position)
            try:
                return self.fs.store[self.fs._strip_protocol(path)].getvalue()
            except KeyError:
                raise FileNotFoundError(path) from None
        return self.fs.cat_file(path)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` all at once (temp file + rename), durably."""
        self.fs.mv(self._temp(path, data), path)
        fsync_dir(self.fs, posixpath.dirname(path))

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` unless it exists; readers never see a partial file."""
        tmp = self._temp(path, data)
        if isinstance(self.fs, LocalFileSystem):
            try:
                os.link(tmp, path)  # atomic, never overwrites
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            fsync_dir(self.fs, posixpath.dirname(path))
            return True
        with _MEMORY_LOCK:  # memory:// (or a store without exclusive create: one process only)
            if self.fs.exists(path):
                self.fs.rm(tmp)
                return False
            self.fs.mv(tmp, path)
            return True

    def _temp(self, path: str, data: bytes) -> str:
        parent = posixpath.dirname(path)
        self.fs.makedirs(parent, exist_ok=True)
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.tmp")
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
            fsync(f)
        return tmp


@dataclass(frozen=True)
class CommittedBatch:
    """One committed transaction's records in one partition: offsets ``[base, base + count)``."""

    base_offset: int
    count: int
    transactional_id: str
    txn: str
    segment: str


class LogReader:
    """A read_committed consumer of one partition; caches the marker index and the last batch.

    Every call first picks up markers committed since the previous one (cheap: it probes
    for the next marker file), so a reader may be polled while writers commit.
    """

    def __init__(self, root: str, topic: str, partition: int, *, log: TransactionalLog | None = None):
        self._log = log or TransactionalLog(root, topic)
        if not isinstance(partition, int) or not 0 <= partition < self._log.partitions:
            raise ValueError(f"topic {topic!r} has partitions 0..{self._log.partitions - 1}, got {partition!r}")
        self.partition = partition
        self._batches: list[CommittedBatch] = []
        self._bases: list[int] = []
        self._fences: dict[str, int] = {}  # transactional id -> highest fenced producer epoch so far
        self._next_seq = 0
        self._end = 0
        self._cached: tuple[int, list] | None = None  # (batch index, its records)

    def refresh(self) -> int:
        """Read markers committed since the last call; returns how many records became visible."""
        before = self._end
        while (m := self._log.marker(self.partition, self._next_seq)) is not None:
            self._next_seq += 1
            txid, epoch = m["transactional_id"], m["producer_epoch"]
            if m["type"] == "fence":
                self._fences[txid] = max(self._fences.get(txid, -1), epoch)
            elif m["type"] == "commit" and epoch >= self._fences.get(txid, -1) and m["records"] > 0:
                self._batches.append(CommittedBatch(self._end, m["records"], txid, m["txn"], m["segment"]))
                self._bases.append(self._end)
                self._end += m["records"]
        return self._end - before

    def end_offset(self) -> int:
        """The offset the next committed record will get (Kafka's last stable offset)."""
        self.refresh()
        return self._end

    def batches(self) -> list[CommittedBatch]:
        """The committed transactions of this partition, in offset order."""
        self.refresh()
        return list(self._batches)

    def read(self, from_offset: int = 0, max_records: int | None = None) -> list:
        """The committed records at offsets ``from_offset, from_offset + 1, …`` (at most
        ``max_records``; None: all). Empty at the end of the partition.

        Raises:
            ValueError: ``from_offset`` is negative or beyond the end of the partition (an
                offset from another log, or a topic deleted and re-created).
        """
        self.refresh()
        if not isinstance(from_offset, int) or not 0 <= from_offset <= self._end:
            raise ValueError(f"topic {self._log.topic!r} partition {self.partition}: offset {from_offset!r} is "
                             f"out of range 0..{self._end} (was the topic deleted and re-created?)")
        stop = self._end if max_records is None else min(self._end, from_offset + max_records)
        out: list = []
        i = bisect.bisect_right(self._bases, from_offset) - 1
        while from_offset + len(out) < stop:
            batch, records = self._batches[i], self._load(i)
            at = from_offset + len(out) - batch.base_offset
            out.extend(records[at:at + stop - from_offset - len(out)])
            i += 1
        return out

    def records(self, from_offset: int = 0) -> Iterator[tuple[int, Any]]:
        """Iterate ``(offset, record)`` over what is committed now, from ``from_offset``."""
        offset = from_offset
        for record in self.read(from_offset):
            yield offset, record
            offset += 1

    def _load(self, i: int) -> list:
        if self._cached is None or self._cached[0] != i:
            batch = self._batches[i]
            raw = self._log.read_bytes(self._log.partition_path(self.partition, batch.segment))
            records = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line]
            if len(records) != batch.count:
                raise ValueError(f"topic {self._log.topic!r} partition {self.partition}: segment {batch.segment!r} "
                                 f"has {len(records)} records, its commit marker says {batch.count} (corrupted?)")
            self._cached = (i, records)
        return self._cached[1]


def read_committed_log(root: str, topic: str) -> dict[int, list]:
    """Every committed record of ``topic``, per partition in offset order (read_committed).

    Raises:
        UnknownTopicError: the topic does not exist.
    """
    log = TransactionalLog(root, topic)
    return {p: LogReader(root, topic, p, log=log).read() for p in range(log.partitions)}


class LogSource(Source):
    """The committed records of a topic; split ``p`` is partition ``p``.

    Args:
        root, topic: the log (see :class:`~epochal.sinks.log.LogSink`).
        follow: False (default) — bounded: a reader finishes at the first poll that finds
            nothing new in any of its partitions, i.e. once it has read everything committed
            when it reached the end. True — unbounded: it keeps polling for new commits
            (``idle`` while there are none), for chaining pipelines through the log.
        limit: at most this many records per partition; a partition is done at ``limit``,
            and a reader whose partitions are all done finishes (also with ``follow``).
        poll_interval: with ``follow``, seconds (or ``"50ms"``) between looks for new commits
            after a poll found none.
        partitions: if the topic does not exist when the job is planned, create it with this
            many partitions (a follower may start before its producer); an existing topic
            must have as many.
        schema: read the records (JSON objects, e.g. rows a stream of Arrow batches wrote) as
            ``pyarrow.RecordBatch``es of this schema, up to ``batch_rows`` rows each — a
            columnar stream; offsets still count records.

    State: ``{str(partition): offset of the next unread record}``.
    """

    def __init__(self, root: str, topic: str, *, follow: bool = False, limit: int | None = None,
                 poll_interval: float | str = 0.05, partitions: int | None = None, schema=None,
                 batch_rows: int = 65536):
        if not isinstance(root, str) or not root:
            raise ConfigError(f"LogSource root: expected a non-empty path or URL, got {root!r}")
        self._root, self._topic = root, check_name(topic, "LogSource topic")
        self._follow = bool(follow)
        self._limit = None if limit is None else check_positive_int(limit, "limit", self.name, minimum=0)
        self._poll_interval = parse_duration(poll_interval, "poll_interval")
        self._create = None if partitions is None else check_positive_int(partitions, "partitions", self.name)
        self._partitions: int | None = None
        from epochal.sources.collection import _check_schema

        self._schema = _check_schema(schema, self.name)
        self._batch_rows = check_positive_int(batch_rows, "batch_rows", self.name)

    @property
    def schema(self):
        return self._schema

    @property
    def name(self) -> str:
        return f"LogSource({self._root!r}, {self._topic!r})"

    def locations(self) -> tuple[str, ...]:
        return (self._root,)

    def splits(self) -> list[int]:
        if self._partitions is None:
            log = TransactionalLog(self._root, self._topic)
            if self._create is not None:
                log = TransactionalLog.create_topic(self._root, self._topic, self._create)
            try:
                self._partitions = log.partitions
            except UnknownTopicError as e:
                raise UnknownTopicError(f"{self.name}: {e}; or pass partitions= to create it") from None
        return list(range(self._partitions))

    def create_reader(self, splits: list, state: dict | None, *, subtask: int = 0,
                      parallelism: int = 1) -> SourceReader:
        return _LogSourceReader(self, list(splits), state or {})


class _LogSourceReader(SourceReader):
    """Serves its partitions round-robin, one partition per poll (see :meth:`_poll`)."""

    def __init__(self, source: LogSource, splits: list[int], state: dict):
        self._src = source
        log = TransactionalLog(source._root, source._topic)
        self._readers = {p: LogReader(source._root, source._topic, p, log=log) for p in splits}
        self._next = {}
        for p in splits:
            offset = state.get(str(p), state.get(p, 0))
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"{source.name}: restored state has offset {offset!r} for partition {p}; "
                                 "expected an integer >= 0 (was the state written by another source?)")
            self._next[p] = offset
        self._splits = splits
        self._turn = 0
        self._quiet_since: float | None = None  # follow mode: when a poll last found nothing

    def _done(self, p: int) -> bool:
        return self._src._limit is not None and self._next[p] >= self._src._limit

    def poll(self, max_records: int) -> Poll:
        schema = self._src._schema
        if schema is None:
            return self._poll(max_records)
        poll = self._poll(self._src._batch_rows)  # a columnar stream: one batch of up to batch_rows
        if not poll.records:
            return poll
        import pyarrow as pa

        return Poll([pa.RecordBatch.from_pylist(poll.records, schema=schema)], finished=poll.finished,
                    split=poll.split, split_finished=poll.split_finished)

    def _poll(self, max_records: int) -> Poll:
        """Up to ``max_records`` of *one* partition, the partitions taking turns: a poll names
        its partition (``Poll.split``), so a ``with_watermarks`` chained to the source keeps
        event time per partition (Flink's per-partition watermarks) and a partition read
        ahead of another makes no record of the other late."""
        check_max_records(max_records, self._src.name)
        if all(self._done(p) for p in self._splits):
            return Poll([], finished=True)
        if self._quiet_since is not None and time.monotonic() - self._quiet_since < self._src._poll_interval:
            return Poll([], idle=True)
        n = len(self._splits)
        for k in range(n):
            p = self._splits[(self._turn + k) % n]
            want = max_records
            if self._src._limit is not None:
                want = min(want, self._src._limit - self._next[p])
            if want <= 0:
                continue
            got = self._readers[p].read(self._next[p], want)
            if got:
                self._next[p] += len(got)
                self._turn = (self._turn + k + 1) % n
                self._quiet_since = None
                return Poll(got, finished=all(self._done(q) for q in self._splits), split=p,
                            split_finished=self._done(p))
        if all(self._done(p) for p in self._splits) or not self._src._follow:
            return Poll([], finished=True)
        self._quiet_since = time.monotonic()
        return Poll([], idle=True)

    def snapshot(self) -> dict:
        return {str(p): k for p, k in self._next.items()}
