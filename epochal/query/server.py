"""A task's query server: answers lookups of its queryable state (seed 004 §4.3.1).

Binds the task's own address (loopback on local runs, the executor's address on a
cluster) and accepts only peers that prove the job's query token (the wire handshake,
:func:`~epochal.query.protocol.query_key`); even then it reads only data-only tagged JSON
requests (:mod:`~epochal.runtime.transport.tagged_json`), never a pickle: the token lets its
holder read state, nothing more. An encrypted
job (on a cluster, by default) wraps every query connection in TLS pinned to the job's query
certificate, as the data channels are (:mod:`epochal.runtime.transport.tls`).

Threading (the task's rule: one thread owns operators and state, :mod:`epochal.runtime.task.task`):

* read-committed answers read an immutable pinned view (:class:`CommittedVersions`) on the
  connection's own thread, never the live state;
* read-uncommitted answers go through the task's mailbox: ``live_read`` runs on the task
  thread and hands back pickled bytes, so no live object crosses threads.
"""
from __future__ import annotations

import pickle
import threading

from epochal.backends.views import ViewReleased
from epochal.query.protocol import CODEC, READ_COMMITTED, VALUES_PICKLED, parse_get
from epochal.query.versions import CommittedVersions, VersionGone
from epochal.runtime.transport import tagged_json, wire


#: why read-committed lookups are refused by a job whose every checkpoint is unaligned
UNALIGNED_REFUSAL = ("read-committed needs aligned checkpoints, and this job's are all unaligned "
                     "(checkpoint.unaligned=True: an epoch's records in flight are channel state, not in "
                     "its keyed state); use checkpoint.aligned_timeout, or isolation='read-uncommitted'")


class QueryServer:
    """Serves ``registry`` (``{"op/state": StateReader}``, :mod:`epochal.query.readers`) of one task.

    Args:
        key: the job's query key. host: where to bind.
        task: the task id (for messages). key_groups: the key groups the task owns.
        versions: the task's committed versions.
        live_read: ``live_read(name, items) -> bytes`` (pickled values),
            run on the task thread; raises ``TimeoutError`` if the task does not answer.
        committed_refused: if set, read-committed lookups are refused with this message.
    """

    def __init__(self, key: bytes, host: str, task: str, key_groups: range, registry: dict,
                 versions: CommittedVersions, live_read, peer_timeout: float | None = None, tls=None,
                 committed_refused: str | None = None):
        self.task, self.key_groups, self.registry = task, key_groups, registry
        self.versions, self.live_read = versions, live_read
        self.committed_refused = committed_refused
        self.answered = 0
        self._lock = threading.Lock()  # held while reading a view: close() waits for the reads
        self._closed = False
        self._answering = wire.Answering(self.answer, codec=CODEC, name=f"query server of task {task}")
        self.server = wire.Server(key, self._answering.serve, host=host, name=f"query-{task}",
                                  peer_timeout=peer_timeout, tls=tls)
        self.address = self.server.address

    def answer(self, request) -> tuple:
        """The response to one ``("get", ...)`` request (see :mod:`epochal.query.protocol`):
        already decoded from data-only tagged JSON; the values go back as data, or pickled
        when the request asks ``"pickle"`` (the client's opt-in, for its own job)."""
        try:
            rid, operator, state, items, isolation, epoch, encoding = parse_get(request)
        except Exception as exc:
            return ("error", None, f"task {self.task}: malformed query {request!r:.200}: {exc}")
        try:
            return self._answer(rid, operator, state, items, isolation, epoch, encoding)
        except tagged_json.NotData as exc:
            return ("error", rid, f"state {state!r} of operator {operator!r}: {exc}; a client of this job may ask for "
                                  "pickled values instead (QueryClient(..., pickled_values=True))")

    @staticmethod
    def _payload(values: list, encoding: str, where: str):
        """``values`` as the reply carries them: pickled bytes (the client's opt-in) or a data
        tree (raises :class:`~epochal.runtime.transport.tagged_json.NotData`)."""
        if encoding == VALUES_PICKLED:
            return pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
        return tagged_json.Encoded(CODEC.encode(values, where=where))

    def _answer(self, rid: int, operator: str, state: str, items: list, isolation: str, epoch, encoding: str) -> tuple:
        name = f"{operator}/{state}"
        reader = self.registry.get(name)
        if reader is None:
            mine = sorted(n.split("/", 1)[1] for n in self.registry if n.startswith(operator + "/"))
            return ("error", rid, f"operator {operator!r} has no queryable state {state!r} (queryable: {mine}); "
                                  "declare it with ctx.value_state(name, queryable=True), reduce(..., queryable=True) "
                                  "(state 'acc') or window(...).aggregate(..., queryable=True) (state 'windows')")
        stray = [kg for kg, _ in items if kg not in self.key_groups]
        if stray:
            return ("moved", rid, f"task {self.task} does not own key group {stray[0]}")
        if isolation != READ_COMMITTED:
            try:
                payload = self.live_read(name, items)
            except TimeoutError as exc:
                return ("unavailable", rid, str(exc), [])
            if encoding != VALUES_PICKLED:  # the task's own pickle (its task thread's): trusted
                payload = self._payload(pickle.loads(payload), encoding, name)
            self.answered += 1
            return ("ok", rid, None, [], payload)
        if self.committed_refused:
            return ("error", rid, self.committed_refused)
        with self._lock:
            if self._closed:
                return ("unavailable", rid, f"task {self.task} is stopping", [])
            try:
                epoch, version, held = self.versions.acquire(epoch)
                mark = version.marks.get(name)
                values = [reader.read(version.view, kg, key, mark) for kg, key in items]
            except (VersionGone, ViewReleased) as exc:
                return ("unavailable", rid, f"task {self.task}: {exc}", self.versions.held)
            except NotImplementedError as exc:
                return ("error", rid, f"state {state!r} of operator {operator!r}: {exc}")
            payload = self._payload(values, encoding, name)  # under the lock: the view is still pinned
        self.answered += 1
        return ("ok", rid, epoch, held, payload)

    def rekey(self, key: bytes) -> None:
        """The job's query token was revoked (any thread): new connections must prove
        ``key``; the open ones, authenticated with the old token, are dropped. Idempotent."""
        self.server.key = key
        self._answering.drop()

    def close(self) -> None:
        """Stop accepting, drop the connections, wait for reads in progress. Idempotent."""
        self.server.close()
        with self._lock:
            self._closed = True
        self._answering.close()


def read_live(backend, reader, items: list) -> bytes:
    """Task thread: the live values of ``items`` (``[(kg, key)]``) read by ``reader``
    (:class:`~epochal.query.readers.StateReader`), pickled at once."""
    mark = reader.mark()
    values = [reader.read(backend, kg, key, mark) for kg, key in items]
    return pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
