"""The query token lets its holder read, nothing more (issue 51): after a valid handshake,
the driver's query directory and a task's query server read only data-only tagged JSON
(:mod:`epochal.runtime.transport.tagged_json`) — a pickle whose ``__reduce__`` would create a
marker file is refused and the marker never appears; the client unpickles nothing unless it
opted in. The codec itself round-trips every supported type (Hypothesis, against the value
itself as oracle) and refuses arbitrary bytes with :class:`NotData` only.
"""
from __future__ import annotations

import math
import pickle
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochal.query import QueryClient
from epochal.query.protocol import CODEC, QueryError, query_key
from epochal.query.readers import ValueReader
from epochal.query.server import QueryServer
from epochal.query.versions import CommittedVersions
from epochal.runtime.driver.query_directory import QueryDirectory
from epochal.runtime.transport import tagged_json, wire
from planted import Plant

TOKEN = "data-only-test"
KEY = query_key(TOKEN)


@dataclass(frozen=True)
class Account:
    owner: str


def _routes(port: int):
    return lambda: {"generation": 0, "max_parallelism": 4, "expected": {"op": 1},
                    "operators": {"op": [("t", 0, 4, ("127.0.0.1", port))]}}


class _LiveState:
    """A live backend stand-in for ``live_read``: plain dict of values by key."""

    def __init__(self, values: dict):
        self.values = values

    def __call__(self, name, items):  # the task's live_read: pickled values of its own state
        return pickle.dumps([self.values.get(key) for _kg, key in items])


@pytest.fixture
def endpoints():
    live = _LiveState({"a": 10, ("t", 1): {"nested": [1.5, b"x", None]}, "obj": Account("x")})
    server = QueryServer(KEY, "127.0.0.1", "t", range(0, 4), {"op/v": ValueReader("op/v")}, CommittedVersions(), live)
    directory = QueryDirectory(KEY, "127.0.0.1", _routes(server.address[1]))
    try:
        yield directory, server
    finally:
        directory.close()
        server.close()


@pytest.mark.parametrize("target", ["directory", "server"])
def test_a_pickle_after_a_valid_handshake_is_refused_and_runs_nothing(endpoints, tmp_path, target):
    directory, server = endpoints
    marker = tmp_path / "marker"
    address = directory.address if target == "directory" else server.address
    conn = wire.connect(tuple(address), KEY, {"query": "attacker"})
    try:
        conn.send_bytes(pickle.dumps(Plant(str(marker))))  # the fault, injected after a valid handshake
        raw = conn.recv_bytes()
        assert not marker.exists(), "the query endpoint unpickled a client's frame: code ran"
        reply = tagged_json.loads(raw)
        assert reply[0] == "error" and "not data-only" in reply[2], reply
        # the same connection still answers a proper request: it was refused, not crashed
        proper = ("routes",) if target == "directory" else ("get", 1, "op", "v", [(0, "a")], "read-uncommitted", None)
        conn.send_bytes(tagged_json.dumps(proper))
        assert tagged_json.loads(conn.recv_bytes())[0] in ("routes", "ok")
    finally:
        conn.close()
    assert not marker.exists(), "the query endpoint unpickled a client's frame: code ran"
    # the oracle: the same payload does run code when unpickled, so the check above means something
    pickle.loads(pickle.dumps(Plant(str(tmp_path / "control"))))
    assert (tmp_path / "control").exists()


def test_the_client_reads_data_values_and_opts_into_pickled_ones(endpoints):
    directory, _server = endpoints
    with QueryClient(directory.address, TOKEN, timeout=20) as client:
        got = client.query("op", "v", ["a", ("t", 1), "missing"], isolation="read-uncommitted")
        assert got.values == {"a": 10, ("t", 1): {"nested": [1.5, b"x", None]}, "missing": None}
        with pytest.raises(QueryError, match="Account has no data-only encoding.*pickled_values=True"):
            client.query("op", "v", "obj", isolation="read-uncommitted")
        with pytest.raises(QueryError, match="keys travel as data only"):
            client.query("op", "v", Account("k"), isolation="read-uncommitted")
    with QueryClient(directory.address, TOKEN, timeout=20, pickled_values=True) as client:
        assert client.query("op", "v", "obj", isolation="read-uncommitted").value == Account("x")


def test_a_client_unpickles_no_answer_of_a_hostile_endpoint(tmp_path):
    """A 'query directory' that answers with a pickle: the client refuses it, runs nothing."""
    marker = tmp_path / "marker"

    class Hostile(wire.Answering):
        def _answer_data(self, payload):
            return pickle.dumps(("routes", Plant(str(marker))))

    answering = Hostile(lambda request: None, codec=CODEC)
    server = wire.Server(KEY, answering.serve, name="hostile")
    try:
        with pytest.raises(QueryError):
            QueryClient(server.address, TOKEN, timeout=2).query("op", "v", "a")
    finally:
        server.close()
        answering.close()
    assert not marker.exists()


_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(st.integers() | st.text() | st.tuples(st.text()), inner, max_size=4)
                   | st.frozensets(st.integers() | st.text(), max_size=4)),
    max_leaves=20)


def _same(a, b) -> bool:
    """Equal with types, NaN equal to NaN (the oracle: the value that was encoded)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (math.isnan(a) and math.isnan(b)) or a == b
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=300, deadline=None)
@given(_data)
def test_tagged_json_round_trips_every_supported_value(value):
    assert _same(tagged_json.loads(tagged_json.dumps(value)), value)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_tagged_json_refuses_arbitrary_bytes_with_not_data_only(payload):
    try:
        tagged_json.loads(payload)
    except tagged_json.NotData:
        pass


def test_tagged_json_refuses_a_pickle_and_deep_nesting():
    with pytest.raises(tagged_json.NotData):
        tagged_json.loads(pickle.dumps(("routes",)))
    with pytest.raises(tagged_json.NotData):
        tagged_json.loads(b"[" * 100000 + b"]" * 100000)
    with pytest.raises(tagged_json.NotData, match="unhashable"):
        tagged_json.loads(b'{"$d":[[[1],2]]}')


def test_windows_travel_by_name_and_unknown_names_are_refused():
    from epochal.windows.functions import Window

    value = {Window(10.0, 20.0): 3}
    back = CODEC.loads(CODEC.dumps(value))
    assert back == value and type(next(iter(back))) is Window
    with pytest.raises(tagged_json.NotData, match="not a data type"):
        CODEC.loads(b'{"$n":["os.system",["true"]]}')


def test_one_lookup_may_opt_into_pickled_values(endpoints):
    directory, _server = endpoints
    with QueryClient(directory.address, TOKEN, timeout=20) as client:
        assert client.query("op", "v", "obj", isolation="read-uncommitted", pickled_values=True).value == Account("x")
        with pytest.raises(QueryError, match="no data-only encoding"):  # the client's default again
            client.query("op", "v", "obj", isolation="read-uncommitted")
