"""A peer host that stops answering (epochal.runtime.transport.wire ``peer_timeout``).

A real silent loss, not a simulation: the peer is a process in its own network namespace,
joined to this one by a veth pair; the test pulls the cable (``ip link set … down``), so
no process dies and no packet says goodbye. The connection must then break with
:class:`~epochal.runtime.transport.wire.PeerLost` naming the peer within about ``peer_timeout`` —
whether it is idle (keepalive) or sending (``TCP_USER_TIMEOUT``) — while an idle but
healthy peer keeps its connection for many timeouts. Skipped, with the reason, where
namespaces cannot be created (CI runs as root and creates them).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from epochal.runtime.transport import wire

from standalone import cannot_create_hosts

SECRET = b"\x02" * 32
KEY = wire.derive_key(SECRET, "job", 0)
TIMEOUT = 2.0
CLIENT = textwrap.dedent("""
    import sys, time
    from epochal.runtime.transport import wire
    host, port, key = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
    conn = wire.connect((host, port), key, {"who": "peer"}, peer_timeout=float(sys.argv[4]))
    print("connected", flush=True)
    time.sleep(3600)
""")

why = cannot_create_hosts()
pytestmark = pytest.mark.skipif(why is not None and "Java" not in why, reason=why or "")


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def peer_host():
    """A namespace on a veth pair: ``(near address, far address, namespace, near link)``."""
    tag = uuid.uuid4().hex[:6]
    ns, near = f"eppt{tag}", f"eppt{tag}v"
    subnet = 200 + int(tag, 16) % 50
    here, there = f"10.78.{subnet}.1", f"10.78.{subnet}.2"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", near, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("addr", "add", f"{here}/24", "dev", near)
        _ip("link", "set", near, "up")
        _ip("-n", ns, "addr", "add", f"{there}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        yield here, there, ns, near
    finally:
        subprocess.run(["ip", "netns", "pids", ns], capture_output=True)
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            subprocess.run(["kill", "-9", pid])
        subprocess.run(["ip", "link", "del", near], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _connected_peer(peer_host):
    """A wire.Server here with peer_timeout; a client in the namespace connects to it.
    Returns (our end of the connection, the client process)."""
    here, _, ns, _ = peer_host
    got: list = []
    server = wire.Server(KEY, got.append, host=here, peer_timeout=TIMEOUT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, here, str(server.address[1]),
                             KEY.hex(), str(TIMEOUT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    deadline = time.monotonic() + 30
    while not got:
        assert proc.poll() is None, f"the peer died: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "the peer never connected"
        time.sleep(0.02)
    server.close()
    return got[0], proc


def _broken_within(action, limit: float):
    """Run ``action`` in a thread until it raises; return (exception, seconds)."""
    box: list = []
    t0 = time.monotonic()

    def run():
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - what the test inspects
            box.append((exc, time.monotonic() - t0))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert box, f"the connection did not break within {limit} s"
    return box[0]


def test_an_idle_connection_to_a_host_that_vanished_breaks_naming_it(peer_host):
    conn, proc = _connected_peer(peer_host)
    _, there, _, near = peer_host
    _ip("link", "set", near, "down")  # the cable, pulled: nothing reaches the peer, no reset comes back
    exc, took = _broken_within(conn.recv, 6 * TIMEOUT)
    assert isinstance(exc, wire.PeerLost) and isinstance(exc, OSError), repr(exc)
    assert there in str(exc) and "stopped answering" in str(exc) and "cluster.peer_timeout" in str(exc)
    assert took <= 2.5 * TIMEOUT, f"detected after {took:.1f} s with peer_timeout={TIMEOUT}"
    assert proc.poll() is None, "the peer process must still be alive: the loss was silent"
    proc.kill()


def test_a_sender_to_a_host_that_vanished_breaks_naming_it(peer_host):
    conn, proc = _connected_peer(peer_host)
    _, there, _, near = peer_host
    _ip("link", "set", near, "down")
    payload = b"x" * 4096

    def send_forever():
        while True:
            conn.send_bytes(payload)
            time.sleep(0.01)

    exc, took = _broken_within(send_forever, 6 * TIMEOUT)
    assert isinstance(exc, wire.PeerLost), repr(exc)
    assert there in str(exc), str(exc)
    assert took <= 2.5 * TIMEOUT, f"detected after {took:.1f} s with peer_timeout={TIMEOUT}"
    proc.kill()


def test_a_healthy_idle_peer_keeps_its_connection(peer_host):
    """Keepalive probes are answered by the peer's kernel: silence alone is no loss."""
    conn, proc = _connected_peer(peer_host)
    box: list = []
    reader = threading.Thread(target=lambda: box.append(_safe(conn.recv)), daemon=True)
    reader.start()
    reader.join(4 * TIMEOUT)
    assert reader.is_alive() and not box, f"an idle healthy connection broke: {box}"
    conn.send(("still", "here"))  # and it still carries frames
    conn.close()
    proc.kill()


def _safe(fn):
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
