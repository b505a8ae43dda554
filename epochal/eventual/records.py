"""The records of a CEC operator's output queue and their framing on bytes (seed 003 §II.B,
"Constructing an EC").

Three kinds of record share the queue, in timestamp order (seed 003: "Window checkpoint
tuples are logged at the operator's output queue along with regular output tuples in
timestamp order"):

* :class:`Result` — ``R``, the data-carrying tuple a window emits when it closes;
* :class:`Footprint` of kind ``Gopen`` — the window's state *after* the tuple that opened it;
* :class:`Footprint` of kind ``Gcheck`` — the window's partial state up to time ``t``.

Every record carries ``t`` (the :class:`Position` of the last input tuple the operator had
processed, the seed's ``tnow``) and ``n``, the number of open windows *after* that tuple
(the seed's count field). Footprints also carry ``opened`` (τ1 of §III) so a restored window
knows when it opened.

**Time is a position, not a bare timestamp.** Several input tuples may share a timestamp, and
then "the state up to time t" is ambiguous. So ``t`` is ``Position(ts, seq)``: ``seq`` is the
tuple's sequence number in the input as the source replays it (e.g. its offset), and positions
are totally ordered. A footprint at ``t`` includes the tuple *at* ``t`` and every tuple before
it, and none after (:mod:`epochal.eventual.recovery` filters by exactly that rule).

**Frames.** The operator appends the records one input tuple (or one background pass)
produced as one *frame* — written whole or, after a crash mid-write, torn. A frame is::

    b"EC" | version (1) | flags (1) | payload length (4, big-endian) | key id (8) | fingerprint (16) | payload

The fingerprint covers the 16 header bytes before it and the payload: a truncated BLAKE2b-128,
or — when the job has a signing key (``CheckpointConfig.signing_key``) — a truncated
HMAC-SHA256 under that key (flag bit 0; the key id, the first 8 bytes of the key's SHA-256,
tells "signed with another key" from a torn or changed frame). The payload is a pickle (:mod:`epochal.serde`) of the
frame's records as plain tuples. The log lives in the job's checkpoint storage; a pickle from it
is unpickled only after its fingerprint matched, so with a key nobody who can merely write the
storage can plant a frame the operator unpickles. Without a key the storage is trusted, as for
checkpoints. (A key does not stop whoever can write the storage from *deleting* segments; that
is not what signing protects against, here or in :mod:`epochal.backends.signing`.)

Making a frame atomic is what lets recovery treat each frame as one step of the operator: a
tuple that closed two windows and opened a third never survives half-logged (seed 003: "It is
important to ensure that the entire checkpoint record ... is atomically written ... We ensure
this by using a fingerprint to detect partial I/O errors and in that case discard the record").

    >>> frame = encode_frame([Result(("a", 0), (3, 2), Position(9, 4), 1)])
    >>> records, end, why = decode_frame(frame, 0)
    >>> records[0].value, end == len(frame), why
    ((3, 2), True, '')
    >>> decode_frame(frame[:-1], 0)[2]
    'torn'
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Any, Hashable, NamedTuple, Sequence, Union

from epochal import serde
from epochal.backends.signing import key_bytes

__all__ = ["Footprint", "Kind", "Position", "Record", "Result", "decode_frame", "encode_frame",
           "HEADER_BYTES"]

MAGIC = b"EC"
VERSION = 1
FLAG_KEYED = 1
_HEAD = struct.Struct(">2sBBI8s")  # magic, version, flags, payload length, key id
FINGERPRINT_BYTES = 16
HEADER_BYTES = _HEAD.size + FINGERPRINT_BYTES
#: a frame longer than this is refused when written and read as corruption (not a torn tail)
MAX_PAYLOAD = 1 << 30


class Position(NamedTuple):
    """Where an input tuple is in the input: its timestamp ``ts`` and its sequence number
    ``seq`` among the input's tuples (ties of ``ts`` are ordered by ``seq``). Positions compare
    as tuples: ``Position(5, 7) < Position(5, 8) < Position(6, 0)``."""

    ts: int
    seq: int


class Kind(enum.Enum):
    """The seed's tuple type attribute."""

    RESULT = "R"
    OPEN = "Gopen"
    CHECK = "Gcheck"


@dataclass(frozen=True, slots=True)
class Result:
    """``R``: window ``window`` closed with result ``value`` while processing the tuple at ``t``;
    ``n`` windows were open after that tuple."""

    window: Hashable
    value: Any
    t: Position
    n: int

    kind = Kind.RESULT


@dataclass(frozen=True, slots=True)
class Footprint:
    """``Gopen`` / ``Gcheck``: window ``window`` had state ``state`` once the tuple at ``t``
    (and every tuple before it, and none after) was taken into account; it opened with the
    tuple at ``opened`` (τ1); ``n`` windows were open at ``t``."""

    kind: Kind
    window: Hashable
    state: Any
    t: Position
    n: int
    opened: Position


Record = Union[Result, Footprint]


def _as_tuple(record: Record) -> tuple:
    if isinstance(record, Result):
        return ("R", record.window, record.value, tuple(record.t), record.n)
    return (record.kind.value, record.window, record.state, tuple(record.t), record.n, tuple(record.opened))


def _from_tuple(item: tuple) -> Record:
    if item[0] == "R":
        return Result(item[1], item[2], Position(*item[3]), item[4])
    return Footprint(Kind(item[0]), item[1], item[2], Position(*item[3]), item[4], Position(*item[5]))


def _key_id(key: bytes | None) -> bytes:
    return hashlib.sha256(key).digest()[:8] if key is not None else bytes(8)


def _fingerprint(head: bytes, payload: bytes, key: bytes | None) -> bytes:
    if key is not None:
        mac = hmac.new(key, head, hashlib.sha256)
        mac.update(payload)
        return mac.digest()[:FINGERPRINT_BYTES]
    digest = hashlib.blake2b(head, digest_size=FINGERPRINT_BYTES)
    digest.update(payload)
    return digest.digest()


def encode_frame(records: Sequence[Record], key: bytes | str | None = None) -> bytes:
    """One frame holding ``records`` (pickled now: later changes to a mutable state do not
    reach the frame). ``key``: the job's signing key, or ``None``.

    Raises:
        ValueError: no records, the key is too short, or the frame is over 1 GiB.
    """
    if not records:
        raise ValueError("encode_frame: a frame holds at least one record")
    key = None if key is None else key_bytes(key)
    payload = serde.dumps([_as_tuple(r) for r in records])
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"encode_frame: {len(payload)} bytes of records in one frame (at most {MAX_PAYLOAD})")
    head = _HEAD.pack(MAGIC, VERSION, FLAG_KEYED if key is not None else 0, len(payload), _key_id(key))
    return head + _fingerprint(head, payload, key) + payload


def decode_frame(buf: bytes | memoryview, offset: int, key: bytes | str | None = None
                 ) -> tuple[list[Record], int, str]:
    """Decode the frame starting at ``buf[offset]``: ``(records, end offset, why)``.

    ``why`` is ``""`` for a good frame; otherwise ``records`` is empty and ``why`` says what the
    bytes are:

    * ``"torn"`` — a partial write: the frame runs past the end of ``buf``, or it is the last
      thing in ``buf`` and its fingerprint does not match, or the rest of ``buf`` is zeros
      (a file extended but not written); discard it and everything after it;
    * anything else (a message) — a complete frame with a wrong fingerprint followed by more
      data, a wrong magic or version, a frame signed with another key (or signed when the
      log is read without one, or the reverse): corruption, tampering or a misconfigured
      key, never to be skipped.

    Pure; never unpickles a frame whose fingerprint did not match.
    """
    key = None if key is None else key_bytes(key)
    view = memoryview(buf)
    rest = len(view) - offset
    if rest < HEADER_BYTES:
        return [], len(view), "torn"
    magic, version, flags, length, key_id = _HEAD.unpack_from(view, offset)
    if magic != MAGIC or version != VERSION or length > MAX_PAYLOAD:
        if not any(view[offset:]):
            return [], len(view), "torn"
        return [], offset, f"no frame at byte {offset} (magic {bytes(magic)!r}, version {version})"
    end = offset + HEADER_BYTES + length
    if end > len(view):
        return [], len(view), "torn"
    if bool(flags & FLAG_KEYED) != (key is not None):
        return [], offset, (f"the frame at byte {offset} is {'signed' if flags & FLAG_KEYED else 'not signed'} "
                            f"but the log is read {'with' if key is not None else 'without'} a signing key")
    if key_id != _key_id(key):
        return [], offset, f"the frame at byte {offset} is signed with another key"
    head = bytes(view[offset:offset + _HEAD.size])
    payload = bytes(view[offset + HEADER_BYTES:end])
    expected = _fingerprint(head, payload, key)
    if not hmac.compare_digest(expected, bytes(view[offset + _HEAD.size:offset + HEADER_BYTES])):
        if end == len(view) or not any(view[offset + HEADER_BYTES:]):
            return [], len(view), "torn"
        return [], offset, f"the frame at byte {offset} does not match its fingerprint and more data follows it"
    return [_from_tuple(item) for item in serde.loads(payload)], end, ""
