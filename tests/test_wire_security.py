"""The connection layer (epochal.runtime.transport.wire): mutual HMAC handshake, generation fencing,
nothing unpickled before authentication, FIFO framing, and concurrent handshakes.

Everything runs in-process on 127.0.0.1 with raw sockets playing the attacker.
"""
from __future__ import annotations

import hmac
import json
import os
import pickle
import queue
import socket
import struct
import threading
import time

import pytest

from epochal.errors import EpochalError
from epochal.runtime.transport import wire
from epochal.runtime.transport.wire import AuthenticationError, ConnectionClosed

SECRET = b"\x01" * 32
KEY = wire.derive_key(SECRET, "job", 0)
GREETING = len(wire.MAGIC) + wire.NONCE


def _wait_for(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class _Endpoint:
    """A wire.Server plus the connections its on_connection received."""

    def __init__(self, key=KEY):
        self.accepted: queue.Queue = queue.Queue()
        self.server = wire.Server(key, self.accepted.put, name="test")
        self.address = self.server.address

    def next(self, timeout=5.0) -> wire.Connection:
        return self.accepted.get(timeout=timeout)

    def assert_nothing_accepted(self, settle=0.1):
        time.sleep(settle)
        assert self.accepted.empty(), "on_connection was called for an unauthenticated peer"

    def wait_rejected(self, n, timeout=5.0):
        _wait_for(lambda: self.server.rejected >= n, timeout, f"{n} rejection(s), have {self.server.rejected}")

    def close(self):
        self.server.close()
        while not self.accepted.empty():
            self.accepted.get_nowait().close()


@pytest.fixture
def endpoint():
    ep = _Endpoint()
    yield ep
    ep.close()


def _raw(address, timeout=5.0) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout)
    sock.settimeout(timeout)
    return sock


def _read_greeting(sock) -> bytes:
    head = wire._recv_exact(sock, GREETING)
    assert head[: len(wire.MAGIC)] == wire.MAGIC
    return head[len(wire.MAGIC):]


def _closed_by_server(sock, timeout=5.0) -> bool:
    """True once the server closed ``sock`` (EOF or reset)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    return True


# --------------------------------------------------------------------------- keys

def test_keys_differ_per_job_generation_and_secret():
    keys = {
        "base": wire.derive_key(SECRET, "job", 0),
        "gen1": wire.derive_key(SECRET, "job", 1),
        "gen10": wire.derive_key(SECRET, "job", 10),
        "job1": wire.derive_key(SECRET, "job1", 0),
        "other-job": wire.derive_key(SECRET, "other", 0),
        "other-secret": wire.derive_key(b"\x02" * 32, "job", 0),
    }
    assert len(set(keys.values())) == len(keys)
    assert all(len(k) == 32 for k in keys.values())
    assert wire.derive_key(SECRET, "job", 0) == keys["base"]  # deterministic: every task derives the same


@pytest.mark.parametrize("client_key, server_key", [
    (wire.derive_key(SECRET, "job", 0), wire.derive_key(SECRET, "job", 1)),  # zombie of an older generation
    (wire.derive_key(SECRET, "job", 1), wire.derive_key(SECRET, "job", 0)),  # older server, newer client
    (wire.derive_key(SECRET, "a", 0), wire.derive_key(SECRET, "b", 0)),  # another job
    (wire.derive_key(b"\x02" * 32, "job", 0), wire.derive_key(SECRET, "job", 0)),  # another run's secret
], ids=["zombie-older-generation", "stale-server", "other-job", "other-secret"])
def test_generation_and_job_fencing(client_key, server_key):
    ep = _Endpoint(server_key)
    try:
        with pytest.raises(EpochalError):
            wire.connect(ep.address, client_key, {"task": "zombie[0]"})
        ep.wait_rejected(1)
        ep.assert_nothing_accepted()
        # the right generation still gets in
        conn = wire.connect(ep.address, server_key, {"task": "t[0]"})
        peer = ep.next()
        assert peer.peer_hello == {"task": "t[0]"}
        conn.send(("ping", 1))
        assert peer.recv() == ("ping", 1)
        conn.close()
        assert ep.server.rejected == 1
    finally:
        ep.close()


# --------------------------------------------------------------------------- wrong key

def test_wrong_key_is_rejected(endpoint):
    wrong = wire.derive_key(SECRET, "job", 1)
    with pytest.raises((AuthenticationError, ConnectionClosed)):
        wire.connect(endpoint.address, wrong, {"task": "x"})
    endpoint.wait_rejected(1)
    endpoint.assert_nothing_accepted()


def test_wrong_key_raises_authentication_error_on_client(endpoint):
    with pytest.raises(AuthenticationError):
        wire.connect(endpoint.address, wire.derive_key(SECRET, "job", 1), {"task": "x"})


def test_client_rejects_server_without_the_key():
    """Mutual authentication: an impostor server cannot produce the proof."""
    impostor = socket.create_server(("127.0.0.1", 0))
    received = {}

    def serve():
        sock, _ = impostor.accept()
        with sock:
            sock.sendall(wire.MAGIC + os.urandom(wire.NONCE))
            received["client"] = wire._recv_exact(sock, wire.NONCE + wire.MAC + 4)
            (n,) = struct.unpack("!I", received["client"][-4:])
            received["hello"] = wire._recv_exact(sock, n)
            sock.sendall(os.urandom(wire.MAC))  # a guess at the proof
            time.sleep(0.5)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(AuthenticationError, match="server failed authentication"):
            wire.connect(impostor.getsockname(), KEY, {"task": "t"})
        assert json.loads(received["hello"]) == {"task": "t"}  # only JSON left the client
    finally:
        impostor.close()
        t.join(2)


def test_client_rejects_non_epochal_endpoint():
    other = socket.create_server(("127.0.0.1", 0))

    def serve():
        sock, _ = other.accept()
        with sock:
            sock.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" + b" " * 64)
            time.sleep(0.5)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(AuthenticationError, match="not an epochal endpoint"):
            wire.connect(other.getsockname(), KEY, {})
    finally:
        other.close()
        t.join(2)


def test_replayed_handshake_is_rejected(endpoint):
    """Bytes of a valid handshake are bound to the server's fresh nonce: replaying them fails."""
    sock = _raw(endpoint.address)
    server_nonce = _read_greeting(sock)
    client_nonce = os.urandom(wire.NONCE)
    hello = json.dumps({"task": "t"}).encode()
    recorded = client_nonce + wire._mac(KEY, b"client", server_nonce, client_nonce, hello) \
        + struct.pack("!I", len(hello)) + hello
    sock.sendall(recorded)
    proof = wire._recv_exact(sock, wire.MAC)
    assert hmac.compare_digest(proof, wire._mac(KEY, b"server", client_nonce, server_nonce))
    endpoint.next().close()
    sock.close()

    replay = _raw(endpoint.address)
    _read_greeting(replay)
    replay.sendall(recorded)
    assert _closed_by_server(replay)
    replay.close()
    endpoint.wait_rejected(1)
    endpoint.assert_nothing_accepted()


# --------------------------------------------------------------------------- nothing unpickled

class _Bomb:
    """Unpickling this creates ``path`` (in whatever process unpickles it)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _bomb(path, pad=0) -> bytes:
    return pickle.dumps([_Bomb(str(path)), "p" * pad], protocol=5)


def test_bomb_probe_works(tmp_path):
    """Sanity check of the probe used below: unpickling really creates the marker."""
    marker = tmp_path / "sanity"
    pickle.loads(_bomb(marker))[0].close()
    assert marker.exists()


def _attacks(marker):
    bomb, big_bomb = _bomb(marker), _bomb(marker, pad=20_000)
    frame = struct.pack("!I", len(bomb)) + bomb
    return {
        # before even reading the greeting
        "pickle-at-once": (False, big_bomb),
        "framed-pickle-at-once": (False, frame),
        "garbage": (False, os.urandom(10_000)),
        # after the greeting, shaped like the protocol
        "framed-pickle-after-greeting": (True, frame),
        "pickle-as-hello": (True, os.urandom(wire.NONCE + wire.MAC) + frame),
        "pickle-as-huge-hello": (True, os.urandom(wire.NONCE + wire.MAC) + struct.pack("!I", 10_000) + big_bomb),
        "pickle-after-bad-mac": (True, os.urandom(wire.NONCE + wire.MAC) + struct.pack("!I", 2) + b"{}" + frame * 4),
    }


@pytest.mark.parametrize("attack", list(_attacks("x")))
def test_unauthenticated_bytes_are_never_unpickled(attack, endpoint, tmp_path):
    marker = tmp_path / f"unpickled-{attack}"
    greet, payload = _attacks(marker)[attack]
    sock = _raw(endpoint.address)
    try:
        if greet:
            _read_greeting(sock)
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)  # no more bytes: a short payload ends in EOF
        except OSError:
            pass  # the server may already have dropped us
        assert _closed_by_server(sock)
    finally:
        sock.close()
    endpoint.wait_rejected(1)
    endpoint.assert_nothing_accepted()
    assert not marker.exists(), "the server unpickled bytes from an unauthenticated peer"
    # the server is still healthy
    conn = wire.connect(endpoint.address, KEY, {"task": "after"})
    assert endpoint.next().peer_hello == {"task": "after"}
    conn.close()


# --------------------------------------------------------------------------- hello size

def _hello_of_size(n: int) -> dict:
    hello = {"x": "a" * (n - 9)}
    assert len(json.dumps(hello).encode()) == n
    return hello


def test_hello_at_limit_is_accepted(endpoint):
    conn = wire.connect(endpoint.address, KEY, _hello_of_size(4096))
    assert len(endpoint.next().peer_hello["x"]) == 4096 - 9
    conn.close()
    assert endpoint.server.rejected == 0


@pytest.mark.parametrize("size", [4097, 100_000])
def test_hello_over_limit_is_rejected(size, endpoint):
    with pytest.raises((EpochalError, OSError)):
        wire.connect(endpoint.address, KEY, _hello_of_size(size))
    endpoint.wait_rejected(1)
    endpoint.assert_nothing_accepted()


# --------------------------------------------------------------------------- framing

def test_authenticated_pair_exchanges_messages_in_fifo_order(endpoint):
    client = wire.connect(endpoint.address, KEY, {"task": "t"})
    server = endpoint.next()
    big = os.urandom(200_000)  # exercises the two-syscall path for large frames
    messages = [("m", i, big if i % 97 == 0 else i) for i in range(2000)]

    def send_all():
        for m in messages:
            client.send(m)

    t = threading.Thread(target=send_all)
    t.start()
    got = [server.recv() for _ in messages]
    t.join(10)
    assert got == messages
    # and back, interleaved with raw byte frames
    for i in range(100):
        server.send(("reply", i))
    assert [client.recv() for _ in range(100)] == [("reply", i) for i in range(100)]
    client.send_bytes(b"")
    client.send(None)
    assert server.recv_bytes() == b"" and server.recv() is None
    client.close()
    with pytest.raises(ConnectionClosed):
        server.recv()
    server.close()


def test_concurrent_senders_never_interleave_frames(endpoint):
    client = wire.connect(endpoint.address, KEY, {"task": "t"})
    server = endpoint.next()
    per_thread, threads = 300, 4
    blob = b"z" * 70_000

    def sender(k):
        for i in range(per_thread):
            client.send((k, i, blob if i % 50 == 0 else b""))

    ts = [threading.Thread(target=sender, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    last = {k: -1 for k in range(threads)}
    for _ in range(per_thread * threads):
        k, i, payload = server.recv()
        assert i == last[k] + 1, "per-sender FIFO order broken"
        assert payload in (b"", blob)
        last[k] = i
    for t in ts:
        t.join(10)
    assert all(v == per_thread - 1 for v in last.values())
    client.close()
    server.close()


def test_frame_over_limit_is_refused(endpoint):
    client = wire.connect(endpoint.address, KEY, {})
    server = endpoint.next()
    client.sock.sendall(struct.pack("!I", wire.MAX_FRAME + 1))
    with pytest.raises(ConnectionClosed, match="exceeds"):
        server.recv_bytes()
    client.close()
    server.close()


# --------------------------------------------------------------------------- concurrency

def test_silent_peers_do_not_block_other_clients(endpoint):
    silent = [_raw(endpoint.address) for _ in range(8)]  # connect, send nothing
    try:
        t0 = time.monotonic()
        conns = [wire.connect(endpoint.address, KEY, {"task": f"t{i}"}, timeout=3) for i in range(3)]
        hellos = sorted(endpoint.next(timeout=3).peer_hello["task"] for _ in conns)
        assert hellos == ["t0", "t1", "t2"]
        assert time.monotonic() - t0 < 3.0
        for c in conns:
            c.close()
        assert endpoint.server.rejected == 0
    finally:
        for s in silent:
            s.close()


def test_slow_handshakes_run_concurrently(endpoint):
    """A peer stuck half-way through its handshake does not delay a good one."""
    stuck = _raw(endpoint.address)
    try:
        _read_greeting(stuck)
        stuck.sendall(os.urandom(wire.NONCE))  # then stalls before the MAC
        conn = wire.connect(endpoint.address, KEY, {"task": "fast"}, timeout=3)
        assert endpoint.next(timeout=3).peer_hello == {"task": "fast"}
        conn.close()
    finally:
        stuck.close()


def test_silent_peer_is_dropped_after_handshake_timeout(monkeypatch):
    monkeypatch.setattr(wire.accept_handshake, "__defaults__", (0.3, None, None))
    ep = _Endpoint()
    try:
        sock = _raw(ep.address)
        t0 = time.monotonic()
        _read_greeting(sock)
        assert _closed_by_server(sock, timeout=5)
        assert time.monotonic() - t0 < 3
        sock.close()
        ep.wait_rejected(1)
        ep.assert_nothing_accepted()
    finally:
        ep.close()


def test_dripping_peer_is_dropped_after_handshake_deadline(monkeypatch):
    monkeypatch.setattr(wire.accept_handshake, "__defaults__", (0.3, None, None))
    ep = _Endpoint()
    sock = _raw(ep.address)
    try:
        _read_greeting(sock)
        t0 = time.monotonic()
        dropped = False
        while time.monotonic() - t0 < 1.5 and not dropped:  # 5x the handshake timeout
            try:
                sock.sendall(b"\x00")
            except OSError:
                dropped = True
                break
            sock.settimeout(0.15)
            try:
                dropped = sock.recv(1) == b""
            except socket.timeout:
                pass
            except OSError:
                dropped = True
        assert dropped, "a dripping peer kept its handshake open past several handshake timeouts"
    finally:
        sock.close()
        ep.close()


def test_closed_server_never_hands_on(endpoint):
    time.sleep(0.05)  # the accept thread is blocked in accept()
    endpoint.server.close()
    try:
        conn = wire.connect(endpoint.address, KEY, {}, timeout=1)
    except (OSError, EpochalError):
        pass
    else:  # see the xfail below: the handshake may still complete, but the peer is dropped
        with pytest.raises(ConnectionClosed):
            conn.recv()
        conn.close()
    endpoint.assert_nothing_accepted()


def test_closed_server_stops_listening():
    ep = _Endpoint()
    try:
        time.sleep(0.05)  # the accept thread is blocked in accept()
        ep.server.close()
        with pytest.raises(OSError):
            wire.connect(ep.address, KEY, {}, timeout=1)
        ep.server._thread.join(1)
        assert not ep.server._thread.is_alive()
    finally:
        ep.close()
