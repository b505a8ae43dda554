"""The query client: point and multi-key lookups of a running job's state (seed 004 §4.3.1).

:class:`QueryClient` asks the driver's query directory where each operator's key groups
live, then sends each lookup straight to the tasks that own the keys (key group →
subtask, as records are routed). For ``read-committed`` a multi-key lookup reads every
key at the same epoch: each task answers from its newest committed version and says which
epochs it holds; if they differ the client asks again at the newest epoch all of them hold
(:func:`~epochal.query.protocol.common_epoch`). While the job restarts (tasks gone, routes
of the new attempt not registered yet) the client waits, up to ``timeout``, and answers from
the restored epoch once the new tasks serve it — never from a half-restored state (a task
registers only after its restore).
"""
from __future__ import annotations

import itertools
import pickle
import threading
import time
from dataclasses import dataclass, field

from epochal.backends.keygroups import key_group_for
from epochal.errors import EpochalError
from epochal.query.protocol import (CODEC, READ_COMMITTED, VALUES_DATA, VALUES_PICKLED, JobEnded, QueryError, check_isolation,
                                    common_epoch, query_key, route)
from epochal.runtime.transport import tagged_json, wire

#: seconds between attempts while the job restarts or a task has no committed epoch yet
RETRY_PAUSE = 0.02


@dataclass(frozen=True)
class QueryResult:
    """What a lookup returns: ``values`` (``{key: value}``, every key asked), the ``epoch``
    the values were read at (``None`` for read-uncommitted) and the ``isolation``."""

    values: dict
    epoch: int | None
    isolation: str = READ_COMMITTED
    keys: list = field(default_factory=list, repr=False)

    @property
    def value(self):
        """The value of the (first) key asked: for a point lookup."""
        return self.values.get(self.keys[0]) if self.keys else None


class _Retry(Exception):
    """Something moved (a restart, a completion): ask again."""


class QueryClient:
    """Looks up queryable state of a running job.

    Args:
        address: ``(host, port)`` or ``"host:port"`` of the job's query directory
            (``JobHandle.query_address``).
        token: the job's query token (``JobHandle.query_token``).
        timeout: default seconds a lookup may wait (restarts, first epoch).
        tls: an encrypted job's ``JobHandle.query_tls`` (its queries travel in pinned TLS).
        pickled_values: ask for values pickled and unpickle them here — for values with no
            data-only encoding (instances of your own classes), and only for your own job's
            endpoints: an endpoint that is not your job's could run code in this process. By
            default (``False``) nothing received is unpickled; keys are always sent as data
            (:mod:`~epochal.runtime.transport.tagged_json`: str, int, float, bool, None, bytes,
            tuple, list, dict, set).

    Thread-safe (one lookup at a time per client). Example::

        client = QueryClient(handle.query_address, handle.query_token)
        r = client.query("accounts", "balance", ["a", "b"])
        r.values, r.epoch        # ({'a': 10, 'b': 90}, 17)
    """

    def __init__(self, address, token: str, timeout: float = 30.0, tls=None, pickled_values: bool = False):
        if isinstance(address, str):
            host, _, port = address.rpartition(":")
            address = (host, int(port))
        self.address = (address[0], int(address[1]))
        self.key = query_key(token)
        self.timeout = timeout
        self.tls = tls
        self.values = VALUES_PICKLED if pickled_values else VALUES_DATA
        self._values = self.values  # of the lookup in progress
        self._routes: dict | None = None
        self._conns: dict[tuple, wire.Connection] = {}
        self._lock = threading.Lock()
        self._rid = itertools.count()
        self._deadline = 0.0  # of the lookup in progress

    # ------------------------------------------------------------------ public
    def query(self, operator: str, state: str, keys, *, isolation: str = READ_COMMITTED,
              timeout: float | None = None, pickled_values: bool | None = None) -> QueryResult:
        """Look up ``keys`` (a ``list`` of keys; anything else is one key) in ``state`` of
        ``operator``. See :class:`QueryResult`. ``pickled_values``: this lookup's choice
        (``None``: the client's, see the class).

        Raises:
            QueryError: unknown operator/state, a state not declared queryable, a bad
                isolation level, or no answer within ``timeout``.
        """
        check_isolation(isolation)
        many = isinstance(keys, list)
        keys = list(keys) if many else [keys]
        try:
            CODEC.encode(keys, where="key")
        except tagged_json.NotData as exc:
            raise QueryError(f"query of {operator}/{state}: {exc} — keys travel as data only") from None
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        last = "no answer yet"
        with self._lock:
            self._deadline = deadline
            self._values = self.values if pickled_values is None else (VALUES_PICKLED if pickled_values
                                                                         else VALUES_DATA)
            while True:
                try:
                    values, epoch = self._attempt(operator, state, keys, isolation)
                    return QueryResult(dict(zip(keys, values)), epoch, isolation, keys)
                except _Retry as exc:
                    last = str(exc)
                if time.monotonic() >= deadline:
                    raise QueryError(f"query of {operator}/{state} not answered within "
                                     f"{self.timeout if timeout is None else timeout} s: {last}")
                time.sleep(RETRY_PAUSE)

    def close(self) -> None:
        with self._lock:
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ internals
    def _conn(self, address: tuple, hello: dict) -> wire.Connection:
        conn = self._conns.get(address)
        if conn is None:
            try:
                wait = min(5.0, max(0.5, self._deadline - time.monotonic()))  # the handshake, within the lookup's time
                conn = wire.connect(address, self.key, hello, timeout=wait, tls=self.tls)
            except wire.AuthenticationError as exc:
                raise QueryError(f"query endpoint {address[0]}:{address[1]} refused the token or the TLS "
                                 f"handshake (an encrypted job needs tls=JobHandle.query_tls): {exc}") from exc
            except wire.ConnectionClosed as exc:  # closed before it spoke: an endpoint going away (a task
                self._routes = None  # handing over to its sidecar, a task ending), not a refusal: ask again
                raise _Retry(f"query endpoint {address[0]}:{address[1]} closed the connection before the handshake "
                             "(it refused the TLS handshake — an encrypted job needs tls=JobHandle.query_tls — or "
                             f"it was going away): {exc}") from exc
            except OSError as exc:
                raise _Retry(f"{address[0]}:{address[1]} unreachable: {exc}") from exc
            self._conns[address] = conn
        return conn

    def _drop(self, address: tuple) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            conn.close()

    def _fetch_routes(self) -> dict:
        try:
            conn = self._conn(self.address, {"query": "routes"})
        except _Retry as exc:  # the directory lives as long as the job: nobody answers, no job
            raise JobEnded(f"no running job answers at {self.address[0]}:{self.address[1]}: {exc}") from exc
        try:
            _send(conn, ("routes",))
            reply = _recv(conn)
        except (EpochalError, OSError) as exc:
            if isinstance(exc, QueryError):
                raise
            self._drop(self.address)
            raise _Retry(f"query directory {self.address[0]}:{self.address[1]}: {exc}") from exc
        routes = reply[1]
        if routes == "ended":
            raise JobEnded("the job has ended: its state can be read from its checkpoints (epochal.state.read)")
        if routes is None:
            raise _Retry("the job is not running (starting or restarting)")
        self._routes = routes
        return routes

    def _attempt(self, operator: str, state: str, keys: list, isolation: str):
        routes = self._routes or self._fetch_routes()
        kgs = [key_group_for(k, routes["max_parallelism"]) for k in keys]
        try:
            plan = route(routes, operator, kgs)
        except LookupError as exc:
            self._routes = None
            raise _Retry(str(exc)) from exc
        answers = self._ask(plan, operator, state, keys, kgs, isolation, {t: None for t in plan})
        if isolation == READ_COMMITTED:
            epochs = {a[0] for a in answers.values()}
            if len(epochs) > 1:  # subtasks at different newest epochs: read all at one they share
                target = common_epoch([a[1] for a in answers.values()])
                if target is None:
                    raise _Retry(f"tasks hold no common committed epoch ({sorted(epochs)})")
                again = {t: target for t, a in answers.items() if a[0] != target}
                answers.update(self._ask({t: plan[t] for t in again}, operator, state, keys, kgs, isolation, again))
        values = [None] * len(keys)
        epoch = None
        for task, (_address, positions) in plan.items():
            epoch, _, got = answers[task]
            for pos, value in zip(positions, got):
                values[pos] = value
        return values, epoch

    def _ask(self, plan: dict, operator: str, state: str, keys: list, kgs: list, isolation: str,
             epochs: dict) -> dict:
        """Send every task its share at once, then read the answers: ``{task: (epoch, held, values)}``."""
        sent = []
        for task, (address, positions) in plan.items():
            rid = next(self._rid)
            request = ("get", rid, operator, state, [(kgs[p], keys[p]) for p in positions], isolation, epochs[task],
                       self._values)
            try:
                conn = self._conn(address, {"query": task})
                _send(conn, request)
            except (_Retry, EpochalError, OSError) as exc:  # _Retry: unreachable (a finished or lost task)
                for _, other, _, _ in sent:  # their answers would be read by the next request
                    self._drop(other)
                self._drop(address)
                self._routes = None  # ask the directory again: the job may have moved, or ended
                if isinstance(exc, QueryError):
                    raise
                raise _Retry(f"task {task}: {exc}") from exc
            sent.append((task, address, conn, rid))
        replies = []
        for task, address, conn, rid in sent:  # read every answer before judging any
            try:
                reply = _recv(conn)
            except (EpochalError, OSError) as exc:
                reply = ("lost", None, f"task {task}: {exc}")
            if reply[0] != "error" and reply[1] != rid:
                self._drop(address)
                self._routes = None
            replies.append((task, rid, reply))
        answers, retry = {}, None
        for task, rid, reply in replies:
            kind = reply[0]
            if kind == "error":
                raise QueryError(str(reply[2]))
            if kind == "ok" and reply[1] == rid:
                got = reply[4]
                if self._values == VALUES_PICKLED:  # the caller's opt-in, for its own job
                    got = pickle.loads(got) if type(got) is bytes else None
                if type(got) is not list or len(got) != len(plan[task][1]):
                    raise QueryError(f"task {task}: malformed answer (expected {len(plan[task][1])} values)")
                answers[task] = (reply[2], reply[3], got)
            else:
                if kind == "moved":
                    self._routes = None
                retry = retry or str(reply[2])
        if retry is not None:
            raise _Retry(retry)
        return answers


#: the least length of each answer kind (protocol)
_LENGTHS = {"routes": 2, "ok": 5, "unavailable": 3, "moved": 3, "error": 3}


def _send(conn: wire.Connection, message: tuple) -> None:
    conn.send_bytes(CODEC.dumps(message, where="query request"))


def _recv(conn: wire.Connection) -> tuple:
    """The next answer, data only (never unpickled): malformed ones raise :class:`QueryError`."""
    try:
        reply = CODEC.loads(conn.recv_bytes())
    except tagged_json.NotData as exc:
        raise QueryError(f"query endpoint {conn.peer[0]}:{conn.peer[1]} answered something that is not data: {exc}") from None
    kind = reply[0] if type(reply) is tuple and reply and type(reply[0]) is str else None
    if kind is None or len(reply) < _LENGTHS.get(kind, 99):
        raise QueryError(f"query endpoint {conn.peer[0]}:{conn.peer[1]} sent a malformed answer {reply!r:.200}")
    return reply
