"""Autonomous channels between regions (seed 000 §3.2): a stream that crosses from one region
to another without coordinating them.

Seed 000: "An operator can consume output streams from both autonomous and consistent
operators as long as the streams are connected to different input ports ... When a
consistent operator has an autonomous input port, it means that the operator can be made
consistent independently of that stream." ``stream.autonomous()`` is such a port: no
barrier crosses it, no region aligns on it, and the two regions it connects keep their own
epochs, checkpoints and restarts (:mod:`epochal.regions.layout` does not merge them).

How a record crosses: the producing region ends the stream in a :class:`RelaySink`, which
hands every batch to the job's :class:`RelayHub` on the driver at once (not per epoch); the
consuming region begins it with a :class:`RelaySource`, whose subtask ``j`` takes what
producer subtask ``j`` handed over. The hub keeps a bounded lane per channel and producer
subtask. What each side's failure does (seed 000 §3.2):

* the **consuming** region restarts from its latest epoch, but the relay source keeps no
  position: what it took after that epoch is not taken again — records cross
  **at most once** into a region behind an autonomous port;
* the **producing** region restarts from its latest epoch and replays: what it handed over
  after that epoch is handed over again — records downstream of an autonomous port may be
  **duplicated**;
* neither side waits for the other's barriers; a full lane (the consumer slower, or down
  for longer than ``capacity`` records last) makes the producer wait — records are never
  dropped while both run.

Frames are unpickled only from peers that prove the hub's key (the wire handshake), in
TLS pinned to the hub's certificate when the job is encrypted, like every other channel.
"""
from __future__ import annotations

import collections
import secrets
import threading
from dataclasses import dataclass, field

from epochal.runtime.transport import wire
from epochal.sinks.api import Sink, SinkWriter
from epochal.sources.base import Poll, Source, SourceReader

#: records a lane holds before its producer waits
DEFAULT_CAPACITY = 100_000
#: how long a relay source's poll waits for records at the hub before reporting idle
TAKE_WAIT = 0.02


class _Lane:
    """One producer subtask's records of one channel, oldest first."""

    __slots__ = ("records", "ended", "handed", "taken")

    def __init__(self):
        self.records: collections.deque = collections.deque()
        self.ended = False
        self.handed = 0  # records handed over by the producer (replays included)
        self.taken = 0  # records taken by the consumer


class RelayHub:
    """The driver's relay: one lane per ``(channel, producer subtask)``; requests
    (each answered in order on its connection):

    * ``("open", channel, j)``: producer subtask ``j`` (re)starts: its lane is not ended;
    * ``("put", channel, j, records)``: append (waits while the lane is full);
    * ``("end", channel, j)``: subtask ``j`` finished its input;
    * ``("take", channel, j, max)``: up to ``max`` records (waiting up to :data:`TAKE_WAIT`
      for some) and whether the lane ended with nothing left.

    One per job of several regions, for its whole life (its address outlives every region's
    restarts); :meth:`close` when the job ends.
    """

    def __init__(self, host: str = "127.0.0.1", advertised_host: str | None = None, tls=None,
                 capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self.token = secrets.token_bytes(32)
        self.tls = tls
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._answering = wire.Answering(self._answer)
        self.server = wire.Server(self.token, self._answering.serve, host=host, name="relay", tls=tls)
        self.address = (advertised_host or host, self.server.address[1])

    def endpoint(self, channel: str) -> RelayEndpoint:
        """What a relay sink or source of ``channel`` needs to reach this hub (shipped with the plan)."""
        return RelayEndpoint(tuple(self.address), self.token, channel, self.tls)

    def _lane(self, channel: str, subtask: int) -> _Lane:
        return self._lanes.setdefault((channel, subtask), _Lane())

    def _answer(self, request: tuple):
        op, channel, subtask = request[0], str(request[1]), int(request[2])
        with self._cond:
            lane = self._lane(channel, subtask)
            if op == "open":
                lane.ended = False
            elif op == "end":
                lane.ended = True
                self._cond.notify_all()
            elif op == "put":
                records = request[3]
                while lane.records and len(lane.records) + len(records) > self.capacity and not self._closed:
                    self._cond.wait(1.0)
                lane.records.extend(records)
                lane.handed += len(records)
                self._cond.notify_all()
            elif op == "take":
                limit = int(request[3])
                if not lane.records and not lane.ended:
                    self._cond.wait(TAKE_WAIT)
                out = [lane.records.popleft() for _ in range(min(limit, len(lane.records)))]
                lane.taken += len(out)
                if out:
                    self._cond.notify_all()
                return ("records", out, lane.ended and not lane.records)
            else:
                return ("error", f"unknown relay request {op!r}")
        return ("ok",)

    def stats(self) -> dict:
        """``{channel: {"handed", "taken", "queued"}}`` summed over the channel's lanes."""
        out: dict[str, dict] = {}
        with self._cond:
            for (channel, _), lane in self._lanes.items():
                s = out.setdefault(channel, {"handed": 0, "taken": 0, "queued": 0})
                s["handed"] += lane.handed
                s["taken"] += lane.taken
                s["queued"] += len(lane.records)
        return out

    def close(self) -> None:
        """Stop serving; wake every waiting request. Idempotent."""
        self.server.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._answering.close()


@dataclass(frozen=True)
class RelayEndpoint:
    """Where channel ``channel``'s hub listens and the key its peers prove."""

    address: tuple
    token: bytes = field(repr=False)
    channel: str
    tls: object = field(default=None, repr=False)

    def connect(self, role: str, subtask: int) -> wire.Connection:
        return wire.connect(self.address, self.token, {"relay": self.channel, "role": role, "subtask": subtask},
                            tls=self.tls)

    def ask(self, conn: wire.Connection, *request):
        conn.send((request[0], self.channel) + request[1:])
        answer = conn.recv()
        if answer[0] == "error":
            raise RuntimeError(f"relay {self.channel!r}: {answer[1]}")
        return answer


class RelaySink(Sink):
    """The producing end of an autonomous channel: hands every batch to the hub at once.

    Not a two-phase-commit sink: nothing waits for an epoch, so a restart of its region
    hands over again what was handed after the epoch it restarts from (duplicates
    downstream, seed 000 §3.2)."""

    local_recovery = True  # each subtask recovers only its own output (failover regions)

    def __init__(self, endpoint: RelayEndpoint):
        self.endpoint = endpoint

    def create_writer(self, ctx) -> SinkWriter:
        return _RelayWriter(self.endpoint, ctx.subtask)


class _RelayWriter(SinkWriter):
    def __init__(self, endpoint: RelayEndpoint, subtask: int):
        self.endpoint, self.subtask = endpoint, subtask
        self.conn: wire.Connection | None = None

    def restore(self, state) -> None:
        self.conn = self.endpoint.connect("producer", self.subtask)
        self.endpoint.ask(self.conn, "open", self.subtask)

    def write(self, record) -> None:
        self.write_many([record])

    def write_many(self, records: list) -> None:
        if records:
            self.endpoint.ask(self.conn, "put", self.subtask, list(records))

    def write_batch(self, batch) -> None:  # Arrow batches cross as they are
        self.write_many([batch])

    def snapshot(self, epoch: int):
        return None

    def notify_epoch_complete(self, epoch: int) -> None:
        pass

    def close(self) -> None:
        if self.conn is not None:
            self.endpoint.ask(self.conn, "end", self.subtask)
        self.release()

    def release(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class RelaySource(Source):
    """The consuming end of an autonomous channel: subtask ``j`` takes producer subtask
    ``j``'s records (one split per producer subtask). Its position is never restored, so
    a restart of its region does not take again what it took before (at most once,
    seed 000 §3.2); it finishes when every producer subtask finished and its lane is empty."""

    def __init__(self, endpoint: RelayEndpoint, producers: int, schema=None):
        self.endpoint, self.producers, self._schema = endpoint, producers, schema

    @property
    def name(self) -> str:
        return f"autonomous channel {self.endpoint.channel!r}"

    @property
    def schema(self):
        return self._schema

    def splits(self) -> list:
        return list(range(self.producers))

    def create_reader(self, splits, state, *, subtask=0, parallelism=1) -> SourceReader:
        return _RelayReader(self.endpoint, list(splits))


class _RelayReader(SourceReader):
    def __init__(self, endpoint: RelayEndpoint, lanes: list):
        self.endpoint, self.lanes = endpoint, lanes
        self.conn: wire.Connection | None = None
        self.next = 0

    def poll(self, max_records: int) -> Poll:
        if not self.lanes:
            return Poll([], finished=True)
        if self.conn is None:
            self.conn = self.endpoint.connect("consumer", self.lanes[0])
        lane = self.lanes[self.next % len(self.lanes)]
        _, records, ended = self.endpoint.ask(self.conn, "take", lane, max_records)
        if ended and not records:
            self.lanes.remove(lane)
            return Poll([], finished=not self.lanes)
        self.next += 1
        return Poll(records, idle=not records)

    def snapshot(self) -> dict:
        return {}  # no position: an autonomous port is not replayed (seed 000 §3.2)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def pass_through(element):
    """The function of an autonomous channel's operator: every element as it is."""
    return element
