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
subtask, each record numbered in its lane.

The channel is part of each region's cut: a producer subtask's snapshot holds what it
handed over that the consumer's completed epochs do not hold yet (the lane's queue and what
the consumer took after its epoch), the consumer's snapshot holds the number of the last
record it read per lane. A savepoint takes the consuming regions' cuts first, then the
producing ones' (acks held meanwhile), so a restore refills the lanes from the producers'
snapshots and the consumer takes what comes after its number: nothing that was queued or in
flight is lost or taken twice — a stop with a savepoint and a restore are exactly once. A
new driver resuming from each region's latest checkpoint loses nothing either: a reopened
lane numbers above every number given before (:func:`era`), so what the reader's checkpoint
read beyond the producer's is handed over again (at least once). What each side's failure
does while the driver runs (seed 000 §3.2):

* the **consuming** region restarts from its latest epoch, but the hub handed out what it
  took after that epoch: it is not taken again — records cross **at most once** into a
  region behind an autonomous port;
* the **producing** region restarts from its latest epoch and replays: what it handed over
  after that epoch is handed over again — records downstream of an autonomous port may be
  **duplicated**;
* neither side waits for the other's barriers; a full lane (the consumer slower, or down
  for longer than ``capacity`` records last) makes the producer wait — records are never
  dropped while both run — except while the job stops (:meth:`RelayHub.stopping`): a
  producer whose consumer stopped first must still reach its stop barrier.

Who may do what (issue 51): a connection proves a key of its region's *current attempt*
(:func:`relay_key`: the attempt's key — the region's job secret and generation — for the
channel and role), so a zombie of an older attempt, or a task of another region, cannot
connect; its authenticated hello names the lanes it produces to or takes from, and a
request for any other lane, or of the other role, is refused; a lane's connection of an
older generation than the lane's newest (a failover region relaunched) is refused too.
Every request and answer is data-only tagged JSON (:data:`~epochal.runtime.transport.wire.CONTROL`):
the hub never unpickles anything — records cross as the bytes their producer pickled, one
per record, and only the consuming task unpickles them, from the hub it authenticated
(in TLS pinned to the hub's certificate when the job is encrypted, like every channel).
"""
from __future__ import annotations

import collections
import pickle
import threading
import time
from dataclasses import dataclass, field

from epochal import serde
from epochal.regions.relay_access import CONSUMER, OPS, PRODUCER, refusal, relay_key
from epochal.runtime.transport import credentials, wire
from epochal.sinks.api import Sink, SinkWriter
from epochal.sources.base import Poll, Source, SourceReader

#: records a lane holds before its producer waits
DEFAULT_CAPACITY = 100_000
#: how long a relay source's poll waits for records at the hub before reporting idle
TAKE_WAIT = 0.02
#: how long a connecting peer's handshake waits for its region's attempt to be admitted
ADMIT_WAIT = 5.0
#: the snapshot format of a relay sink whose kept records are the pickled bytes it handed over
_PICKLED = 2


def era() -> int:
    """The lowest number a lane gives after a producer (re)opens it: the hub's clock in
    microseconds × 2¹², above every number given before (by this hub or by a driver that
    died) as long as a lane hands over fewer than 4,096 records a microsecond and the
    driver's clock does not go back. Below 2⁶³ until 2041."""
    return (time.time_ns() // 1000) << 12


class _Lane:
    """One producer subtask's records of one channel, oldest first, each numbered: ``seqs[i]``
    is the lane's sequence number of ``records[i]`` (increasing; numbers are never reused)."""

    __slots__ = ("records", "seqs", "last", "acked", "ended", "handed", "taken", "generation")

    def __init__(self):
        self.records: collections.deque = collections.deque()
        self.seqs: collections.deque = collections.deque()
        self.last = 0  # the highest number given to a record of this lane
        self.acked = 0  # the highest number the consumer's completed epochs hold
        self.ended = False
        self.handed = 0  # records handed over by the producer (replays included)
        self.taken = 0  # records taken by the consumer
        self.generation = {PRODUCER: -1, CONSUMER: -1}  # the newest generation of each role seen here


class RelayHub:
    """The driver's relay: one lane per ``(channel, producer subtask)``; requests
    (each answered in order on its connection; data-only tagged JSON; records are the
    bytes their producer pickled, never unpickled here; a request is for a lane and role
    its connection's hello named, else it is answered ``("error", reason)``):

    * ``("open", channel, j, last, seqs, records)``: producer subtask ``j`` (re)starts: its
      lane is not ended; a restored producer hands back what its snapshot holds that the
      consumer had not checkpointed (records whose number the lane gave already are
      ignored), then the lane numbers on above ``last`` and above :func:`era` — above any
      number an earlier run or incarnation gave, so a reader whose epoch is ahead of the
      producer's is handed the replay again rather than skipping it; answers ``("ok", acked)``;
    * ``("put", channel, j, records)``: append, numbered ``last + 1 ...`` (waits while the lane
      is full, unless the job is stopping); answers ``("ok", first, acked)``;
    * ``("end", channel, j)``: subtask ``j`` finished its input;
    * ``("take", channel, j, max, after, ack)``: up to ``max`` records numbered above ``after``
      (waiting up to :data:`TAKE_WAIT` for some; ones at or below ``after`` are dropped: the
      consumer holds them), their numbers, and whether the lane ended with nothing left;
      ``ack`` (1: a reader whose region takes no periodic epoch) acks what it takes at once;
    * ``("ack", channel, j, seq)``: the consumer's completed epoch holds every record up to
      ``seq``; the producer learns it in its next answer and forgets them.

    One per job of several regions, for its whole life (its address outlives every region's
    restarts); :meth:`close` when the job ends. What it holds is in memory only: the
    producers' snapshots hold it again (:class:`RelaySink`), so a savepoint or a new driver
    loses nothing. Each region's side of a channel is declared with :meth:`endpoint`, and
    the region's current attempt key is given by :meth:`admit`.
    """

    def __init__(self, host: str = "127.0.0.1", advertised_host: str | None = None, tls=None,
                 capacity: int | None = None):
        self.capacity = DEFAULT_CAPACITY if capacity is None else capacity
        self.tls = tls
        self._routes: dict[tuple[str, str], str] = {}  # (channel, role) → the region on that side
        self._admitted: dict[str, object] = {}  # region → () → its current attempt key, or None
        self._lanes: dict[tuple[str, int], _Lane] = {}
        self._held: dict[tuple[str, int], int] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._stopping = False
        self._holding = False  # a savepoint is being taken: producers are not told of new acks
        self._answering = wire.Answering(self._answer, codec=wire.CONTROL, name="relay hub", bound=True)
        self.server = wire.Server(self._key_for, self._answering.serve, host=host, name="relay", tls=tls)
        self.address = (advertised_host or host, self.server.address[1])

    def endpoint(self, channel: str, role: str | None = None, region: str | None = None) -> RelayEndpoint:
        """What a relay sink (``role="producer"``) or source (``"consumer"``) of ``channel``
        in ``region`` needs to reach this hub (shipped with the plan; it holds no key)."""
        if role is not None:
            self._routes[(channel, role)] = region
        return RelayEndpoint(tuple(self.address), channel, self.tls)

    def admit(self, region: str, current_key) -> None:
        """``current_key()``: ``region``'s current attempt key (``None`` while it has none):
        the only key its relay connections may derive theirs from. Idempotent."""
        with self._cond:
            self._admitted[region] = current_key
            self._cond.notify_all()

    def _key_for(self, hello: dict) -> bytes | None:
        """The key the peer saying ``hello`` must prove (handshake thread), ``None``: refused."""
        channel, role, lanes, generation = (hello.get(k) for k in ("relay", "role", "lanes", "generation"))
        if (type(channel) is not str or role not in (PRODUCER, CONSUMER) or type(generation) is not int
                or type(lanes) is not list or not all(type(n) is int for n in lanes)):
            return None
        if (channel, role) not in self._routes:
            return None
        region = self._routes[(channel, role)]
        deadline = time.monotonic() + ADMIT_WAIT
        with self._cond:  # the region's driver may not be admitted yet (its tasks start at once)
            while True:
                current = self._admitted.get(region)
                key = current() if current is not None else None
                remaining = deadline - time.monotonic()
                if key is not None or self._closed or remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.05))  # admit() wakes it; an attempt starting: look again
        return None if key is None else relay_key(key, channel, role)

    def _lane(self, channel: str, subtask: int) -> _Lane:
        return self._lanes.setdefault((channel, subtask), _Lane())

    def stopping(self, on: bool = True) -> None:
        """The job stops (with a savepoint, or cancelled): puts no longer wait for room, so a
        producer whose consumer stopped first still reaches its stop barrier; ``on=False``
        when the stop failed and the job runs on. Idempotent."""
        with self._cond:
            self._stopping = on
            self._cond.notify_all()

    def hold_acks(self, on: bool = True) -> None:
        """While a savepoint is taken (the consumers' regions first, then the producers'),
        the producers keep what the consumers' savepoints may not hold: acks that arrive
        meanwhile are told to them only after ``hold_acks(False)``. Idempotent."""
        with self._cond:
            self._holding = on
            if not on:
                for key, seq in self._held.items():
                    lane = self._lane(*key)
                    lane.acked = max(lane.acked, seq)
                self._held.clear()

    def _ack(self, channel: str, subtask: int, lane: _Lane, seq: int) -> None:
        if self._holding:
            self._held[(channel, subtask)] = max(self._held.get((channel, subtask), 0), seq)
        else:
            lane.acked = max(lane.acked, seq)

    def _answer(self, request, hello: dict | None = None):
        """The answer to ``request`` of a connection whose authenticated hello is ``hello``
        (``None``: a caller in this process, e.g. a scripted test, trusted as it is)."""
        if hello is not None:
            refused = refusal(request, hello)
            if refused:
                return ("error", refused)
        op, channel, subtask = request[0], request[1], request[2]
        with self._cond:
            lane = self._lane(channel, subtask)
            if hello is not None:
                role, generation = OPS[op], hello["generation"]
                if generation < lane.generation[role]:
                    return ("error", f"lane {subtask} of channel {channel!r}: this {role} connection is of generation "
                                     f"{generation}, superseded by generation {lane.generation[role]}")
                lane.generation[role] = generation
            if op == "open":
                last, seqs, records = request[3], request[4], request[5]
                lane.ended = False
                given = lane.last
                for seq, record in zip(seqs, records):
                    if seq > given:  # a number this hub gave already was queued or taken here
                        lane.seqs.append(int(seq))
                        lane.records.append(record)
                lane.last = max(given, last, int(seqs[-1]) if seqs else 0, era())
                self._cond.notify_all()
                return ("ok", lane.acked)
            elif op == "end":
                lane.ended = True
                self._cond.notify_all()
            elif op == "put":
                records = request[3]
                while (lane.records and len(lane.records) + len(records) > self.capacity and not self._closed
                       and not self._stopping):
                    self._cond.wait(1.0)
                first = lane.last + 1
                lane.records.extend(records)
                lane.seqs.extend(range(first, first + len(records)))
                lane.last += len(records)
                lane.handed += len(records)
                self._cond.notify_all()
                return ("ok", first, lane.acked)
            elif op == "take":
                limit, after = int(request[3]), int(request[4])
                if not lane.records and not lane.ended and not self._closed:
                    self._cond.wait(TAKE_WAIT)
                while lane.seqs and lane.seqs[0] <= after:  # the consumer's restored epoch holds it
                    lane.seqs.popleft()
                    lane.records.popleft()
                n = min(limit, len(lane.records))
                out = [lane.records.popleft() for _ in range(n)]
                seqs = [lane.seqs.popleft() for _ in range(n)]
                lane.taken += n
                if out:
                    if len(request) > 5 and request[5]:  # a reader that takes no periodic epoch
                        self._ack(channel, subtask, lane, seqs[-1])
                    self._cond.notify_all()
                return ("records", out, lane.ended and not lane.records, seqs)
            elif op == "ack":
                self._ack(channel, subtask, lane, request[3])
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
    """Where channel ``channel``'s hub listens (and, encrypted, its certificate); no key:
    a peer proves its attempt's (:func:`relay_key`)."""

    address: tuple
    channel: str
    tls: object = field(default=None, repr=False)

    def connect(self, role: str, lanes: list, creds: credentials.Credentials) -> wire.Connection:
        """A connection of ``role`` bound to ``lanes``, proving ``creds``' attempt."""
        hello = {"relay": self.channel, "role": role, "lanes": list(lanes), "generation": creds.generation}
        return wire.connect(self.address, relay_key(creds.key, self.channel, role), hello, tls=self.tls,
                            codec=wire.CONTROL)

    def ask(self, conn: wire.Connection, *request):
        conn.send((request[0], self.channel) + request[1:])
        answer = conn.recv()
        if answer[0] == "error":
            raise RuntimeError(f"relay {self.channel!r}: {answer[-1]}")
        return answer


class RelaySink(Sink):
    """The producing end of an autonomous channel: hands every batch to the hub at once.

    Not a two-phase-commit sink: nothing waits for an epoch, so a restart of its region
    hands over again what was handed after the epoch it restarts from (duplicates
    downstream, seed 000 §3.2). But the channel is part of the cut: each subtask keeps what
    it handed over until the consumer's completed epoch holds it (the hub's ``acked``), and
    its snapshot holds that tail — what the lane still queues and what the consumer took
    after its last epoch — with the lane's numbers; a restored subtask hands it back
    (``open``), and the consumer, whose snapshot holds the last number it read, takes only
    what comes after. So a savepoint (or a new driver) loses nothing that crossed."""

    local_recovery = True  # each subtask recovers only its own output (failover regions)

    def __init__(self, endpoint: RelayEndpoint):
        self.endpoint = endpoint

    def create_writer(self, ctx) -> SinkWriter:
        return _RelayWriter(self.endpoint, ctx.subtask, credentials.current(f"relay sink of {self.endpoint.channel!r}"))


class _RelayWriter(SinkWriter):
    """One producer subtask's lane: ``seqs``/``kept`` are what it handed over that the
    consumer's completed epochs do not hold yet (each record as the bytes it pickled),
    ``last`` the lane's number of its latest."""

    def __init__(self, endpoint: RelayEndpoint, subtask: int, creds: credentials.Credentials):
        self.endpoint, self.subtask, self.creds = endpoint, subtask, creds
        self.conn: wire.Connection | None = None
        self.seqs: collections.deque = collections.deque()
        self.kept: collections.deque = collections.deque()
        self.last = 0

    def restore(self, state) -> None:
        self.conn = self.endpoint.connect(PRODUCER, [self.subtask], self.creds)
        if state:
            self.last = int(state["last"])
            self.seqs.extend(int(s) for s in state["seqs"])
            pickled = state.get("format") == _PICKLED  # an older snapshot kept the records themselves
            self.kept.extend(state["records"] if pickled else [_pickle(r) for r in state["records"]])
        _, acked = self.endpoint.ask(self.conn, "open", self.subtask, self.last, list(self.seqs), list(self.kept))
        self._forget(acked)

    def _forget(self, acked: int) -> None:
        while self.seqs and self.seqs[0] <= acked:
            self.seqs.popleft()
            self.kept.popleft()

    def write(self, record) -> None:
        self.write_many([record])

    def write_many(self, records: list) -> None:
        if records:
            records = [_pickle(r) for r in records]
            _, first, acked = self.endpoint.ask(self.conn, "put", self.subtask, records)
            self.seqs.extend(range(first, first + len(records)))
            self.kept.extend(records)
            self.last = first + len(records) - 1
            self._forget(acked)

    def write_batch(self, batch) -> None:  # Arrow batches cross as they are
        self.write_many([batch])

    def snapshot(self, epoch: int):
        return {"last": self.last, "seqs": list(self.seqs), "records": list(self.kept), "format": _PICKLED}

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
    ``j``'s records (one split per producer subtask). Its snapshot holds the number of the
    last record it read of each lane: a restore from a savepoint (with the lanes refilled by
    the producers' snapshots) takes only what came after, and each completed epoch tells the
    hub, so the producers forget what it holds. A restart of its own region while the driver
    runs does not take again what it took after its epoch — the hub handed it out already
    (at most once, seed 000 §3.2); it finishes when every producer subtask finished and its
    lane is empty."""

    def __init__(self, endpoint: RelayEndpoint, producers: int, schema=None, ack_on_take: bool = False):
        self.endpoint, self.producers, self._schema = endpoint, producers, schema
        #: the reading region takes no periodic epoch (``epochal.Autonomous``): it acks what it
        #: takes at once, so its producers do not keep (and snapshot) every record they hand over
        self.ack_on_take = ack_on_take

    @property
    def name(self) -> str:
        return f"autonomous channel {self.endpoint.channel!r}"

    @property
    def schema(self):
        return self._schema

    def splits(self) -> list:
        return list(range(self.producers))

    def create_reader(self, splits, state, *, subtask=0, parallelism=1) -> SourceReader:
        creds = credentials.current(f"relay source of {self.endpoint.channel!r}")
        return _RelayReader(self.endpoint, list(splits), state or {}, creds, self.ack_on_take)


class _RelayReader(SourceReader):
    def __init__(self, endpoint: RelayEndpoint, lanes: list, state: dict, creds: credentials.Credentials,
                 ack_on_take: bool = False):
        self.endpoint, self.lanes, self.ack_on_take, self.creds = endpoint, lanes, int(ack_on_take), creds
        self.bound = list(lanes)  # the lanes its connection may take from
        self.read = {lane: int(state.get(str(lane), 0)) for lane in lanes}  # the last number read per lane
        self.conn: wire.Connection | None = None
        self.next = 0

    def _connect(self) -> wire.Connection:
        if self.conn is None:
            self.conn = self.endpoint.connect(CONSUMER, self.bound, self.creds)
        return self.conn

    def poll(self, max_records: int) -> Poll:
        if not self.lanes:
            return Poll([], finished=True)
        lane = self.lanes[self.next % len(self.lanes)]
        _, records, ended, seqs = self.endpoint.ask(self._connect(), "take", lane, max_records, self.read[lane],
                                                   self.ack_on_take)
        if seqs:
            self.read[lane] = seqs[-1]
        if ended and not records:
            self.lanes.remove(lane)
            return Poll([], finished=not self.lanes)
        self.next += 1
        # the producer's pickles, from the hub this reader authenticated (records are user data)
        return Poll([pickle.loads(r) for r in records], idle=not records)

    def snapshot(self) -> dict:
        return {str(lane): seq for lane, seq in self.read.items()}  # finished lanes too: they are read to the end

    def notify_epoch_complete(self, epoch: int, offsets: dict) -> None:
        conn = self._connect()
        for lane, seq in offsets.items():
            if seq:
                self.endpoint.ask(conn, "ack", int(lane), int(seq))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _pickle(record) -> bytes:
    return serde.dumps(record)


def pass_through(element):
    """The function of an autonomous channel's operator: every element as it is."""
    return element
