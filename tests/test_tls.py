"""Encrypted, integrity-protected connections (epochal.runtime.transport.tls) and a server that
unauthenticated peers cannot exhaust. Real sockets on loopback; raw sockets and a byte-
flipping proxy play the attacker."""
from __future__ import annotations

import os
import pickle
import queue
import socket
import ssl
import struct
import threading
import time

import pytest

from epochal.runtime.transport import wire
from epochal.runtime.transport.tls import TLSMaterial
from epochal.runtime.transport.wire import AuthenticationError, ConnectionClosed

KEY = wire.derive_key(b"\x02" * 32, "job", 0)


@pytest.fixture(scope="module")
def material():
    return TLSMaterial.generate("job generation 0")


class _Endpoint:
    def __init__(self, tls, **kwargs):
        self.accepted: queue.Queue = queue.Queue()
        self.server = wire.Server(KEY, self.accepted.put, name="test", tls=tls, **kwargs)
        self.address = self.server.address

    def close(self):
        self.server.close()
        while not self.accepted.empty():
            self.accepted.get_nowait().close()


@pytest.fixture
def endpoint(material):
    ep = _Endpoint(material)
    yield ep
    ep.close()


def test_tls_connection_carries_frames_both_ways(endpoint, material):
    client = wire.connect(endpoint.address, KEY, {"task": "a[0]"}, tls=material)
    server = endpoint.accepted.get(timeout=5)
    assert server.peer_hello == {"task": "a[0]"}
    assert client.sock.version == "TLSv1.3"
    payload = os.urandom(300_000)  # several TLS records
    client.send(("B", payload))
    assert server.recv() == ("B", payload)
    server.send(("C", 8))
    assert client.recv() == ("C", 8)
    client.close()
    server.close()


def test_another_certificate_is_refused_before_anything_is_unpickled(endpoint):
    other = TLSMaterial.generate("another job")
    with pytest.raises(AuthenticationError, match="TLS handshake failed"):
        wire.connect(endpoint.address, KEY, {}, tls=other)
    _wait_for(lambda: endpoint.server.rejected >= 1)
    assert endpoint.accepted.empty()


def test_a_plain_peer_cannot_get_a_pickle_unpickled(endpoint, tmp_path):
    """A peer without TLS sends a frame whose unpickling would create a file: the server
    treats it as a failed TLS handshake; the file never appears."""
    marker = tmp_path / "pwned"

    class Bomb:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    frame = pickle.dumps(Bomb())
    with socket.create_connection(endpoint.address, timeout=5) as sock:
        sock.sendall(struct.pack("!I", len(frame)) + frame)
        _wait_for(lambda: endpoint.server.rejected >= 1)
    time.sleep(0.1)
    assert not marker.exists()
    assert endpoint.accepted.empty()


class _FlippingProxy:
    """Relays client ↔ server; flips one bit of the first client→server chunk sent after
    ``arm()`` (a man in the middle tampering with a frame)."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.armed = threading.Event()
        self.flipped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self):
        self.armed.set()

    def _accept(self):
        client, _ = self.listener.accept()
        upstream = socket.create_connection(self.target)
        threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src, dst, tamper):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if tamper and self.armed.is_set() and not self.flipped.is_set():
                    data = bytearray(data)
                    data[len(data) // 2] ^= 0x01
                    data = bytes(data)
                    self.flipped.set()
                dst.sendall(data)
        except OSError:
            return


@pytest.mark.parametrize("encrypted", [True, False], ids=["tls", "plain-control"])
def test_a_flipped_byte_is_detected_only_with_tls(material, encrypted):
    """With TLS the receiver refuses the tampered frame (the connection breaks, nothing is
    delivered). The plain control shows the same flip goes through undetected without it —
    which is why encryption is on by default between hosts."""
    tls = material if encrypted else None
    ep = _Endpoint(tls)
    proxy = _FlippingProxy(ep.address)
    try:
        client = wire.connect(proxy.address, KEY, {}, tls=tls)
        server = ep.accepted.get(timeout=5)
        payload = bytes(64_000)
        proxy.arm()
        client.send(("B", payload))
        assert proxy.flipped.wait(5), "the proxy never tampered"
        if encrypted:
            with pytest.raises((ConnectionClosed, ssl.SSLError, OSError)):
                server.recv_bytes()
        else:
            received = server.recv_bytes()
            assert received != wire.encode(("B", payload)), "control: the flip should reach a plain receiver"
        client.close()
    finally:
        ep.close()


def test_unauthenticated_flood_is_bounded_and_real_peers_still_connect(material):
    """300 sockets that never speak: the server keeps at most ``max_pending`` handshakes
    (threads) and evicts the oldest, so a real peer connecting during the flood succeeds."""
    ep = _Endpoint(material, max_pending=16)
    idle = []
    try:
        before = threading.active_count()
        for _ in range(300):
            idle.append(socket.create_connection(ep.address, timeout=5))
        _wait_for(lambda: ep.server.evicted >= 300 - 16, timeout=10)
        assert ep.server.pending <= 16
        assert threading.active_count() - before <= 16 + 4
        t0 = time.monotonic()
        client = wire.connect(ep.address, KEY, {"real": True}, tls=material)
        assert ep.accepted.get(timeout=5).peer_hello == {"real": True}
        assert time.monotonic() - t0 < 5
        client.close()
    finally:
        for s in idle:
            s.close()
        ep.close()


def test_concurrent_reader_and_writers_on_one_tls_connection(endpoint, material):
    """One thread reads while two others write on the same connection (credits and data,
    as channels do): every frame arrives intact and in per-writer order."""
    client = wire.connect(endpoint.address, KEY, {}, tls=material)
    server = endpoint.accepted.get(timeout=5)
    n = 2000
    got = []

    def read():
        for _ in range(2 * n):
            got.append(server.recv())

    def write(tag):
        for i in range(n):
            client.send((tag, i, os.urandom(200)))

    def echo():  # the server writes while the client's writers write
        for i in range(n):
            server.send(("C", i))

    threads = [threading.Thread(target=f, args=a) for f, a in ((read, ()), (write, ("x",)), (write, ("y",)),
                                                                (echo, ()))]
    for th in threads:
        th.start()
    credits = [client.recv() for _ in range(n)]
    for th in threads:
        th.join(30)
    assert [c[1] for c in credits] == list(range(n))
    for tag in "xy":
        assert [m[1] for m in got if m[0] == tag] == list(range(n))
    client.close()
    server.close()


def _wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("timed out waiting for a condition")
