"""TLS for epochal's connections: a per-attempt certificate the driver creates and every
task pins.

Between hosts, frames carry pickles, so they must come from a peer of the same job and
arrive unmodified. When encryption is on (by default whenever tasks run on more than one
host, see :class:`~epochal.config.ChannelConfig`), every connection — task↔task and
task↔coordinator — is TLS 1.3 with mutual authentication:

* the driver generates one self-signed ECDSA P-256 certificate and key per attempt
  (:meth:`TLSMaterial.generate`) and ships them inside the attempt spec, on the same path
  as the job's HMAC key (Spark's task closure or the local launcher's pipe);
* both sides present that certificate and trust nothing but it (the certificate is
  *pinned*: no CA, no host names), so only holders of the attempt's private key complete
  the handshake — an older attempt's zombie, another job or anything else on the network
  cannot;
* the HMAC challenge-response of :mod:`epochal.runtime.transport.wire` still runs inside the TLS
  session (it carries the hello and fences generations).

:class:`TLSSocket` runs the TLS state machine on an ``ssl.SSLObject`` with memory BIOs
instead of ``ssl.SSLSocket``: an epochal connection is read by one thread while other
threads write to it (credits, acknowledgements), and OpenSSL does not allow one ``SSL``
object to be used by two threads at once. Here every use of the ``SSLObject`` holds one
lock, and the socket I/O happens outside it.

The private key never touches a disk: it is handed to OpenSSL through a pipe.
Confidentiality of the key on its way to the executors is Spark's: enable Spark's own RPC
encryption (``spark.authenticate`` + ``spark.network.crypto.enabled``) on networks where
Spark's traffic can be read.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import socket
import ssl
import threading
from dataclasses import dataclass, field

__all__ = ["TLSMaterial", "TLSSocket"]

_READ = 256 * 1024
_contexts: dict[tuple[str, bool], ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


@dataclass(frozen=True)
class TLSMaterial:
    """The certificate (PEM) every peer of one attempt presents and pins, and its key.

    Picklable and immutable; the ``ssl.SSLContext`` objects are built lazily, once per
    process (:meth:`context`). ``key_pem`` is excluded from ``repr`` so it never lands in
    a log line.
    """

    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    @classmethod
    def generate(cls, name: str) -> "TLSMaterial":
        """A fresh self-signed ECDSA P-256 certificate for ``name`` (e.g. ``"job/gen 3"``).

        Valid from an hour ago (clock skew between hosts) for ten years: trust comes from
        pinning this exact certificate, not from its dates, and an attempt may run for months.
        Needs the ``cryptography`` package (driver only; tasks use the standard ``ssl``).
        """
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"epochal {name}"[:64])])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            # a self-signed certificate that is its own trust anchor
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
        )

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the certificate PEM (hex): names the attempt's certificate in logs."""
        return hashlib.sha256(self.cert_pem).hexdigest()

    def context(self, server_side: bool) -> ssl.SSLContext:
        """The process-wide TLS 1.3 context presenting and pinning this certificate."""
        cache_key = (self.fingerprint, server_side)
        with _contexts_lock:
            ctx = _contexts.get(cache_key)
            if ctx is None:
                ctx = self._build(server_side)
                _contexts[cache_key] = ctx
            return ctx

    def _build(self, server_side: bool) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        if not server_side:
            ctx.check_hostname = False  # peers are pinned by certificate, not by host name
        ctx.verify_mode = ssl.CERT_REQUIRED  # mutual: a server also demands the certificate
        ctx.load_verify_locations(cadata=self.cert_pem.decode("ascii"))
        _load_chain(ctx, self.cert_pem, self.key_pem)
        return ctx


def _load_chain(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """``ctx.load_cert_chain`` from bytes: OpenSSL reads files, so hand them over through
    pipes (``/dev/fd/N``) — the key is never written to a disk."""
    fds = []
    try:
        paths = []
        for data in (cert_pem, key_pem):
            r, w = os.pipe()
            fds += [r, w]
            os.write(w, data)  # PEMs are far below a pipe's 64 KiB buffer
            os.close(w)
            fds.remove(w)
            paths.append(f"/dev/fd/{r}")
        ctx.load_cert_chain(certfile=paths[0], keyfile=paths[1])
    finally:
        for fd in fds:
            os.close(fd)


class TLSSocket:
    """A connected blocking socket speaking TLS, usable by one reading thread and any
    number of writing threads at once (see the module docstring).

    Offers the subset of the socket API :class:`~epochal.runtime.transport.wire.Connection` uses:
    ``sendall``, ``recv_into``, ``settimeout``, ``setsockopt``, ``shutdown``, ``close``,
    ``getsockname`` / ``getpeername``. The handshake runs in the constructor within the
    socket's current timeout.

    Raises (constructor): ``ssl.SSLError`` when the peer does not present the pinned
    certificate or speaks something else; ``OSError`` / ``ConnectionError`` when the
    connection breaks or times out.
    """

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_side: bool):
        self._sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._in, self._out, server_side=server_side)
        self._lock = threading.Lock()  # every use of self._ssl
        self._send_lock = threading.Lock()  # socket writes, in the order the BIO produced them
        self._plain = bytearray()  # decrypted bytes not yet consumed (reader thread only)
        self._eof = False
        self._handshake()

    # -------------------------------------------------------------- handshake
    def _handshake(self) -> None:
        while True:
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send_pending()
                data = self._sock.recv(_READ)
                if not data:
                    raise ConnectionError("connection closed during the TLS handshake") from None
                self._in.write(data)
        self._send_pending()

    def _send_pending(self) -> None:
        """Send what the TLS engine produced (handshake records, session tickets, key
        updates) — under the send lock, so records reach the socket in BIO order."""
        with self._send_lock:
            with self._lock:
                data = self._out.read()
            if data:
                self._sock.sendall(data)

    @property
    def version(self) -> str | None:
        return self._ssl.version()

    # -------------------------------------------------------------- data
    def sendall(self, data) -> None:
        with self._send_lock:
            with self._lock:
                self._ssl.write(data)
                out = self._out.read()
            self._sock.sendall(out)

    def recv_into(self, view, nbytes: int = 0) -> int:
        """Up to ``nbytes`` decrypted bytes into ``view``; 0 at the end of the stream.
        Reader thread only."""
        n = nbytes or len(view)
        while not self._plain:
            if self._eof:
                return 0
            with self._lock:
                try:
                    chunk = self._read_record(n)
                except ssl.SSLZeroReturnError:  # the peer's close_notify
                    self._eof = True
                    return 0
                pending = self._out.pending
            if pending:  # e.g. an answer to a key update
                self._send_pending()
            if chunk:
                self._plain += chunk
                break
            raw = self._sock.recv(_READ)
            if not raw:
                self._eof = True
                return 0
            with self._lock:
                self._in.write(raw)
        k = min(n, len(self._plain))
        view[:k] = self._plain[:k]
        del self._plain[:k]
        return k

    def _read_record(self, n: int) -> bytes:
        """Decrypt what the incoming BIO holds (lock held); ``b""`` when the next record
        needs more bytes from the socket."""
        try:
            return self._ssl.read(max(n, _READ))
        except ssl.SSLWantReadError:
            return b""

    # -------------------------------------------------------------- socket passthrough
    def settimeout(self, value) -> None:
        self._sock.settimeout(value)

    def setsockopt(self, *args) -> None:
        self._sock.setsockopt(*args)

    def getsockname(self):
        return self._sock.getsockname()

    def getpeername(self):
        return self._sock.getpeername()

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def close(self) -> None:
        self._sock.close()
