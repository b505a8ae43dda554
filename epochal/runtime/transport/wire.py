"""Authenticated, framed TCP connections between tasks and to the coordinator.

Every connection starts with a mutual HMAC-SHA256 challenge-response over the job key
(derived from the job's random secret and the attempt's generation, so a zombie task
of an older generation cannot even connect). Until both sides proved the key, only
fixed-size nonces, MACs and a small JSON hello cross the wire — nothing is unpickled.
After the handshake, frames (4-byte length + payload) carry pickled messages between
peers of the same job and generation — except on connections with a ``codec`` (a
:class:`~epochal.runtime.transport.tagged_json.Codec`, chosen by both ends: the server's
:class:`Server` and the client's :func:`connect`), where every frame is data-only tagged
JSON both ways and a frame that is not (a pickle) is refused unread: the coordinator's
control messages (:data:`CONTROL`), the relay hub's, and the connections of peers that hold
only a read capability (query clients: :class:`Answering` with a ``codec``).

A server's ``key`` may be a function of the peer's hello (``key(hello) -> bytes | None``):
the hello names what the peer is (a relay lane, its generation) and the key it must prove
is chosen by it — the hello is parsed as JSON first, but trusted only once the MAC over it
verified; ``None`` refuses the peer.

With ``tls`` (a :class:`~epochal.runtime.transport.tls.TLSMaterial`), the connection is first wrapped
in mutually authenticated TLS 1.3 pinned to the attempt's certificate, and the HMAC
handshake and every frame travel inside it: frames are then encrypted and
integrity-protected (a flipped byte breaks the connection, nothing is unpickled). Without
it, frames are authenticated only at connection time — fine on loopback, not on a network
others can reach (:class:`~epochal.config.ChannelConfig` ``encryption``).

A :class:`Server` holds at most ``max_pending`` connections that have not finished the
handshake; beyond that it drops the oldest, so a flood of unauthenticated sockets costs a
bounded number of threads and cannot starve a real peer (whose handshake takes
milliseconds) for longer than the flood's rate allows.

With ``peer_timeout`` (on a cluster: :class:`~epochal.config.ClusterConfig`), every
connection detects a peer whose host stopped answering — a pulled cable, a partition, a
frozen host, none of which closes a socket — within that many seconds, through the
kernel: TCP keepalive probes an idle connection and ``TCP_USER_TIMEOUT`` bounds how long
sent data may stay unacknowledged. Either raises :class:`PeerLost` naming the peer's
address. It cannot fire on a peer that is merely slow or back-pressured: the kernel
acknowledges for it, and every epochal connection has a thread that keeps reading.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import pickle
import socket
import struct
import threading
import time

from epochal import serde
from epochal.errors import EpochalError
from epochal.runtime.transport import tagged_json
from epochal.runtime.transport.answering import Answering  # noqa: F401 (where servers have found it)

MAGIC = b"EPOCHAL1"
NONCE = 32
MAC = 32
MAX_FRAME = 1 << 30
HANDSHAKE_TIMEOUT = 10.0
#: connections a Server keeps in the handshake at once; the oldest is dropped beyond
MAX_PENDING_HANDSHAKES = 64
_LEN = struct.Struct("!I")
#: the encoding of control messages (coordinator ↔ task, the relay hub's requests): tagged
#: JSON, lenient about subclasses of data types when encoding (counters in a ``defaultdict``)
CONTROL = tagged_json.NativeCodec()


class AuthenticationError(EpochalError):
    """A peer failed the handshake (wrong job, older generation, or not epochal)."""


class ConnectionClosed(EpochalError):
    """The peer closed the connection (or it broke) while we were reading."""


class FrameTooLarge(EpochalError, ValueError):
    """A message encodes to more than :data:`MAX_FRAME` bytes; nothing was sent. Data
    channels never get here: their sender cuts batches to ``ChannelConfig.max_frame_bytes``
    first (:mod:`epochal.runtime.transport.frames`)."""


class PeerLost(ConnectionClosed, OSError):
    """The peer's host stopped acknowledging the connection for ``peer_timeout`` seconds
    (the kernel gave up: ``ETIMEDOUT``); the message names the peer's address, ``host``
    holds it. An ``OSError`` too, so every caller that handles a broken connection
    handles it."""

    host: str = ""


def lost_host(exc: BaseException | None) -> str | None:
    """The host of the first :class:`PeerLost` in ``exc``'s cause/context chain, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, PeerLost):
            return exc.host
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def set_peer_timeout(sock, seconds: float) -> None:
    """Make the kernel declare ``sock``'s peer lost after ``seconds`` without an
    acknowledgement: keepalive probes from ``seconds / 3`` of idleness on, every
    ``seconds / 6``, three unanswered ones drop it; ``TCP_USER_TIMEOUT`` (Linux) bounds
    unacknowledged sent data the same way and caps the probes."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", max(1, int(seconds / 3))), ("TCP_KEEPINTVL", max(1, int(seconds / 6))),
                        ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", int(seconds * 1000))):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def derive_key(secret: bytes, job: str, generation: int) -> bytes:
    """Per-attempt key: peers of another job or generation cannot authenticate."""
    return hmac.new(secret, f"epochal:{job}:{generation}".encode(), hashlib.sha256).digest()


def encode(message) -> bytes:
    """The frame payload of ``message`` (what :meth:`Connection.send` sends; ``recv`` decodes it)."""
    return serde.dumps(message)


#: first bytes of a frame holding Arrow IPC (a pickle starts with 0x80): the data message
#: ``("B", [batches])`` of a channel of Arrow batches, without pickling (epochal.columnar);
#: 8 bytes, so the IPC buffers stay 8-byte aligned in the received frame
_ARROW = b"A\0\0\0\0\0\0\0"


def encode_arrow(batches: list):
    """The frame payload of the data message ``("B", batches)`` as one Arrow IPC stream
    (every batch of one schema): a buffer to send as it is, no pickle, no copy of the data."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    sink.write(_ARROW)
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def decode(payload: bytes):
    """A message from a frame payload: Arrow IPC (:func:`encode_arrow`) or pickle."""
    if payload[:8] == _ARROW:
        import pyarrow as pa

        reader = pa.ipc.open_stream(pa.py_buffer(memoryview(payload)[len(_ARROW):]))
        return "B", list(reader)
    return pickle.loads(payload)


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


class Connection:
    """A framed message connection over an authenticated socket.

    ``send`` may be called from several threads (it is locked); ``recv`` from one. With
    ``peer_timeout``, a peer host that stops answering raises :class:`PeerLost` from
    either (module docstring). With ``codec``, ``send``/``recv`` are data-only tagged JSON:
    ``send`` raises :class:`~epochal.runtime.transport.tagged_json.NotData` for a message
    that is not data (nothing sent), ``recv`` for a frame that is not (nothing unpickled).
    """

    def __init__(self, sock: socket.socket, peer_hello: dict | None = None, peer_timeout: float | None = None,
                 codec: tagged_json.Codec | None = None):
        self.sock = sock
        self.codec = codec
        self.peer_hello = peer_hello or {}
        self.peer_timeout = peer_timeout
        self._send_lock = threading.Lock()
        self._closed = False
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if peer_timeout:
            set_peer_timeout(sock, peer_timeout)
        try:
            self.peer = sock.getpeername()[:2]
        except OSError:
            self.peer = ("?", 0)

    def _lost(self, exc: OSError) -> OSError:
        """``exc`` as :class:`PeerLost` when the kernel timed the peer out, else itself."""
        if self.peer_timeout and getattr(exc, "errno", None) == errno.ETIMEDOUT:
            lost = PeerLost(f"{self.peer[0]}:{self.peer[1]} stopped answering for {self.peer_timeout:g} s "
                            "(cluster.peer_timeout): its host was lost or the network is partitioned")
            lost.host = str(self.peer[0])
            return lost
        return exc

    def send_bytes(self, payload) -> None:
        """Send one frame; ``payload`` is bytes or any buffer (an Arrow buffer is sent
        without a copy)."""
        if len(payload) > MAX_FRAME:  # the receiver would drop the connection (and over 4 GiB no header fits)
            raise FrameTooLarge(f"a frame of {len(payload)} bytes exceeds the {MAX_FRAME} byte limit of every receiver")
        header = _LEN.pack(len(payload))
        with self._send_lock:
            try:
                if len(payload) < 65536:  # one syscall for small frames
                    self.sock.sendall(header + bytes(payload))
                else:  # avoid copying large payloads
                    self.sock.sendall(header)
                    self.sock.sendall(payload)
            except OSError as exc:
                lost = self._lost(exc)
                if lost is exc:
                    raise
                raise lost from exc

    def send(self, message) -> None:
        codec = self.codec
        self.send_bytes(encode(message) if codec is None else codec.dumps(message, where="message"))

    def recv_bytes(self) -> bytes:
        try:
            (n,) = _LEN.unpack(_recv_exact(self.sock, 4))
            if n > MAX_FRAME:
                raise ConnectionClosed(f"frame of {n} bytes exceeds the {MAX_FRAME} byte limit")
            return _recv_exact(self.sock, n)
        except ConnectionClosed as exc:
            cause = exc.__cause__
            lost = self._lost(cause) if isinstance(cause, OSError) else cause
            if lost is not cause:
                raise lost from cause
            raise

    def recv(self):
        codec = self.codec
        return decode(self.recv_bytes()) if codec is None else codec.loads(self.recv_bytes())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionClosed("handshake timed out")
            sock.settimeout(remaining)
        try:
            k = sock.recv_into(view[got:], n - got)
        except OSError as exc:
            raise ConnectionClosed(str(exc)) from exc
        if k == 0:
            raise ConnectionClosed("connection closed by peer")
        got += k
    return bytes(buf)


def connect(address: tuple[str, int], key: bytes, hello: dict, timeout: float = HANDSHAKE_TIMEOUT,
            tls=None, peer_timeout: float | None = None, *, codec: tagged_json.Codec | None = None) -> Connection:
    """Client side: connect, (with ``tls``) run the pinned TLS handshake, prove the key,
    check the server proves it too, send ``hello``. ``codec``: the server's (its frames
    are data-only tagged JSON both ways).

    Raises:
        OSError: the address cannot be reached within ``timeout`` (refused, no route, ...).
        AuthenticationError: the peer is not an epochal endpoint of this job and
            generation, or fails TLS with the attempt's certificate.
    """
    sock = socket.create_connection(address, timeout=timeout)
    try:
        sock.settimeout(timeout)
        if tls is not None:
            sock = _tls_wrap(sock, tls, server_side=False, where=address)
        head = _recv_exact(sock, len(MAGIC) + NONCE)
        if head[: len(MAGIC)] != MAGIC:
            raise AuthenticationError(f"{address}: not an epochal endpoint")
        server_nonce = head[len(MAGIC):]
        client_nonce = os.urandom(NONCE)
        hello_bytes = json.dumps(hello).encode()
        sock.sendall(client_nonce + _mac(key, b"client", server_nonce, client_nonce, hello_bytes)
                     + _LEN.pack(len(hello_bytes)) + hello_bytes)
        try:
            proof = _recv_exact(sock, MAC)
        except ConnectionClosed:
            raise AuthenticationError(f"{address}: the server closed the connection during the handshake "
                                      "(wrong key: another job or generation?)") from None
        if not hmac.compare_digest(proof, _mac(key, b"server", client_nonce, server_nonce)):
            raise AuthenticationError(f"{address}: server failed authentication (another job or generation)")
        return Connection(sock, peer_timeout=peer_timeout, codec=codec)
    except BaseException:
        sock.close()
        raise


def _tls_wrap(sock, tls, server_side: bool, where):
    import ssl

    from epochal.runtime.transport.tls import TLSSocket

    try:
        return TLSSocket(sock, tls.context(server_side=server_side), server_side=server_side)
    except ssl.SSLError as exc:
        raise AuthenticationError(f"{where}: TLS handshake failed ({exc.reason or exc}): the peer does not hold "
                                  "this attempt's certificate (another job or generation, or not epochal)") from exc


def accept_handshake(sock: socket.socket, key, timeout: float = HANDSHAKE_TIMEOUT, tls=None,
                     peer_timeout: float | None = None, *, codec: tagged_json.Codec | None = None) -> Connection:
    """Server side of :func:`connect`; raises AuthenticationError for a wrong key or a
    peer without the attempt's TLS certificate. ``key``: bytes, or ``key(hello)`` → the
    key this peer must prove, ``None`` to refuse it (module docstring)."""
    deadline = time.monotonic() + timeout  # for the whole handshake, not per read
    sock.settimeout(timeout)
    if tls is not None:
        sock = _tls_wrap(sock, tls, server_side=True, where="client")
        sock.settimeout(max(0.001, deadline - time.monotonic()))
    server_nonce = os.urandom(NONCE)
    sock.sendall(MAGIC + server_nonce)
    client_nonce = _recv_exact(sock, NONCE, deadline)
    mac = _recv_exact(sock, MAC, deadline)
    (n,) = _LEN.unpack(_recv_exact(sock, 4, deadline))
    if n > 4096:
        raise AuthenticationError("hello too large")
    hello_bytes = _recv_exact(sock, n, deadline)
    hello = None
    if callable(key):
        try:
            hello = json.loads(hello_bytes)
        except (ValueError, RecursionError):
            raise AuthenticationError("client sent a hello that is not JSON") from None
        key = key(hello) if type(hello) is dict else None
        if key is None:
            raise AuthenticationError("client's hello names no peer this server admits")
    if not hmac.compare_digest(mac, _mac(key, b"client", server_nonce, client_nonce, hello_bytes)):
        raise AuthenticationError("client failed authentication (another job or generation)")
    sock.sendall(_mac(key, b"server", client_nonce, server_nonce))
    return Connection(sock, json.loads(hello_bytes) if hello is None else hello, peer_timeout=peer_timeout,
                      codec=codec)


class Server:
    """A listening socket whose accept loop authenticates peers and hands connections on.

    Peers that fail the handshake are dropped (and counted in ``rejected``); they never
    reach ``on_connection``. At most ``max_pending`` sockets are in the handshake at once
    (one thread each, for at most ``HANDSHAKE_TIMEOUT``); a new one beyond that evicts the
    oldest (counted in ``evicted``).

    ``key``: bytes, or a function of the peer's hello (:func:`accept_handshake`); it may be
    replaced while serving (a revoked query token): connections authenticated before keep
    going, new ones must prove the new key. ``codec``: every connection's frames are
    data-only tagged JSON (:class:`Connection`).

    Raises (constructor): ``OSError`` when ``host`` cannot be bound (e.g. it is not an
    address of this host).
    """

    def __init__(self, key, on_connection, host: str = "127.0.0.1", name: str = "server", tls=None,
                 max_pending: int = MAX_PENDING_HANDSHAKES, peer_timeout: float | None = None,
                 codec: tagged_json.Codec | None = None):
        self.key = key
        self.codec = codec
        self.tls = tls
        self.peer_timeout = peer_timeout
        self.on_connection = on_connection
        self.rejected = 0
        self.evicted = 0
        self.max_pending = max_pending
        self._pending: dict[socket.socket, None] = {}  # insertion-ordered: oldest first
        self._pending_lock = threading.Lock()
        self._sock = socket.create_server((host, 0), backlog=128)
        self.address = self._sock.getsockname()[:2]
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=f"epochal-{name}-accept", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Connections currently in the handshake."""
        return len(self._pending)

    def _loop(self):
        while not self._stopped:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            with self._pending_lock:
                while len(self._pending) >= self.max_pending:
                    oldest = next(iter(self._pending))
                    del self._pending[oldest]
                    self.evicted += 1
                    try:  # wakes its handshake thread, which then gives up
                        oldest.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                self._pending[sock] = None
            threading.Thread(target=self._handshake, args=(sock,), daemon=True).start()

    def _handshake(self, sock):
        try:
            conn = accept_handshake(sock, self.key, tls=self.tls, peer_timeout=self.peer_timeout, codec=self.codec)
        except (AuthenticationError, ConnectionClosed, OSError, ValueError):
            self.rejected += 1
            self._forget(sock)
            sock.close()
            return
        if not self._forget(sock):  # evicted while finishing: treat as dropped
            conn.close()
            return
        if self._stopped:
            conn.close()
            return
        self.on_connection(conn)

    def _forget(self, sock) -> bool:
        """Take ``sock`` off the pending list; False if it was evicted meanwhile."""
        with self._pending_lock:
            return self._pending.pop(sock, False) is None

    def close(self):
        self._stopped = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
