"""Messages, routing and the epoch choice of queryable state (seed 004 §4.3.1).

Connections use the wire handshake of :mod:`epochal.runtime.transport.wire` with a key
derived from the job's query token (:func:`query_key`). After it, every frame both ways is
data-only tagged JSON (:data:`CODEC`, :mod:`epochal.runtime.transport.tagged_json`: JSON
plus tags for tuples, dicts with any keys, bytes, sets, and ``Window`` / ``WindowResult``); no query endpoint ever unpickles what a client
sent, so the token lets its holder read state and nothing more. Messages (request → one
response):

* to the driver's query directory: ``("routes",)`` → ``("routes", routes | None)``, routes
  being ``{"generation", "max_parallelism", "operators": {op: [(task, lo, hi, (host, port))]},
  "expected": {op: n_tasks}}`` (key groups ``lo <= kg < hi`` live in ``task``);
* to a task's query server: ``("get", rid, operator, state, [(kg, key)], isolation, epoch,
  values)`` → ``("ok", rid, epoch | None, held, payload)``, ``("unavailable", rid, reason,
  held)`` (no such committed epoch: retry), ``("moved", rid, reason)`` (the key group lives
  elsewhere now: refetch routes) or ``("error", rid, message)`` (a mistake of the caller:
  raised). ``values`` is :data:`VALUES_DATA` (the default, also when omitted): ``payload`` is
  the list of values, refused with an error naming the type when one has no data encoding;
  or :data:`VALUES_PICKLED`, the client's opt-in for its own job: ``payload`` is the pickled
  list (bytes), which the client unpickles — only a client that trusts the endpoint.
"""
from __future__ import annotations

import hashlib

from epochal.errors import EpochalError
from epochal.runtime.transport.tagged_json import Codec
from epochal.windows.functions import Window, WindowResult

READ_COMMITTED = "read-committed"
READ_UNCOMMITTED = "read-uncommitted"
ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)
#: the encoding of every query frame: tagged JSON, plus the windows of window state by name
CODEC = Codec(named=(Window, WindowResult))
VALUES_DATA = "data"
VALUES_PICKLED = "pickle"


class QueryError(EpochalError):
    """A query that cannot be answered: unknown operator or state, a state not declared
    queryable, a bad isolation level, or no answer within the timeout."""


class JobEnded(QueryError):
    """The job ended (finished, failed or cancelled): nothing serves its state any more."""


def query_key(token: str) -> bytes:
    """The wire key of every query connection of the job whose query token is ``token``."""
    if not isinstance(token, str) or not token:
        raise QueryError(f"query token must be a non-empty string, got {token!r}")
    return hashlib.sha256(b"epochal-query:" + token.encode()).digest()


def check_isolation(isolation: str) -> str:
    if isolation not in ISOLATION_LEVELS:
        raise QueryError(f"isolation: expected one of {ISOLATION_LEVELS}, got {isolation!r}")
    return isolation


def parse_get(request) -> tuple:
    """``(rid, operator, state, items, isolation, epoch, values)`` of a decoded ``("get", ...)``
    request, every field's type checked. Raises ``ValueError`` / :class:`QueryError` naming it."""
    if type(request) is not tuple or len(request) not in (7, 8) or request[0] != "get":
        raise ValueError("expected ('get', rid, operator, state, [(kg, key)], isolation, epoch[, values])")
    _, rid, operator, state, items, isolation, epoch = request[:7]
    values = request[7] if len(request) == 8 else VALUES_DATA
    if type(rid) is not int or type(operator) is not str or type(state) is not str:
        raise ValueError("rid must be an int, operator and state strings")
    if type(items) is not list or not all(type(i) is tuple and len(i) == 2 and type(i[0]) is int for i in items):
        raise ValueError("items must be a list of (key group, key) pairs")
    if epoch is not None and type(epoch) is not int:
        raise ValueError("epoch must be an int or None")
    if values not in (VALUES_DATA, VALUES_PICKLED):
        raise ValueError(f"values must be {VALUES_DATA!r} or {VALUES_PICKLED!r}")
    return rid, operator, state, items, check_isolation(isolation), epoch, values


def route(routes: dict, operator: str, kgs: list[int]) -> dict[str, tuple[tuple, list[int]]]:
    """``{task: ((host, port), [positions])}``: which task answers each key group of ``kgs``.

    Raises:
        LookupError: ``operator`` has no complete route (not every task registered yet).
    """
    entries = routes["operators"].get(operator)
    if not entries or len(entries) < routes["expected"].get(operator, 0):
        raise LookupError(f"operator {operator!r} has no queryable state registered by all its tasks")
    out: dict[str, tuple[tuple, list[int]]] = {}
    for pos, kg in enumerate(kgs):
        for task, lo, hi, address in entries:
            if lo <= kg < hi:
                out.setdefault(task, (tuple(address), []))[1].append(pos)
                break
        else:
            raise LookupError(f"no task of operator {operator!r} owns key group {kg}")
    return out


def common_epoch(held: list[list[int]]) -> int | None:
    """The newest epoch every answering task holds (``None``: they share none). A multi-key
    read-committed answer is read at this epoch on every task: one consistent cut."""
    common = set(held[0]) if held else set()
    for h in held[1:]:
        common &= set(h)
    return max(common) if common else None
