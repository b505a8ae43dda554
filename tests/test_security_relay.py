"""The relay hub lets each connection do only what its attempt and hello allow (issue 51):

* after a valid handshake, a pickle whose ``__reduce__`` would create a marker directory is
  refused unread (the hub speaks data-only tagged JSON) and the marker never appears — nor
  does the hub unpickle a record, which crosses as the bytes its producer pickled;
* a connection proves a key derived from its region's *current* attempt key: a task of an
  older attempt (generation) is refused at the handshake;
* a connection is bound to the lanes and the role its hello named: a take from another
  lane, a put by a consumer, a request for another channel are refused; a lane's older
  generation is fenced once a newer one used it.

Oracles: the file system (the marker exists iff code ran) and plain lists of the records
put. Each test failed with its fix broken (the hub serving pickles; ``relay_key`` ignoring
the attempt key; ``refusal`` not checking the lanes): see the commit message.
"""
from __future__ import annotations

import os
import pickle
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal.regions.relay import RelayHub, RelaySink, RelaySource
from epochal.runtime.transport import credentials, wire
from epochal.runtime.transport.credentials import Credentials
from planted import Plant

CH = "p-c"
SECRET = {"P": b"p" * 32, "C": b"c" * 32}


def attempt_key(region: str, generation: int) -> bytes:
    return wire.derive_key(SECRET[region], "job", generation)


@pytest.fixture
def hub():
    """A hub whose producing region P runs attempt (generation) 2 and consuming region C generation 7."""
    hub = RelayHub()
    current = {"P": attempt_key("P", 2), "C": attempt_key("C", 7)}
    hub.current = current
    hub.endpoint(CH, "producer", "P")
    hub.endpoint(CH, "consumer", "C")
    for region in current:
        hub.admit(region, lambda r=region: current[r])
    try:
        yield hub
    finally:
        hub.close()


def producer(hub, generation=2, lanes=(0,)):
    return hub.endpoint(CH).connect("producer", list(lanes), Credentials(attempt_key("P", generation), generation))


def consumer(hub, generation=7, lanes=(0,)):
    return hub.endpoint(CH).connect("consumer", list(lanes), Credentials(attempt_key("C", generation), generation))


def test_a_pickle_after_a_valid_handshake_to_the_relay_runs_nothing(hub, tmp_path):
    marker = tmp_path / "marker"
    for conn in (consumer(hub), producer(hub)):
        conn.send_bytes(pickle.dumps(("take", CH, 0, 10, 0, Plant(str(marker)))))  # after a valid handshake
        reply = wire.CONTROL.loads(conn.recv_bytes())
        assert reply[0] == "error" and "not data-only" in reply[-1], reply
        assert not marker.exists(), "the relay hub unpickled a frame: code ran"
        conn.close()
    # a record is the bytes its producer pickled: the hub stores and hands them on unread
    ep, conn = hub.endpoint(CH), producer(hub)
    ep.ask(conn, "open", 0, 0, [], [])
    ep.ask(conn, "put", 0, [pickle.dumps(Plant(str(marker)))])
    assert hub.stats()[CH]["queued"] == 1
    assert not marker.exists(), "the relay hub unpickled a record"
    conn.close()


def test_a_connection_of_an_older_attempt_is_refused(hub):
    with pytest.raises(wire.AuthenticationError):
        producer(hub, generation=1)  # a zombie of the region's previous attempt
    with pytest.raises(wire.AuthenticationError):
        consumer(hub, generation=6)
    ep, conn = hub.endpoint(CH), producer(hub, generation=2)  # the current attempt is admitted
    ep.ask(conn, "open", 0, 0, [], [])
    conn.close()
    hub.current["P"] = attempt_key("P", 3)  # the region restarts as generation 3
    with pytest.raises(wire.AuthenticationError):
        producer(hub, generation=2)
    producer(hub, generation=3).close()


def test_a_connection_may_only_use_the_lanes_and_role_its_hello_named(hub):
    ep = hub.endpoint(CH)
    prod = producer(hub, lanes=[0])
    ep.ask(prod, "open", 0, 0, [], [])
    ep.ask(prod, "put", 0, [pickle.dumps("a")])
    other = producer(hub, lanes=[1])
    ep.ask(other, "open", 1, 0, [], [])
    ep.ask(other, "put", 1, [pickle.dumps("secret of lane 1")])
    reader = consumer(hub, lanes=[0])
    _, records, _, _ = ep.ask(reader, "take", 0, 10, 0, 0)
    assert [pickle.loads(r) for r in records] == ["a"]
    with pytest.raises(RuntimeError, match="lane 1 .* not bound"):
        ep.ask(reader, "take", 1, 10, 0, 0)  # the fault: a take from a lane this reader was not given
    with pytest.raises(RuntimeError, match="consumer of channel"):
        ep.ask(reader, "put", 0, [pickle.dumps("forged")])
    with pytest.raises(RuntimeError, match="producer of channel"):
        ep.ask(prod, "take", 0, 10, 0, 0)
    reader.send(("take", "another-channel", 0, 10, 0, 0))
    assert reader.recv()[0] == "error"
    assert hub.stats()[CH]["queued"] == 1  # lane 1's record is still there: nobody took it
    for conn in (prod, other, reader):
        conn.close()


def test_a_lanes_older_generation_is_fenced(hub):
    """A failover region relaunched as generation 4 (same attempt key): its zombie of
    generation 2 may no longer put into the lane the relaunch opened."""
    ep = hub.endpoint(CH)
    old = producer(hub, generation=2)
    ep.ask(old, "open", 0, 0, [], [])
    new = hub.endpoint(CH).connect("producer", [0], Credentials(attempt_key("P", 2), 4))
    ep.ask(new, "open", 0, 0, [], [])
    with pytest.raises(RuntimeError, match="superseded by generation 4"):
        ep.ask(old, "put", 0, [pickle.dumps("late")])
    old.close()
    new.close()


def test_records_cross_through_relay_sink_and_source(hub):
    """The task side: a relay sink and source created on a thread with bound credentials;
    what the reader polls equals what the writer wrote (the oracle: the list itself)."""
    records = ["a", ("t", 1), {"k": [1.5, None]}, b"\x00bytes", 10 ** 30]
    credentials.bind(hub.current["P"], 2)
    writer = RelaySink(hub.endpoint(CH)).create_writer(SimpleNamespace(subtask=0))
    writer.restore(None)
    writer.write_many(records[:3])
    writer.write_many(records[3:])
    writer.close()
    credentials.bind(hub.current["C"], 7)
    reader = RelaySource(hub.endpoint(CH), producers=1).create_reader([0], None)
    got, finished = [], False
    for _ in range(200):
        poll = reader.poll(2)
        got += poll.records
        if poll.finished:
            finished = True
            break
    reader.close()
    assert finished and got == records


def _frames(marker: str):
    """What a peer that passed the handshake may send: raw bytes, pickles that would create
    ``marker``, and tagged-JSON structures of any shape (some of them relay requests)."""
    data = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8),
                        lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                        | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=12)
    requests = st.tuples(st.sampled_from(["open", "put", "end", "take", "ack", "x"]),
                         st.sampled_from([CH, "other"]), st.integers(-1, 2)).flatmap(
        lambda head: st.lists(data, max_size=4).map(lambda rest: head + tuple(rest)))
    return st.one_of(st.binary(max_size=64), st.just(pickle.dumps(Plant(marker))),
                     (data | requests).map(wire.CONTROL.dumps))


def test_the_relay_hub_under_fuzzed_frames(hub, tmp_path):
    """Bounded fuzz (Hypothesis) of the hub's decoder after a valid handshake: every frame is
    answered, nothing runs (no marker), and the lane still works afterwards."""
    marker = str(tmp_path / "marker")
    conn = consumer(hub)
    conn.sock.settimeout(10)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(frame=_frames(marker))
    def one(frame):
        conn.send_bytes(frame)
        reply = wire.CONTROL.loads(conn.recv_bytes())  # an answer, never a dropped connection
        assert type(reply) is tuple and reply[0] in ("error", "ok", "records")
        assert not os.path.exists(marker), "a fuzzed frame ran code"

    one()
    ep, prod = hub.endpoint(CH), producer(hub)
    ep.ask(prod, "open", 0, 0, [], [])
    ep.ask(prod, "put", 0, [pickle.dumps("z")])
    _, records, _, _ = ep.ask(conn, "take", 0, 100, 0, 0)
    assert pickle.dumps("z") in records
    conn.close()
    prod.close()
