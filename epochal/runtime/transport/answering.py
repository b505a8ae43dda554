"""Request/answer serving over authenticated connections (:class:`Answering`): what the
query directory, each task's query server and the relay hub run on every connection a
:class:`~epochal.runtime.transport.wire.Server` hands them. Found as ``wire.Answering`` too.
"""
from __future__ import annotations

import threading

from epochal.runtime.transport import tagged_json


class Answering:
    """The connections of a request/answer server (a :class:`Server`'s ``on_connection``
    calls :meth:`serve`): each connection's requests are answered in order by
    ``answer(request)`` on the connection's thread until the peer goes or :meth:`close`.

    With ``codec`` (a :class:`~epochal.runtime.transport.tagged_json.Codec`: for peers holding
    a capability that must not run code, query clients), requests and answers are data-only
    tagged JSON, never pickle: a
    request that is not data (a pickle, say) is answered ``("error", None, reason)`` and
    nothing of it is run; an answer that is not data is replaced by such an error too.
    Without it, frames are pickles between peers of one job (:func:`~epochal.runtime.transport.wire.decode`).

    With ``bound``, ``answer(request, hello)`` also gets the connection's authenticated
    hello (what the peer may do: the relay hub binds each connection to its lanes).

    Once closed, a new connection is dropped at once; ``close`` drops the open ones
    (their threads end on the next receive). Idempotent.
    """

    def __init__(self, answer, codec: tagged_json.Codec | None = None, name: str = "server", bound: bool = False):
        self._answer = answer
        self.codec = codec
        self.bound = bound
        self.name = name
        self._lock = threading.Lock()
        self._conns: set = set()
        self.closed = False

    def serve(self, conn) -> None:
        """Answer ``conn``'s requests (a :class:`~epochal.runtime.transport.wire.Connection`) until it goes."""
        with self._lock:
            if self.closed:
                conn.close()
                return
            self._conns.add(conn)
        try:
            while True:
                if self.codec is not None:
                    conn.send_bytes(self._answer_data(conn.recv_bytes(), conn.peer_hello))
                else:
                    conn.send(self._answer(conn.recv()))
        except Exception:
            pass  # the peer went (or close() dropped it): nothing to answer
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _answer_data(self, payload: bytes, hello: dict) -> bytes:
        """The data-only answer to one frame (``codec``): nothing unpickled."""
        codec = self.codec
        try:
            request = codec.loads(payload)
        except tagged_json.NotData as exc:
            return codec.dumps(("error", None, f"{self.name}: refused a request that is not "
                                               f"data-only (tagged JSON; pickles are never read here): {exc}"))
        reply = self._answer(request, hello) if self.bound else self._answer(request)
        try:
            return codec.dumps(reply, where=f"{self.name}'s answer")
        except tagged_json.NotData as exc:
            return codec.dumps(("error", None, str(exc)))

    def drop(self) -> None:
        """Close the open connections, keep serving new ones (their key was revoked)."""
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self.drop()
