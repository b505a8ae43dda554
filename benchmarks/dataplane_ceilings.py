"""Raw loopback ceilings for ``dataplane.py``: two processes, one TCP socket, no engine.

Run as ``python dataplane_ceilings.py recv --kind K ...`` (prints ``PORT <n>``, accepts one
connection, reads to end of stream, prints one JSON line) and ``... send --kind K --port n``
(streams for ``--seconds``, then closes). ``generate`` runs alone: the record generator
without any transport. Standard library and pyarrow only; nothing imports epochal.

Kinds (the records are those of :func:`records`: ``(id, blob)``, an int and one of a pool of
distinct bytes objects of ``--payload`` bytes (:func:`pool_size`), cut into batches like epochal's
GeneratorSource does — ``list(islice(it, batch_size))``):

* ``pickle``   — ``pickle.dumps(("B", batch), protocol=5)`` behind a 4-byte big-endian
  length, one ``sendall`` per frame below 64 KiB (epochal's ``wire.Connection.send``
  framing and message shape); the receiver reads through a 1 MiB buffered file and
  ``pickle.loads`` every frame — the records arrive as Python tuples.
* ``arrow-py`` — the same Python batches converted to a RecordBatch (``int64``, ``binary``),
  written with ``RecordBatchStreamWriter``; the receiver converts every batch back to a
  list of tuples (``zip(col0.to_pylist(), col1.to_pylist())``).
* ``arrow``    — ONE pre-built RecordBatch of ``batch_size`` rows written again and again;
  the receiver reads batches and counts ``num_rows``: Arrow IPC without any Python object
  (the physical ceiling of columnar transport).
* ``bytes``    — 1 MiB ``sendall`` / ``recv_into`` loops: socket memcpy speed. Records/s is
  bytes/s divided by the payload bytes of one record.

Both ends stamp ``(records so far, perf_counter, process_time)`` at most every 10 ms and
print them; the caller computes the steady rate (receiver) and CPU per record (each end)
from the stamps. Receivers check the ids at batch boundaries
(first and last id of every batch must continue the sequence) where ids are meaningful.
"""
from __future__ import annotations

import argparse
import itertools
import json
import pickle
import socket
import struct
import sys
import time

KINDS = ("pickle", "arrow-py", "arrow", "bytes")
DESCRIPTIONS = {  # for the benchmark's JSON; the module docstring says the same
    "pickle": "length-framed pickle.dumps(('B', batch), protocol=5) — epochal's wire format and message "
              "shape; receiver: 1 MiB buffered reads + pickle.loads per frame (Python tuples arrive)",
    "arrow-py": "the same Python batches → RecordBatch(int64, binary) → RecordBatchStreamWriter; receiver: "
                "RecordBatchStreamReader + back to a list of Python tuples per batch",
    "arrow": "one pre-built RecordBatch of batch_size rows written repeatedly; receiver counts num_rows "
             "(columnar transport, no Python objects)",
    "bytes": "1 MiB sendall / recv_into loops (socket memcpy speed); records/s = bytes/s / record bytes",
    "generate": "the record generator alone (list(islice(records, batch_size)) in a loop), one process",
}
_LEN = struct.Struct("!I")
STAMP_PERIOD = 0.01
POOL_BYTES = 8 << 20  # about this much memory of distinct blobs per generator
CHUNK = 1 << 20


def pool_size(payload: int, batch_size: int) -> int:
    """Distinct blobs per generator: a power of two, at least 2 × ``batch_size`` (no blob
    repeats within a batch) and otherwise about POOL_BYTES of blobs, at most 65 536."""
    size = 1
    while size < 2 * batch_size or (size < 65536 and (2 * size) * (payload + 49) <= POOL_BYTES):
        size *= 2
    return size


def records(split: int, offset: int, payload: int = 100, distinct: int = 4096):
    """``(id, blob)`` from ``offset`` on. ``blob`` is ``payload`` bytes ending in a counter,
    taken round-robin from a pool of ``distinct`` (a power of two) different bytes objects:
    cheap to produce, and no object repeats within a batch of up to ``distinct`` records
    (a repeated object would let pickle's memo send it once per batch)."""
    pad = bytes(max(0, payload - 8))
    pool = [pad + k.to_bytes(8, "little") for k in range(distinct)]
    mask = distinct - 1
    i = offset
    while True:
        yield (i, pool[i & mask])
        i += 1


def record_bytes(payload: int) -> int:
    """Payload bytes of one record: the 8-byte id plus the blob."""
    return 8 + payload


class _Stamps:
    """``(records so far, perf_counter, process CPU seconds)`` at most every STAMP_PERIOD."""

    def __init__(self):
        self.stamps: list[tuple[int, float, float]] = []
        self._next = 0.0

    def __call__(self, count: int) -> None:
        now = time.perf_counter()
        if now >= self._next:
            self.stamps.append((count, now, time.process_time()))
            self._next = now + STAMP_PERIOD

    def close(self, count: int) -> list:
        self.stamps.append((count, time.perf_counter(), time.process_time()))
        return self.stamps


# ---------------------------------------------------------------------- senders
def _batches(args):
    it = records(0, 0, args.payload, pool_size(args.payload, args.batch_size))
    size = args.batch_size
    while True:
        yield list(itertools.islice(it, size))


def send(args) -> dict:
    sock = socket.create_connection(("127.0.0.1", args.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    deadline = time.perf_counter() + args.seconds
    sent = 0
    stamp = _Stamps()
    if args.kind == "pickle":
        for batch in _batches(args):
            data = pickle.dumps(("B", batch), protocol=5)
            if len(data) < 65536:
                sock.sendall(_LEN.pack(len(data)) + data)
            else:
                sock.sendall(_LEN.pack(len(data)))
                sock.sendall(data)
            sent += len(batch)
            stamp(sent)
            if time.perf_counter() >= deadline:
                break
    elif args.kind in ("arrow", "arrow-py"):
        import pyarrow as pa

        schema = pa.schema([("id", pa.int64()), ("blob", pa.binary())])
        sink = sock.makefile("wb", buffering=CHUNK)
        with pa.ipc.new_stream(sink, schema) as writer:
            if args.kind == "arrow":
                batch = _to_arrow(next(_batches(args)), schema)
                while time.perf_counter() < deadline:
                    writer.write_batch(batch)
                    sent += batch.num_rows
                    stamp(sent)
            else:
                for batch in _batches(args):
                    writer.write_batch(_to_arrow(batch, schema))
                    sent += len(batch)
                    stamp(sent)
                    if time.perf_counter() >= deadline:
                        break
        sink.close()
    elif args.kind == "bytes":
        buf = bytes(CHUNK)
        while time.perf_counter() < deadline:
            sock.sendall(buf)
            sent += CHUNK
            stamp(sent)
    sock.shutdown(socket.SHUT_WR)
    sock.close()
    return {"sent": sent, "stamps": stamp.close(sent)}


def _to_arrow(batch: list, schema):
    import pyarrow as pa

    ids, blobs = zip(*batch)
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array(blobs, pa.binary())], schema=schema)


# ---------------------------------------------------------------------- receivers
def recv(args) -> dict:
    server = socket.create_server(("127.0.0.1", 0))
    print(f"PORT {server.getsockname()[1]}", flush=True)
    sock, _ = server.accept()
    server.close()
    stamp = _Stamps()
    count, bad = 0, 0
    if args.kind == "pickle":
        f = sock.makefile("rb", buffering=CHUNK)
        while True:
            head = f.read(4)
            if len(head) < 4:
                break
            (n,) = _LEN.unpack(head)
            _, batch = pickle.loads(f.read(n))
            bad += batch[0][0] != count or batch[-1][0] != count + len(batch) - 1
            count += len(batch)
            stamp(count)
    elif args.kind in ("arrow", "arrow-py"):
        import pyarrow as pa

        source = sock.makefile("rb", buffering=CHUNK)
        reader = pa.ipc.open_stream(source)
        for batch in reader:
            if args.kind == "arrow-py":
                rows = list(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()))
                bad += rows[0][0] != count or rows[-1][0] != count + len(rows) - 1
            count += batch.num_rows
            stamp(count)
    elif args.kind == "bytes":
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            k = sock.recv_into(view)
            if k == 0:
                break
            count += k
            stamp(count)
    sock.close()
    return {"received": count, "bad_batches": bad, "stamps": stamp.close(count)}


def generate(args) -> dict:
    """The record generator alone, in batches, for ``--seconds``: the source's own cost."""
    stamp = _Stamps()
    count = 0
    deadline = time.perf_counter() + args.seconds
    for batch in _batches(args):
        count += len(batch)
        stamp(count)
        if stamp.stamps[-1][1] >= deadline:
            break
    return {"received": count, "bad_batches": 0, "stamps": stamp.close(count)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=("send", "recv", "generate"))
    p.add_argument("--kind", choices=KINDS, default="pickle")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--payload", type=int, default=100)
    args = p.parse_args(argv)
    result = {"send": send, "recv": recv, "generate": generate}[args.role](args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
