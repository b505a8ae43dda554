"""The coordinator's control messages are data (issue 51): after a valid handshake with the
attempt key, the coordinator reads only data-only tagged JSON (:data:`wire.CONTROL`) — a
pickle whose ``__reduce__`` would create a marker directory is refused unread, and the
marker never appears; an ordinary task's hello still gets its ``start``.

The oracle is the file system (the marker exists iff code ran) and the message itself (what
the task receives equals what the coordinator sent). Each test failed with the coordinator
serving pickles (``codec=wire.CONTROL`` removed from its server): the marker appeared.
"""
from __future__ import annotations

import json
import pickle
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import epochal as ep
from epochal.backends.storage import CheckpointStorage
from epochal.config import CheckpointConfig
from epochal.runtime.driver.coordinator_server import CoordinatorServer
from epochal.runtime.transport import tagged_json, wire
from planted import Plant

KEY = wire.derive_key(b"s" * 32, "control", 1)


@pytest.fixture
def coordinator(tmp_path):
    flow = ep.Dataflow("control")
    flow.source("src", ep.sources.CollectionSource([1, 2, 3]), parallelism=2).rebalance().sink(
        "out", ep.sinks.FileSink(str(tmp_path / "out")))  # channels: the sources send to the sinks
    plan = flow.plan()
    storage = CheckpointStorage(f"file://{tmp_path / 'ckpt'}", "control")
    server = CoordinatorServer(plan, 1, KEY, storage, CheckpointConfig(interval=None), None, 1, "127.0.0.1",
                               lambda m: None, startup_timeout=60)
    try:
        yield server, plan
    finally:
        server.fail("test over")
        server.wait(10)
        server.close()


def _refused(conn: wire.Connection) -> bool:
    """Whether the coordinator stopped reading ``conn``: it drops it (a bad hello), or it
    counts the task lost and cancels the attempt (a bad frame after the hello)."""
    conn.sock.settimeout(20)
    try:
        msg = conn.recv()
    except (wire.ConnectionClosed, OSError):
        return True
    return msg[0] == "cancel" and "disconnected" in msg[1]


@pytest.mark.parametrize("when", ["as the hello", "after the hello"])
def test_a_pickle_after_a_valid_handshake_to_the_coordinator_runs_nothing(coordinator, tmp_path, when):
    server, plan = coordinator
    marker = tmp_path / "marker"
    conn = wire.connect(server.address, KEY, {"task": plan.tasks[0].id}, codec=wire.CONTROL)
    if when == "after the hello":
        conn.send(("hello", plan.tasks[0].id, None))
    conn.send_bytes(pickle.dumps(Plant(str(marker))))  # the fault, injected after a valid handshake
    assert _refused(conn), "the coordinator kept reading a connection that sent a pickle"
    time.sleep(0.2)  # a thread that unpickled it would have run by now; the check below is the test
    assert not marker.exists(), "the coordinator unpickled a task's frame: code ran"
    conn.close()


def test_control_messages_still_reach_the_task_as_data(coordinator):
    """Every task says hello (as data): each gets ("start", addresses, restore) — the
    addresses the tasks it sends to said hello with (the oracle: its output gates' channels in
    the plan), and no restore (a fresh start)."""
    server, plan = coordinator
    conns = []
    said = {spec.id: ("127.0.0.1", 40000 + i) for i, spec in enumerate(plan.tasks)}
    for spec in plan.tasks:
        conn = wire.connect(server.address, KEY, {"task": spec.id}, codec=wire.CONTROL)
        conn.send(("hello", spec.id, said[spec.id]))
        conns.append(conn)
    sent_some = False
    for spec, conn in zip(plan.tasks, conns):
        conn.sock.settimeout(20)
        start = conn.recv()
        consumers = {plan.channels[c].consumer for gate in spec.outputs for c in gate.channels}
        assert start == ("start", {t: said[t] for t in consumers}, None)
        assert all(type(a) is tuple for a in start[1].values())  # tuples stay tuples
        sent_some = sent_some or bool(start[1])
        conn.close()
    assert sent_some  # some task sends to another: the addresses went through the codec


def test_the_control_codec_refuses_what_is_not_data():
    codec = wire.CONTROL
    for value in [("ack", 3, {"task": "t", "handle": {"path": "p", "size": 1}, "shared": []}),
                  {"$weird": 1, 2: (1, 2)}, {"a": {"$t": 1}}, [b"x", float("inf"), {1, 2}, frozenset({3})], ()]:
        assert codec.loads(codec.dumps(value)) == value
    for payload in [pickle.dumps(("ack", 1, {})), b'{"$t": 1}', b'{"$x": []}', b'{"$d": [[[1], 2]]}',
                    b'{"a": 1, "$t": []}', b"[" * 100000, b"NaN"]:
        with pytest.raises(tagged_json.NotData):
            codec.loads(payload)
    with pytest.raises(tagged_json.NotData, match="object"):
        codec.dumps(("ack", object()))


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6) | st.binary(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.frozensets(st.integers(), max_size=3)
    | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=3), max_leaves=15)


@settings(max_examples=80, deadline=None, database=None)
@given(value=_VALUES)
def test_the_control_codec_round_trips_data(value):
    """Oracle: the value itself (a dict's keys may be any str, '$…' too, or ints)."""
    assert wire.CONTROL.loads(wire.CONTROL.dumps(value)) == value


@settings(max_examples=80, deadline=None, database=None)
@given(payload=st.binary(max_size=64) | _VALUES.map(lambda v: json.dumps(tagged_json.encode(v)).encode()))
def test_the_control_decoder_refuses_or_builds_data_only(payload):
    """Arbitrary bytes, and the other tagged-JSON dialect, decode to data or raise NotData — nothing else."""
    try:
        value = wire.CONTROL.loads(payload)
    except tagged_json.NotData:
        return
    assert wire.CONTROL.loads(wire.CONTROL.dumps(value)) == value
