"""KafkaSource: a replayable source over Kafka topics; a split is one topic-partition and its
state the next offset to read (seed 004 Alg. 5 and §4.1.3.1 "Regular Sources").

The offsets in checkpoints are the truth; consumer-group offsets are never read. Every
reader ``assign()``s its partitions at explicit offsets — no group membership, no
rebalances — and reads with ``isolation.level=read_committed`` by default, so it sees only
committed transactions (an exactly-once KafkaSink upstream publishes per epoch).

Offsets are "the next offset to fetch", not counts: a read_committed consumer skips
transaction markers and aborted records, so offsets have gaps.
"""
from __future__ import annotations

import logging
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from epochal.config import parse_duration
from epochal.connectors.kafka import trace
from epochal.connectors.kafka.client import (
    check_servers,
    check_topic,
    client_config,
    describe_error,
    kafka,
    list_topics,
    require_topics,
)
from epochal.connectors.kafka.records import KafkaRecord
from epochal.errors import ConfigError, EpochalError
from epochal.sources.base import Poll, Source, SourceReader, check_max_records

log = logging.getLogger("epochal")

__all__ = ["KafkaSource", "KafkaSourceError", "split_name"]

#: seconds a poll waits for the brokers when nothing is buffered
POLL_WAIT_S = 0.01


class KafkaSourceError(EpochalError):
    """A Kafka source cannot go on reading (an offset gone to retention, a record the
    deserializer rejects, a fatal client error); the message names the source and the
    topic-partition and offset."""


#: librdkafka's fetcher sends the next fetch as soon as a response came in, however few
#: records it held: a partition written 25k records/s was fetched ~16k times a second
#: (1.5 records per fetch; the test broker answers at once, as any broker does once
#: ``fetch.min.bytes`` are there), its thread taking 40 % of a core — as much as the task
#: itself. Waiting 1 ms while records are still queued in the client cut that 6x and the
#: fetch lag's p99 from 35 to 4 ms (25k records/s, one partition); a backlog is fetched
#: ``max.partition.fetch.bytes`` at a time either way. Both settings can be overridden.
FETCH_PACING = {"queued.min.messages": 1, "fetch.queue.backoff.ms": 1}


def split_name(topic: str, partition: int) -> str:
    """The split (and state key) of a topic-partition: ``"topic:partition"``."""
    return f"{topic}:{partition}"


def _parse_split(split: str) -> tuple[str, int]:
    topic, _, p = split.rpartition(":")
    return topic, int(p)


def owner_of(split: str, parallelism: int) -> int:
    """The subtask that reads a partition discovered while running: stable across processes."""
    return zlib.crc32(split.encode("utf-8")) % parallelism


class KafkaSource(Source):
    """Read Kafka topics; records are :class:`~epochal.connectors.kafka.records.KafkaRecord`.

    Args:
        bootstrap_servers: ``"host:port[,host:port]"`` (or a list).
        topics: a topic name or a list of them; each must exist when the job starts.
        starting_offsets: where partitions without a checkpointed offset begin:
            ``"earliest"`` (default), ``"latest"`` (the end when the reader starts), or a dict
            ``{(topic, partition) | "topic:partition": offset}`` (partitions missing from it:
            earliest). Resolved to concrete offsets when a reader starts, so a checkpoint
            taken before the first record still holds where to begin.
        stopping_offsets: ``None`` (default: unbounded, follow the topics), ``"latest"``
            (read up to the end offsets seen when the job first started, then finish:
            bounded runs, backfills, tests; kept in checkpoints, so a restart stops at the
            same place) or a dict like ``starting_offsets`` (partitions missing: unbounded).
            Restoring a checkpoint of an unbounded run into a bounded source resolves the
            stopping offsets then; an unbounded source ignores checkpointed ones.
        deserializer: ``bytes -> value`` applied to every record's value (default: keep
            the bytes). A record it raises on fails the job naming the topic, partition and
            offset; to route such records to dead letters instead, deserialize in a
            ``map(..., dead_letters=True)``.
        config: more librdkafka consumer settings (security, fetch sizes, ...);
            ``isolation.level`` defaults to ``read_committed``; ``auto.offset.reset`` to
            ``error`` (a checkpointed offset that retention already deleted fails the job
            rather than silently skipping records); the fetcher waits
            ``fetch.queue.backoff.ms`` (1) before fetching again while ``queued.min.messages``
            (1) or more records wait in the client (:data:`FETCH_PACING`).
        discovery_interval: how often a reader looks for partitions added while the job
            runs (a duration; ``None``: never). New partitions are read from the earliest
            offset, each by subtask ``crc32("topic:partition") % parallelism``. Unbounded
            sources only: a bounded one (``stopping_offsets``) reads the partitions it
            started with, and warns as it finishes, naming any added since that hold records.
        commit_offsets: after every completed epoch, commit the offsets of that epoch to
            the consumer group ``config["group.id"]`` — only so that lag monitoring sees
            progress; epochal never reads them back.

    State: ``{"topic:partition": {"next": offset[, "stop": offset]}}``.

    Raises:
        ConfigError: an invalid argument (when built); unreachable brokers or a missing
            topic (when the job is planned, naming the servers and the topic).
    """

    def __init__(self, bootstrap_servers, topics, *, starting_offsets="earliest", stopping_offsets=None,
                 deserializer: Callable[[bytes], Any] | None = None, config: Mapping | None = None,
                 discovery_interval: float | str | None = 30.0, commit_offsets: bool = False):
        what = "KafkaSource"
        self.servers = check_servers(bootstrap_servers, what)
        names = [topics] if isinstance(topics, str) else list(topics) if isinstance(topics, (list, tuple)) else None
        if not names:
            raise ConfigError(f"{what} topics: expected a topic name or a non-empty list of them, got {topics!r}")
        self.topics = sorted({check_topic(t, what) for t in names})
        self.starting = self._check_offsets(starting_offsets, "starting_offsets", ("earliest", "latest"))
        self.stopping = self._check_offsets(stopping_offsets, "stopping_offsets", ("latest",), optional=True)
        if deserializer is not None and not callable(deserializer):
            raise ConfigError(f"{what} deserializer: expected a callable bytes -> value, got {deserializer!r}")
        self.deserializer = deserializer
        self.config = client_config(self.servers, config, what, reserved=("enable.auto.commit",),
                                    defaults={"isolation.level": "read_committed", "auto.offset.reset": "error",
                                              "queued.max.messages.kbytes": 16384, **FETCH_PACING})
        self.discovery_interval = parse_duration(discovery_interval, "KafkaSource discovery_interval", optional=True)
        if self.stopping is not None:
            self.discovery_interval = None  # a bounded read covers the partitions it started with
        if not isinstance(commit_offsets, bool):
            raise ConfigError(f"{what} commit_offsets: expected True or False, got {commit_offsets!r}")
        if commit_offsets and not self.config.get("group.id"):
            raise ConfigError(f"{what} commit_offsets=True needs config['group.id']: the consumer group whose "
                              "committed offsets lag monitoring reads")
        self.commit_offsets = commit_offsets
        self._splits: list[str] | None = None

    @staticmethod
    def _check_offsets(value, key: str, words: tuple[str, ...], optional: bool = False):
        if value is None and optional:
            return None
        if isinstance(value, str) and value in words:
            return value
        if isinstance(value, Mapping):
            out = {}
            for k, v in value.items():
                split = split_name(*k) if isinstance(k, tuple) and len(k) == 2 else k
                try:
                    _parse_split(split)
                except (ValueError, AttributeError):
                    raise ConfigError(f"KafkaSource {key}: keys must be (topic, partition) or 'topic:partition', "
                                      f"got {k!r}") from None
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ConfigError(f"KafkaSource {key}[{k!r}]: expected an offset >= 0, got {v!r}")
                out[split] = v
            return out
        allowed = " or ".join(repr(w) for w in words)
        raise ConfigError(f"KafkaSource {key}: expected {allowed}, a dict of offsets" +
                          (", or None" if optional else "") + f"; got {value!r}")

    @property
    def name(self) -> str:
        return f"KafkaSource({self.servers!r}, {self.topics})"

    def splits(self) -> list[str]:
        """Every partition of the topics when the job is planned (asks the brokers once)."""
        if self._splits is None:
            kafka()
            counts = require_topics(self.config, self.topics, self.name)
            self._splits = [split_name(t, p) for t in self.topics for p in range(counts[t])]
        return list(self._splits)

    def create_reader(self, splits: list, state: dict | None, *, subtask: int = 0,
                      parallelism: int = 1) -> SourceReader:
        return _KafkaReader(self, list(splits), state or {}, subtask, parallelism, restored=state is not None)


class _KafkaReader(SourceReader):
    """Serves one partition per poll (``Poll.split``), round-robin over partitions with
    buffered records, so ``with_watermarks`` keeps event time per partition."""

    def __init__(self, src: KafkaSource, splits: list[str], state: dict, subtask: int, parallelism: int,
                 restored: bool = False):
        ck = self._ck = kafka()
        self._src = src
        self._subtask, self._parallelism = subtask, parallelism
        self._planned = set(src._splits or splits)
        conf = dict(src.config)
        conf.setdefault("group.id", f"epochal-reader-{uuid.uuid4().hex[:12]}")  # required; never joined
        conf.update({"enable.auto.commit": False, "enable.auto.offset.store": False, "enable.partition.eof": True})
        self._consumer = ck.Consumer(conf)
        self._next: dict[str, int] = {}
        self._stop: dict[str, int | None] = {}
        self._eof: dict[str, int] = {}  # split -> offset of the last end-of-partition event
        self._buffers: dict[str, deque] = {}
        self._turn: deque[str] = deque()  # every owned partition, rotated by each poll
        self._announced: set[str] = set()  # partitions whose end was reported (split_finished)
        self._checked_unread = False  # _warn_unread_partitions ran
        kept = [s for s in state if s not in splits and self._owns(s)]
        dropped = sorted(s for s in kept if _parse_split(s)[0] not in src.topics)
        if dropped:  # a topic taken out of `topics`: its checkpointed partitions are no longer read
            log.info("%s: no longer reads partition(s) %s (their topic is not among the source's topics)",
                     src.name, dropped)
        owned = list(splits) + sorted(set(kept) - set(dropped))
        # after a restore, a partition with no checkpointed offset appeared while the job was
        # down (or its topic was added): it is read from its start, not from starting_offsets
        # ("latest" would skip what was written to it meanwhile)
        self._add([s for s in owned if s in state], state)
        self._add([s for s in owned if s not in state], {}, discovered=restored)
        self._last_discovery = time.monotonic()

    # ------------------------------------------------------------------ assignment

    def _owns(self, split: str) -> bool:
        return split not in self._planned and owner_of(split, self._parallelism) == self._subtask

    def _add(self, splits: list[str], state: dict, discovered: bool = False) -> None:
        """Assign ``splits`` at their restored offsets, or at the resolved starting offsets."""
        if not splits:
            return
        tps = []
        for split in splits:
            entry = state.get(split)
            if entry is not None:
                nxt, stop = self._restored(split, entry)
            else:
                nxt = self._start_offset(split, discovered)
                stop = self._stop_offset(split)
            self._next[split], self._stop[split] = nxt, stop
            self._buffers[split] = deque()
            self._turn.append(split)
            topic, p = _parse_split(split)
            tps.append(self._ck.TopicPartition(topic, p, nxt))
        self._consumer.incremental_assign(tps)

    def _restored(self, split: str, entry) -> tuple[int, int | None]:
        """The checkpointed next offset, and the stopping offset: the checkpointed one if the
        source is bounded and the checkpoint has one (a restart stops where the first start
        would have), else resolved now (a job made bounded on restore); None if unbounded."""
        if isinstance(entry, dict) and isinstance(entry.get("next"), int) and entry["next"] >= 0:
            stop = entry.get("stop")
            if self._src.stopping is None:
                return entry["next"], None
            if stop is None:
                return entry["next"], self._stop_offset(split)
            if isinstance(stop, int) and stop >= 0:
                return entry["next"], stop
        raise ValueError(f"{self._src.name}: restored state has {entry!r} for partition {split}; expected "
                         "{'next': offset[, 'stop': offset]} (was the state written by another source?)")

    def _watermarks(self, split: str) -> tuple[int, int]:
        topic, p = _parse_split(split)
        try:
            return self._consumer.get_watermark_offsets(self._ck.TopicPartition(topic, p), timeout=10.0)
        except self._ck.KafkaException as exc:
            raise KafkaSourceError(f"{self._src.name}: cannot read the offsets of partition {split} on "
                                   f"{self._src.servers}: {describe_error(exc)}") from None

    def _start_offset(self, split: str, discovered: bool) -> int:
        start = "earliest" if discovered else self._src.starting
        if isinstance(start, dict):
            if split in start:
                return start[split]
            start = "earliest"
        low, high = self._watermarks(split)
        return low if start == "earliest" else high

    def _stop_offset(self, split: str) -> int | None:
        stop = self._src.stopping
        if stop is None:
            return None
        if isinstance(stop, dict):
            return stop.get(split)
        return self._watermarks(split)[1]  # the last stable offset under read_committed

    def _discover(self) -> None:
        interval = self._src.discovery_interval
        if interval is None or time.monotonic() - self._last_discovery < interval:
            return
        self._last_discovery = time.monotonic()
        try:
            counts = list_topics(self._src.config, self._src.name, timeout=5.0)
        except ConfigError as exc:  # the brokers are briefly away: try again at the next interval
            log.warning("%s: partition discovery failed: %s", self._src.name, exc)
            return
        new = [split_name(t, p) for t in self._src.topics for p in range(counts.get(t, 0))]
        mine = [s for s in new if s not in self._next and self._owns(s)]
        if mine:
            log.info("%s: subtask %d reads new partition(s) %s", self._src.name, self._subtask, mine)
            self._add(mine, {}, discovered=True)

    # ------------------------------------------------------------------ reading

    def _done(self, split: str) -> bool:
        stop = self._stop[split]
        if stop is None:
            return False
        return self._next[split] >= stop or (self._eof.get(split, -1) >= stop and not self._buffers[split])

    def poll(self, max_records: int) -> Poll:
        """One partition's records (``Poll.split``), partitions taking turns; a partition that
        reached its stopping offset is announced once (``split_finished``), with or without
        records, so it stops holding event time back."""
        check_max_records(max_records, self._src.name)
        if not any(self._buffers.values()):
            self._fetch(max_records)
            self._discover()
        for _ in range(len(self._turn)):
            split = self._turn[0]
            self._turn.rotate(-1)
            buf = self._buffers[split]
            out = []
            stop = self._stop[split]
            while buf and len(out) < max_records:
                record = buf.popleft()
                if stop is not None and record.offset >= stop:
                    buf.clear()  # everything before the stop was read: only markers lie between
                    self._next[split] = max(self._next[split], stop)
                    break
                out.append(record)
            if out:
                self._next[split] = out[-1].offset + 1
            done = self._done(split)
            if out or (done and split not in self._announced):
                if done:
                    self._announced.add(split)
                    topic, p = _parse_split(split)
                    self._consumer.pause([self._ck.TopicPartition(topic, p)])
                return Poll(out, finished=self._all_done(), split=split, split_finished=done)
        if self._all_done():
            return Poll([], finished=True)
        return Poll([], idle=True)

    def _all_done(self) -> bool:
        done = bool(self._next) and all(self._done(s) for s in self._next)
        if done and not self._checked_unread:
            self._checked_unread = True
            self._warn_unread_partitions()
        return done

    def _warn_unread_partitions(self) -> None:
        """Once, as a bounded reader finishes: partitions of its topics this subtask would own
        that appeared after the job was planned are not read (a bounded read covers the
        partitions it started with); if they hold records, say so — never skip them silently."""
        if self._src.stopping is None:
            return
        try:
            counts = list_topics(self._src.config, self._src.name, timeout=5.0)
        except ConfigError as exc:
            log.warning("%s: could not look for partitions added while the job ran: %s", self._src.name, exc)
            return
        added = [split_name(t, p) for t in self._src.topics for p in range(counts.get(t, 0))]
        unread = {}
        for split in added:
            if split in self._next or split in self._planned or not self._owns(split):
                continue
            low, high = self._watermarks(split)
            if high > low:
                unread[split] = high - low
        if unread:
            log.warning("%s: partition(s) %s were added after the job started and hold %s record(s) this job did "
                        "NOT read: a bounded read (stopping_offsets) covers only the partitions it started with. "
                        "Read them with another job (starting_offsets={(topic, partition): 0, ...}), or use an "
                        "unbounded source, which reads added partitions (discovery_interval)", self._src.name,
                        sorted(unread), sum(unread.values()))

    def _fetch(self, max_records: int) -> None:
        """Move up to ``max_records`` messages from the consumer into the per-partition
        buffers (so they never hold more than one poll's worth)."""
        ck, deser = self._ck, self._src.deserializer
        consume = self._consumer.consume
        # what is fetched already; else wait for the first message only, then take what came
        # with it: consume(n, timeout) waits for n messages or the whole timeout, which would
        # hold a 10 ms epoch's records (and its barrier) back by up to POLL_WAIT_S
        messages = consume(num_messages=max_records, timeout=0)
        if not messages:
            messages = consume(num_messages=1, timeout=POLL_WAIT_S)
            if messages and max_records > 1:
                messages += consume(num_messages=max_records - 1, timeout=0)
        if trace.ON and messages:
            stamps = [m.timestamp()[1] for m in messages if m.error() is None]
            trace.event("fetch", n=len(messages), min_ts=min(stamps, default=None), max_ts=max(stamps, default=None))
        # per message only C calls and one tuple: records are built with tuple.__new__ (the
        # NamedTuple's own constructor is a Python function: 14 % of a pass-through task's
        # CPU), and a partition's buffer is looked up once per run of its messages
        make, record_type = tuple.__new__, KafkaRecord
        last = buf = None
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == ck.KafkaError._PARTITION_EOF:
                    self._eof[split_name(msg.topic(), msg.partition())] = msg.offset()
                    continue
                self._fail(msg, err)
                continue
            topic, p = msg.topic(), msg.partition()
            if (topic, p) != last:
                last, buf = (topic, p), self._buffers.get(split_name(topic, p))
            if buf is None:  # not ours
                continue
            value = msg.value()
            if deser is not None:
                try:
                    value = deser(value)
                except Exception as exc:
                    raise KafkaSourceError(
                        f"{self._src.name}: the deserializer raised {type(exc).__name__}: {exc} on the record at "
                        f"offset {msg.offset()} of partition {split_name(topic, p)} (value {value[:100]!r}); fix "
                        "the deserializer, or deserialize in a map(..., dead_letters=True)") from exc
            headers = msg.headers()
            buf.append(make(record_type, (topic, p, msg.offset(), msg.timestamp()[1], msg.key(), value,
                                          tuple(headers) if headers else None)))

    def _fail(self, msg, err) -> None:
        where = f"partition {msg.topic()}:{msg.partition()}" if msg.topic() else "the consumer"
        text = f"{err.name()}: {err.str()}"
        if err.code() == self._ck.KafkaError._AUTO_OFFSET_RESET or "OFFSET_OUT_OF_RANGE" in err.name():
            raise KafkaSourceError(
                f"{self._src.name}: the checkpointed offset of {where} is no longer in the log ({text}): retention "
                "deleted records this job has not read. Restore from an earlier savepoint, or set "
                "config={'auto.offset.reset': 'earliest'} to accept the loss")
        if err.fatal() or not err.retriable():
            raise KafkaSourceError(f"{self._src.name}: reading {where} failed: {text}")
        log.warning("%s: %s: %s (retrying)", self._src.name, where, text)

    def snapshot(self) -> dict:
        out = {}
        for split, nxt in self._next.items():
            entry = {"next": nxt}
            if self._stop[split] is not None:
                entry["stop"] = self._stop[split]
            out[split] = entry
        return out

    def notify_epoch_complete(self, epoch: int, offsets: dict) -> None:
        """``commit_offsets``: commit the epoch's offsets to the group, asynchronously (lag
        monitoring only)."""
        if not self._src.commit_offsets:
            return
        tps = [self._ck.TopicPartition(*_parse_split(s), e["next"]) for s, e in offsets.items()]
        if tps:
            try:
                self._consumer.commit(offsets=tps, asynchronous=True)
            except self._ck.KafkaException as exc:
                log.warning("%s: committing group offsets of epoch %d failed: %s", self._src.name, epoch,
                            describe_error(exc))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
