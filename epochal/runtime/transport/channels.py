"""Data channels between tasks: batches, FIFO per channel, credit-based flow control.

A channel is one authenticated TCP connection from a producer task to a consumer task.
The producer sends ``("B", records)`` batches, ``("E", epoch, ts)`` barriers and a final
``("X",)``; the consumer grants credit with ``("C", n)``. A data batch costs one credit;
the consumer starts the producer with ``credits`` and returns one credit each time its
task thread *consumes* a batch, so at most ``credits`` batches per channel are ever
buffered at the receiver. A consumer that stops reading a channel (alignment, a slow
operator) therefore stops its producer — back-pressure instead of unbounded memory
(seed 004 §3.4.4.3). Barriers and end-of-stream need no credit (they are small and
bounded by the number of epochs), but they stay in FIFO order behind the data.

**Bounded in-flight data** (``ChannelConfig.in_flight``, Flink's buffer debloating):
instead of a fixed ``credits`` per channel, the consumer grants only as many batches as it
consumes in ``in_flight`` seconds at its measured rate (at least 2, at most ``credits``), so
under back-pressure the queues in front of a slow task hold a bounded *time* of data and a
barrier behind them waits at most about that long.

A barrier ``("E", epoch, ts[, unaligned])`` is also announced the moment its reader
receives it (:meth:`InputGate.take_arrivals`), ahead of the data queued before it, for
unaligned checkpoints (:mod:`epochal.alignment.unaligned`); the data queued before it stays
readable (:meth:`InputGate.queued_before`). A producer forwarding an unaligned barrier
sends its buffered data first even without credit (:meth:`OutputChannel.send_now`): the
receiver then holds at most that one flush beyond its credits.
"""
from __future__ import annotations

import collections
import math
import threading
import time

import pyarrow as pa

from epochal.errors import DataError
from epochal.runtime.transport.spill import SpillQueue
from epochal.runtime.transport.wire import Connection, ConnectionClosed, decode, encode, encode_arrow
from epochal.time.watermarks import WATERMARK, WatermarkMark

DATA, BARRIER, END, CREDIT = "B", "E", "X", "C"
#: credit granted on a loop's feedback channels: the Loop Tail must never block, or the
#: cycle of credits could deadlock (epochal.loops)
UNBOUNDED_CREDIT = 1 << 60


def encode_batch(records: list) -> bytes:
    """The frame of one data batch, to send the same batch on several channels (broadcast)
    with one pickle: ``send_batch(records, should_stop, frame=encode_batch(records))``.
    A batch of Arrow record batches of one schema travels as Arrow IPC instead of a pickle."""
    if records and type(records[0]) is pa.RecordBatch:
        schema = records[0].schema
        if all(type(b) is pa.RecordBatch and b.schema.equals(schema) for b in records):
            return encode_arrow(records)
    return encode((DATA, records))


class ChannelFailure(Exception):
    """A peer disappeared without a clean end of stream (it crashed or was cancelled)."""


def edge_name(cid: str) -> str:
    """``"operator 'a' → 'b' (subtask 0 → 1)"`` for a channel id ``a>b.<input>:0>1``
    (:func:`epochal.plan.compile_plan` makes them)."""
    try:
        ops, subtasks = cid.rsplit(":", 1)
        producer, consumer = ops.split(">", 1)
        up, down = subtasks.split(">")
        return f"operator {producer!r} → {consumer.rsplit('.', 1)[0]!r} (subtask {up} → {down})"
    except ValueError:
        return f"channel {cid!r}"


def producer_of(cid: str) -> str:
    """The operator that sends on channel ``cid``."""
    return cid.split(">", 1)[0]


class InputGate:
    """The receiving side of all input channels of one task.

    Reader threads append messages to per-channel queues and notify ``cv``; the task
    thread takes them with :meth:`poll`, skipping blocked channels. The queues of the
    ``unbounded`` channels (a loop head's feedback) hold ``unbounded_memory_bytes`` of
    frames in memory and the rest in a local file (:class:`~epochal.runtime.transport.spill.SpillQueue`).

    A frame a reader cannot decode (a record that pickles but does not unpickle, e.g. an
    exception class whose ``__init__`` takes other arguments than its ``args``) ends its
    channel with a ``("!", text, DataError)`` naming the producing operator, the edge and
    the error: the task fails at once instead of waiting for a message that never comes.
    """

    def __init__(self, channel_ids: tuple[str, ...], credits: int, cv: threading.Condition,
                 unbounded: frozenset[int] = frozenset(), announce_barriers: bool = False,
                 in_flight: float | None = None, unbounded_memory_bytes: int = 64 << 20):
        self.channel_ids = channel_ids
        self.index = {cid: i for i, cid in enumerate(channel_ids)}
        self.credits = credits
        self.credits_of = [UNBOUNDED_CREDIT if i in unbounded else credits for i in range(len(channel_ids))]
        n = len(channel_ids)
        self._in_flight = in_flight  # seconds of consumption to grant (None: credits_of)
        self._bounded = [in_flight is not None and i not in unbounded for i in range(n)]
        # the first grant: all credits, or with in_flight the minimum until a rate is measured
        self._first = [min(2, c) if bounded else c for c, bounded in zip(self.credits_of, self._bounded)]
        self._unconsumed = list(self._first)  # granted but not yet consumed, per channel
        self._rate = [0.0] * n  # consumed batches per second (EWMA), for in_flight
        self._window = [(time.monotonic(), 0)] * n  # (start, batches) of the current rate window
        self.cv = cv
        self.queues = [SpillQueue(unbounded_memory_bytes, decode) if i in unbounded else collections.deque()
                       for i in range(n)]
        self.conns: list[Connection | None] = [None] * len(channel_ids)
        self.ended = [False] * len(channel_ids)
        self._data_buffered = [0] * len(channel_ids)  # data batches queued (bounded by credits)
        self._next = 0
        self.buffered_batches_max = 0
        self._arrivals: collections.deque = collections.deque()  # (channel, barrier message)
        self._announce = announce_barriers

    @property
    def all_connected(self) -> bool:
        return all(c is not None for c in self.conns)

    def attach(self, conn: Connection) -> None:
        """Called by the data server for each authenticated producer connection."""
        cid = conn.peer_hello.get("channel")
        if cid not in self.index:
            conn.close()
            return
        i = self.index[cid]
        with self.cv:
            if self.conns[i] is not None:  # a duplicate (zombie) producer: keep the first
                conn.close()
                return
            self.conns[i] = conn
            self.cv.notify_all()
        conn.send((CREDIT, self._first[i]))
        threading.Thread(target=self._read, args=(i, conn), name=f"epochal-in-{cid}", daemon=True).start()

    def _read(self, i: int, conn: Connection) -> None:
        q = self.queues[i]
        spill = q if isinstance(q, SpillQueue) else None
        try:
            while True:
                frame = conn.recv_bytes()
                try:
                    msg = decode(frame)
                except Exception as exc:
                    self._undecodable(i, frame, exc)
                    return
                with self.cv:
                    if spill is not None:
                        spill.put(msg, frame)
                    else:
                        q.append(msg)
                    if msg[0] == DATA:
                        self._data_buffered[i] += 1
                        if self._data_buffered[i] > self.buffered_batches_max:
                            self.buffered_batches_max = self._data_buffered[i]
                    elif msg[0] == BARRIER and self._announce:
                        self._arrivals.append((i, msg))
                    self.cv.notify_all()
                if msg[0] == END:
                    return
        except (ConnectionClosed, EOFError, OSError) as exc:
            with self.cv:
                q.append(("!", f"input channel {self.channel_ids[i]} broke: {exc}", exc))
                self.cv.notify_all()
        except Exception as exc:  # never die silently: the task would wait for this channel for ever
            with self.cv:
                q.append(("!", f"input channel {self.channel_ids[i]}: its reader failed: "
                               f"{type(exc).__name__}: {exc}", exc))
                self.cv.notify_all()

    def _undecodable(self, i: int, frame: bytes, exc: Exception) -> None:
        """End channel ``i`` with a DataError naming the producing operator and the edge."""
        cid = self.channel_ids[i]
        error = DataError(
            f"a record from operator {producer_of(cid)!r} cannot be decoded on the edge {edge_name(cid)}: "
            f"{type(exc).__name__}: {exc} (a frame of {len(frame)} bytes) — the record pickles but does not unpickle "
            "(e.g. an exception class whose __init__ takes other arguments than its args, or a class missing on "
            "this host): give its class a __reduce__, or send plain data out of that operator")
        with self.cv:
            self.queues[i].append(("!", str(error), error))
            self.cv.notify_all()

    @property
    def spilled_frames(self) -> int:
        """Frames that waited on disk (the loop feedback channels' :class:`SpillQueue`)."""
        return sum(q.spilled for q in self.queues if isinstance(q, SpillQueue))

    def poll(self, blocked) -> tuple[int, tuple] | None:
        """Next message from a non-blocked channel, round-robin; ``None`` if none is ready.

        Call with ``cv`` held or not; queue appends/pops are atomic.
        """
        n = len(self.queues)
        for k in range(n):
            i = (self._next + k) % n
            if self.queues[i] and i not in blocked:
                self._next = (i + 1) % n
                msg = self.queues[i].popleft()
                if msg[0] == DATA:
                    with self.cv:
                        self._data_buffered[i] -= 1
                    self._grant(i)
                return i, msg
        return None

    def unread(self, i: int, msg: tuple) -> None:
        """Put DATA ``msg`` (the unprocessed rest of the batch :meth:`poll` just returned for
        channel ``i``) back at the head of the channel's queue, as if never taken: it
        stays queued before any barrier behind it (so an unaligned switch makes it channel
        state) and counts as unconsumed again (its credit was already granted; the next
        poll of it consumes it once more without granting twice)."""
        with self.cv:
            self.queues[i].appendleft(msg)
            self._data_buffered[i] += 1
            self._unconsumed[i] += 1

    def target_credits(self, i: int) -> int:
        """Batches channel ``i`` may have granted and unconsumed: ``credits``, or with
        ``in_flight`` the batches consumed in that many seconds (2 ≤ it ≤ ``credits``)."""
        if not self._bounded[i]:
            return self.credits_of[i]
        return max(2, min(self.credits_of[i], math.ceil(self._rate[i] * self._in_flight)))

    def _grant(self, i: int) -> None:
        """One batch of channel ``i`` was consumed: top its credit back up to the target,
        in steps of at least half the target (fewer credit messages)."""
        self._unconsumed[i] -= 1
        if self._bounded[i]:
            now = time.monotonic()
            start, count = self._window[i]
            count += 1
            if now - start >= 0.1:
                rate = count / (now - start)
                self._rate[i] = rate if self._rate[i] == 0.0 else 0.5 * self._rate[i] + 0.5 * rate
                self._window[i] = (now, 0)
            else:
                self._window[i] = (start, count)
        target = self.target_credits(i)
        give = target - self._unconsumed[i]
        if give > 0 and give * 2 >= target:
            try:
                self.conns[i].send((CREDIT, give))
            except OSError as exc:
                raise ChannelFailure(f"input channel {self.channel_ids[i]} broke: {exc}") from exc
            self._unconsumed[i] += give

    @property
    def has_arrivals(self) -> bool:
        return bool(self._arrivals)

    def take_arrivals(self) -> list[tuple[int, tuple]]:
        """``(channel, barrier message)`` of every barrier received since the last call, in
        arrival order (FIFO per channel), whether or not the task reached it in its queue."""
        if not self._arrivals:
            return []
        with self.cv:
            out = list(self._arrivals)
            self._arrivals.clear()
        return out

    def queued_before(self, channel: int, epoch: int) -> list:
        """The records queued on ``channel`` before its barrier ``epoch`` (flattened, in
        order, watermarks among them as :class:`~epochal.time.watermarks.WatermarkMark`);
        ``[]`` when that barrier is no longer queued (the task reached it)."""
        records: list = []
        with self.cv:
            for msg in self.queues[channel]:
                if msg[0] == BARRIER and msg[1] == epoch:
                    return records
                if msg[0] == DATA:
                    records.extend(msg[1])
                elif msg[0] == WATERMARK:
                    records.append(WatermarkMark(msg[1], msg[2]))
        return []

    def close(self) -> None:
        for c in self.conns:
            if c is not None:
                c.close()
        for q in self.queues:
            if isinstance(q, SpillQueue):
                q.close()


class OutputChannel:
    """The sending side of one channel; used only by the task thread (plus its credit reader)."""

    def __init__(self, cid: str, conn: Connection, cv: threading.Condition):
        self.cid = cid
        self.conn = conn
        self.cv = cv
        self.credits = 0
        self.broken: str | None = None
        self.broken_cause: BaseException | None = None  # what broke it (a wire.PeerLost names the host)
        self.blocked_seconds = 0.0
        threading.Thread(target=self._read_credits, name=f"epochal-out-{cid}", daemon=True).start()

    def _read_credits(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg[0] == CREDIT:
                    with self.cv:
                        self.credits += msg[1]
                        self.cv.notify_all()
        except (ConnectionClosed, EOFError, OSError) as exc:
            with self.cv:
                self.broken = f"output channel {self.cid} broke: {exc}"
                self.broken_cause = exc
                self.cv.notify_all()

    def send_batch(self, records: list, should_stop, frame: bytes | None = None) -> None:
        """Send one batch, blocking while the consumer has granted no credit.

        ``should_stop()`` is checked while waiting: it raises to cancel, or returns True to
        send now without credit (urgent work waits behind this batch); raises ChannelFailure
        if the consumer went away. ``frame``, if given, must be ``encode_batch(records)``:
        it is sent instead of pickling ``records`` again.
        """
        with self.cv:
            if self.credits <= 0:
                t0 = time.monotonic()
                while self.credits <= 0:
                    if self.broken:
                        raise ChannelFailure(self.broken) from self.broken_cause
                    if should_stop():
                        break
                    self.cv.wait(0.1)
                self.blocked_seconds += time.monotonic() - t0
            self.credits -= 1
        self._send_frame(encode_batch(records) if frame is None else frame)

    def send_now(self, records: list, frame: bytes | None = None) -> None:
        """Send one batch at once, taking a credit even when none is left: for the flush
        that must precede an unaligned barrier (the credit count goes negative and the
        receiver's grants make up for it). ``frame`` as for :meth:`send_batch`."""
        if self.broken:
            raise ChannelFailure(self.broken) from self.broken_cause
        with self.cv:
            self.credits -= 1
        self._send_frame(encode_batch(records) if frame is None else frame)

    def _send(self, message: tuple) -> None:
        self._send_frame(encode(message))

    def _send_frame(self, frame: bytes) -> None:
        try:
            self.conn.send_bytes(frame)
        except OSError as exc:
            raise ChannelFailure(f"output channel {self.cid} broke: {exc}") from exc

    def send_event(self, message: tuple) -> None:
        if self.broken and message[0] != END:
            raise ChannelFailure(self.broken) from self.broken_cause
        self._send(message)

    def close(self) -> None:
        self.conn.close()
