"""State TTL, without processes: the pure rules (epochal.ttl.expiry), the state handles and
the sweep on both backends against a plain-Python model, the restore change rules, and the
offline reader's view of a snapshot."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochal.backends.formats import decode_snapshot
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.errors import ConfigError
from epochal.time.units import MIN_TIME
from epochal.ttl import StateTtl
from epochal.ttl.cleanup import SweepCursor, Sweeper
from epochal.ttl.expiry import TtlChange, expired, next_stamp, ttl_change
from epochal.ttl.reading import KeyGroupTtl
from epochal.ttl.registry import TtlRegistry
from epochal.ttl.state import TtlMapState, TtlValueState

KGS = range(0, 8)
TTL_S = 10


class Cur:
    def __init__(self):
        self.key, self.kg, self.ts = None, -1, None


class Clock:
    def __init__(self):
        self.t = 1_000_000_000  # µs

    def __call__(self):
        return self.t

    def ns(self):  # the registry's wall clock: processing-time stamps are nanoseconds
        return self.t * 1000


def make(backend_kind: str):
    return HeapStateBackend(KGS, snapshot_mode="thread") if backend_kind == "heap" else RocksDBStateBackend(KGS)


def setup(backend, config, timed=False, watermark=None):
    cur, clock = Cur(), Clock()
    wm = watermark or (lambda: MIN_TIME)
    reg = TtlRegistry(backend, "op", KGS, cur, wm, timed, wall_clock_ns=clock.ns)
    reg.declare("v", "op/v", "value", config)
    reg.declare("m", "op/m", "map", config)
    return cur, clock, reg, TtlValueState(backend, "op/v", cur, None, config, reg), TtlMapState(backend, "op/m", cur, config, reg)


# ------------------------------------------------------------------------------ pure rules
def test_rules():
    assert expired(0, 10, 10) and not expired(0, 10, 9)
    assert next_stamp("processing", 50, 40) == 40          # wall clock: the update's time
    assert next_stamp("event", 50, 40) == 50               # an older event never shortens a life
    assert next_stamp("event", None, 40) == 40
    assert SweepCursor(2).take() == 0


def test_config_is_checked():
    with pytest.raises(ConfigError, match="StateTtl time"):
        StateTtl(5, time="ingestion")
    with pytest.raises(ConfigError, match="update"):
        StateTtl(5, update="read")
    with pytest.raises(ConfigError, match="> 0"):
        StateTtl(0)
    assert StateTtl.coerce("30s", "x") == StateTtl("30s")


@pytest.mark.parametrize("old,new,entries,change", [
    (None, None, True, TtlChange.UNCHANGED),
    (("processing", 5, "write"), ("processing", 5, "write"), True, TtlChange.UNCHANGED),
    (None, ("processing", 5, "write"), True, TtlChange.ENABLED),
    (None, ("processing", 5, "write"), False, TtlChange.UNCHANGED),
    (None, ("event", 5, "write"), True, TtlChange.ENABLED_EVENT),
    (("event", 5, "write"), None, True, TtlChange.DISABLED),
    (("event", 5, "write"), ("event", 9, "read_and_write"), True, TtlChange.RETUNED),
    (("event", 5, "write"), ("processing", 5, "write"), True, TtlChange.DOMAIN),
])
def test_restore_change_table(old, new, entries, change):
    assert ttl_change(old, new, entries) is change
    assert change.allowed == (change not in (TtlChange.DOMAIN, TtlChange.ENABLED_EVENT))


# ------------------------------------------------------- handles vs a plain-Python model
OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 5), st.integers(0, 99)),
    st.tuples(st.just("read"), st.integers(0, 5)),
    st.tuples(st.just("tick"), st.sampled_from([0, 1, 4_000_000, 9_999_999, 10_000_000, 15_000_000])),
    st.tuples(st.just("sweep"), st.integers(0, 50)),
), max_size=60)


@pytest.mark.parametrize("backend_kind", ["heap", "rocksdb"])
@pytest.mark.parametrize("update", ["write", "read_and_write"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_processing_time_handles_match_the_model(backend_kind, update, ops):
    """Whatever the interleaving of writes, reads, clock ticks and sweep steps: a read
    returns what the model (last write, alive while now < last touch + ttl) returns; a
    sweep never deletes a live entry; after the clock passed every touch + ttl a full
    sweep leaves the backend holding nothing of the state."""
    backend = make(backend_kind)
    try:
        config = StateTtl(TTL_S, update=update)
        cur, clock, reg, value, mapped = setup(backend, config)
        model = {}  # key -> (value, last touch)
        ttl = config.ttl_us
        for op in ops:
            if op[0] == "tick":
                clock.t += op[1]
                continue
            if op[0] == "sweep":
                reg.after_batch(op[1])
                continue
            key = op[1]
            cur.key, cur.kg = key, key % len(KGS)
            live = key in model and model[key][1] + ttl > clock.t
            if op[0] == "write":
                value.update(op[2])
                mapped.put("x", op[2])
                model[key] = (op[2], clock.t)
            else:
                want = model[key][0] if live else None
                assert value.value() == want
                assert mapped.get("x") == want
                assert ("x" in mapped) == live
                if live and update == "read_and_write":
                    model[key] = (want, clock.t)
        for key, (v, t) in model.items():  # the sweep deleted nothing alive
            if t + ttl > clock.t:
                cur.key, cur.kg = key, key % len(KGS)
                assert value.value() == v and mapped.items() == [("x", v)]
        clock.t += ttl * 2
        reg.after_batch(10_000)  # the operator's own sweeper: its skip-until-due bookkeeping too
        assert not [e for e in backend.entries() if e[1] in ("op/v", "op/m")]
    finally:
        backend.close()


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 100), st.integers(0, 30)), max_size=40))
def test_event_time_lives_past_the_newest_event(ops):
    """Event time: records (key, event time, watermark advance) in any order; a key is
    alive while the watermark is below its newest event time + ttl."""
    backend = HeapStateBackend(KGS, snapshot_mode="thread")
    wm = {"t": MIN_TIME}
    config = StateTtl(TTL_S, time="event")
    cur, _clock, reg, value, _m = setup(backend, config, timed=True, watermark=lambda: wm["t"])
    newest = {}
    for key, ts_s, adv in ops:
        cur.key, cur.kg, cur.ts = key, key % len(KGS), ts_s * 1_000_000
        alive = key in newest and newest[key] + config.ttl_us > wm["t"]
        assert (value.value() is not None) == alive
        value.update(ts_s)
        newest[key] = max(newest[key], cur.ts) if alive else cur.ts
        wm["t"] = max(wm["t"], (ts_s - adv) * 1_000_000)


def test_event_time_ttl_needs_event_time():
    with pytest.raises(ConfigError, match="state 'v'.*event time"):
        setup(HeapStateBackend(KGS), StateTtl(5, time="event"), timed=False)


# ------------------------------------------------ checkpoint record, reader, restore rules
def _snapshot(backend, reg) -> bytes:
    reg.snapshot()
    return backend.snapshot(1).run()


@pytest.mark.parametrize("backend_kind", ["heap", "rocksdb"])
def test_reader_view_and_restore(backend_kind):
    backend = make(backend_kind)
    config = StateTtl(TTL_S)
    cur, clock, reg, value, mapped = setup(backend, config)
    for key in range(20):
        cur.key, cur.kg = key, key % len(KGS)
        value.update(key)
        mapped.put("a", key)
    blob = _snapshot(backend, reg)
    backend.close()

    def view(wall):
        rows = []
        for kg, (values, maps) in decode_snapshot(blob):
            ttl = KeyGroupTtl(values, "op/", wall_now=wall * 1000)
            for name, entries in values.items():
                if name == "op/v":
                    rows += [v for _k, s in entries.items() for live, v in [ttl.live("v", s)] if live]
        return sorted(rows)

    assert view(clock.t) == list(range(20))                     # live, unwrapped
    assert view(clock.t + config.ttl_us) == []                   # expired: never returned

    # restore with the same ttl, after the entries expired: a read sees none of them
    restored = make(backend_kind)
    restored.restore([blob])
    cur2, clock2 = Cur(), Clock()
    clock2.t = clock.t + config.ttl_us
    reg2 = TtlRegistry(restored, "op", KGS, cur2, lambda: MIN_TIME, False, wall_clock_ns=clock2.ns)
    reg2.declare("v", "op/v", "value", config)
    v2 = TtlValueState(restored, "op/v", cur2, None, config, reg2)
    cur2.key, cur2.kg = 3, 3
    assert v2.value() is None
    # the ttl removed on restore: live entries unwrapped (plain values), expired ones dropped
    again = make(backend_kind)
    again.restore([blob])
    reg3 = TtlRegistry(again, "op", KGS, Cur(), lambda: MIN_TIME, False, wall_clock_ns=Clock().ns)
    reg3.declare("v", "op/v", "value", None)
    assert again.get("op/v", 3, 3) == 3
    # processing -> event time is refused, naming operator and state
    other = make(backend_kind)
    other.restore([blob])
    reg4 = TtlRegistry(other, "op", KGS, Cur(), lambda: MIN_TIME, True, wall_clock_ns=Clock().ns)
    with pytest.raises(ConfigError, match="operator 'op', state 'v'.*time domain"):
        reg4.declare("v", "op/v", "value", StateTtl(TTL_S, time="event"))
    for b in (restored, again, other):
        b.close()


def test_sweep_steps_are_bounded():
    """A step looks at about ENTRIES_PER_RECORD entries per record (whole key groups): with
    1000 expired entries in 8 key groups a one-record step deletes one key group's worth."""
    backend = HeapStateBackend(KGS, snapshot_mode="thread")
    config = StateTtl(TTL_S)
    cur, clock, reg, value, _m = setup(backend, config)
    for key in range(1000):
        cur.key, cur.kg = key, key % len(KGS)
        value.update(key)
    clock.t += config.ttl_us
    sweeper = Sweeper(backend, reg._targets[:1], KGS)
    first = sweeper.step(1)
    assert 0 < first <= 1000 // len(KGS) * 3  # a few key groups, not everything
    while sweeper.step(1000):
        pass
    assert not list(backend.entries())


def test_an_allowed_change_is_named_in_the_log(caplog):
    backend = HeapStateBackend(KGS, snapshot_mode="thread")
    cur, clock, reg, value, _m = setup(backend, StateTtl(TTL_S))
    cur.key, cur.kg = 1, 1
    value.update(7)
    blob = _snapshot(backend, reg)
    restored = HeapStateBackend(KGS, snapshot_mode="thread")
    restored.restore([blob])
    with caplog.at_level("WARNING", logger="epochal"):
        TtlRegistry(restored, "op", KGS, Cur(), lambda: MIN_TIME, False, wall_clock_ns=clock.ns).declare(
            "v", "op/v", "value", StateTtl(2 * TTL_S))
    assert "operator 'op', state 'v': restoring with a changed ttl: ttl duration or update kind changed" in caplog.text


@pytest.mark.parametrize("backend_kind", ["heap", "rocksdb"])
def test_event_time_cut_is_kept_for_the_reader_and_the_restored_job(backend_kind):
    """The TTL record keeps the watermark at the cut: the reader judges event-time entries
    by it, and a restored operator starts from it (before any watermark arrives, an entry
    expired at the cut is not returned)."""
    backend = make(backend_kind)
    wm = {"t": MIN_TIME}
    config = StateTtl(TTL_S, time="event")
    cur, _clock, reg, value, _m = setup(backend, config, timed=True, watermark=lambda: wm["t"])
    for key, ts in ((1, 0), (2, 50)):  # key 1 last updated at 0 s, key 2 at 50 s
        cur.key, cur.kg, cur.ts = key, key, ts * 1_000_000
        value.update(key)
    wm["t"] = 30 * 1_000_000  # key 1 expired (0 + 10 <= 30), key 2 alive
    blob = _snapshot(backend, reg)
    backend.close()
    live = []
    for _kg, (values, _maps) in decode_snapshot(blob):
        ttl = KeyGroupTtl(values, "op/")
        live += [v for _k, s in values.get("op/v", {}).items() for ok, v in [ttl.live("v", s)] if ok]
    assert live == [2]
    restored = make(backend_kind)
    restored.restore([blob])
    cur2 = Cur()
    reg2 = TtlRegistry(restored, "op", KGS, cur2, lambda: MIN_TIME, True)  # no watermark yet
    reg2.declare("v", "op/v", "value", config)
    v2 = TtlValueState(restored, "op/v", cur2, None, config, reg2)
    cur2.key, cur2.kg = 1, 1
    assert v2.value() is None
    cur2.key, cur2.kg = 2, 2
    assert v2.value() == 2
    restored.close()


def test_a_large_sweep_reclaims_the_key_group():
    backend = RocksDBStateBackend(KGS)
    calls = []
    real = backend.reclaim
    backend.reclaim = lambda state, kg: (calls.append((state, kg)), real(state, kg))
    config = StateTtl(TTL_S)
    cur, clock, reg, value, _m = setup(backend, config)
    for key in range(3000):
        cur.key, cur.kg = key, 0  # one key group: the sweep deletes >= RECLAIM_MIN there at once
        value.update(key)
    clock.t += config.ttl_us
    reg.after_batch(10_000)
    assert ("op/v", 0) in calls
    assert not list(backend.entries())
    backend.close()
