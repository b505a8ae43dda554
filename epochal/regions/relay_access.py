"""Who may do what at the relay hub (:mod:`epochal.regions.relay`, issue 51): the key a
connection proves and the requests it may make.

A relay connection is of one role (``"producer"`` or ``"consumer"``) of one autonomous
channel, bound to the lanes its authenticated hello names; it proves :func:`relay_key` —
derived from its region's current attempt key, so it changes with every attempt. Each
request is checked (:func:`refusal`) before the hub reads a field of it: well formed (every
field's type), for the connection's channel and role, for one of its lanes. Pure functions.
"""
from __future__ import annotations

from epochal.runtime.transport import credentials

PRODUCER, CONSUMER = "producer", "consumer"
OPS = {"open": PRODUCER, "put": PRODUCER, "end": PRODUCER, "take": CONSUMER, "ack": CONSUMER}


def relay_key(attempt_key: bytes, channel: str, role: str) -> bytes:
    """The key a ``role`` connection of ``channel`` proves: derived from its region's attempt
    key, so it changes with every attempt (generation) of the region."""
    return credentials.purpose_key(attempt_key, f"relay:{channel}:{role}")


def _ints(value) -> bool:
    return type(value) is list and all(type(v) is int for v in value)


def _blobs(value) -> bool:
    return type(value) is list and all(type(v) is bytes for v in value)


#: each request's fields after (op, channel, lane): a check per field
_FIELDS = {"open": (lambda v: type(v) is int, _ints, _blobs), "put": (_blobs,), "end": (),
           "take": (lambda v: type(v) is int, lambda v: type(v) is int, lambda v: type(v) in (int, bool)),  # ack: optional
           "ack": (lambda v: type(v) is int,)}


def refusal(request, hello: dict) -> str:
    """Why ``request`` is refused on a connection whose authenticated hello is ``hello``
    (``""``: it is not): it must be well formed, for the hello's channel and role and one of its lanes."""
    if type(request) is not tuple or len(request) < 3 or request[0] not in OPS:
        return f"not a relay request: {request!r:.100}"
    op, channel, lane = request[:3]
    fields = _FIELDS[op]
    if not (len(fields) - (op == "take") <= len(request) - 3 <= len(fields)) or type(lane) is not int \
            or not all(check(v) for check, v in zip(fields, request[3:])):
        return f"malformed {op!r} request"
    if op == "open" and len(request[4]) != len(request[5]):
        return "an 'open' request's numbers and records differ in length"
    if channel != hello.get("relay") or OPS[op] != hello.get("role"):
        return (f"this connection is the {hello.get('role')} of channel {hello.get('relay')!r}: "
                f"{op!r} on channel {channel!r} refused")
    if lane not in hello.get("lanes", ()):
        return f"lane {lane} of channel {channel!r} is not bound to this connection (lanes {hello.get('lanes')})"
    return ""
