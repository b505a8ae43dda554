"""Recovery of continuous eventual checkpoints (seed 003) against a plain-Python oracle.

The property: a keyed tumbling, sliding or session sum/count over a random stream (timestamps in
order, ties included), with random Gchecks and flushes, a log signed or not, crashed at random points — the
buffered frames lost and the segment being written cut at a random byte (torn frames
included) — and recovered from the log (EC, replay after T with the per-window filter), ends
with every window's R in the log exactly once, equal to the oracle's results as a multiset.

The scripted tests pin the rules one at a time: the per-window filter (with equal
timestamps), a window closed before the crash is not re-emitted, a torn control record falls
back to the previous footprint.
"""
from __future__ import annotations

import itertools
import os
import random
import uuid
from collections import Counter, defaultdict

import fsspec
import pytest
from hypothesis import Phase, event, given, settings
from hypothesis import strategies as st

from epochal.errors import CheckpointStorageError
from epochal.eventual.log import OutputLog, ResultReader
from epochal.eventual.operator_state import EventualWindows, ReplayMismatch, Session, Sliding, SumCount, Tumbling
from epochal.eventual.records import Footprint, Kind, Position, Result
from epochal.eventual.recovery import construct

#: EVENTUAL_BREAK_CHECK=1: no shrinking, to see a deliberately broken rule fail in seconds
PROPS = settings(max_examples=150, deadline=None,
                 **({"phases": (Phase.explicit, Phase.generate)} if os.environ.get("EVENTUAL_BREAK_CHECK") else {}))


# ---------------------------------------------------------------------- the oracle
def oracle(stream, size, slide):
    """Plain Python: every window [s, s + size) with s a multiple of slide, per key, holding
    at least one tuple, with the sum and count of its values."""
    acc = defaultdict(lambda: [0, 0])
    for key, ts, value in stream:
        for s in range(ts - size, ts + 1):
            if s % slide == 0 and s <= ts < s + size:
                acc[(key, s)][0] += value
                acc[(key, s)][1] += 1
    return Counter({(w, (a[0], a[1])): 1 for w, a in acc.items()})


def session_oracle(stream, gap):
    """Plain Python: per key, runs of tuples each less than ``gap`` after the previous one,
    named by their first tuple's timestamp, with the sum and count of their values."""
    by_key = defaultdict(list)
    for key, ts, value in stream:
        by_key[key].append((ts, value))
    out = Counter()
    for key, rows in by_key.items():
        start, total, count, last = rows[0][0], 0, 0, None
        for ts, value in rows:
            if last is not None and ts - last >= gap:
                out[((key, start), (total, count))] += 1
                start, total, count = ts, 0, 0
            total, count, last = total + value, count + 1, ts
        out[((key, start), (total, count))] += 1
    return out


# ---------------------------------------------------------------------- the harness
def memory_url() -> str:
    return f"memory://eventual-tests/{uuid.uuid4().hex}"


def tear(url: str, fraction: float) -> int:
    """The crash came in the middle of writing the newest segment: keep ``fraction`` of its
    bytes. Returns the number of bytes cut off. Only for a segment whose flush had not returned
    (nothing was truncated behind it)."""
    fs, root = fsspec.core.url_to_fs(url)
    segments = OutputLog(url).segments()
    if not segments:
        return 0
    path = segments[-1].path
    data = fs.cat_file(path)
    keep = int(len(data) * fraction)
    fs.pipe_file(path, data[:keep])
    return len(data) - keep


def make_operator(windows, closing):
    return EventualWindows(windows, SumCount, closing=closing)


class Downstream:
    """A sink reading the operator's log (it survives the operator's crashes): what it read,
    and its reader's position, which bounds the log's truncation."""

    def __init__(self, url, key=None):
        self.url, self.key, self.got, self.index, self.offset = url, key, Counter(), 0, 0

    def poll(self):
        reader = ResultReader(OutputLog(self.url, key=self.key), self.index, self.offset)
        self.got.update((r.window, r.value) for r in reader.poll())
        self.index, self.offset = reader.index, reader.offset


def run_attempt(stream, url, windows, closing, rnd, crash_after, chunk_bytes, truncate, downstream=None, key=None):
    """One attempt: recover from the log at ``url``, replay the stream after T, continue; crash
    after ``crash_after`` tuples of this attempt, else finish. Returns ``(finished, op,
    tearable)``: at a crash the buffer is flushed (the flush the crash interrupts) and, when
    ``tearable``, the caller tears the newest segment — only when nothing was read or
    truncated since it was written (a flush that had returned is durable)."""
    log = OutputLog(url, chunk_bytes=chunk_bytes, key=key)
    ec = construct(log.frames_backward())
    op = make_operator(windows, closing)
    op.restore(ec)
    positions = [Position(ts, seq) for seq, (_, ts, _) in enumerate(stream)]
    seen = 0  # segments written by this attempt when it last polled or truncated
    start = 0 if ec.T is None else next((i for i, p in enumerate(positions) if p > ec.T), len(stream))
    for steps, i in enumerate(range(start, len(stream))):
        if steps == crash_after:
            if log.buffered_bytes and rnd.random() < 0.8:
                log.flush()  # the flush the crash interrupts (else the buffer is lost)
            # torn: the newest segment, if no one read it or truncated behind it since
            return False, op, log.segments_written > seen

        key, _, value = stream[i]
        log.append(op.on_tuple(key, value, positions[i]))
        chosen = [w for w in op.open_windows() if rnd.random() < 0.3]
        log.append(op.checkpoint(chosen))
        if rnd.random() < 0.3:
            log.flush()
            seen = log.segments_written
            if downstream is not None:
                downstream.poll()
            if truncate:
                log.truncate_behind(op.extent_start(), keep_from=downstream.index if downstream else None)
    log.append(op.end_of_input())
    log.flush()
    return True, op, False


@st.composite
def streams(draw):
    n = draw(st.integers(2, 50))
    gaps = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    keys = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    values = draw(st.lists(st.integers(-5, 9), min_size=n, max_size=n))
    ts = list(itertools.accumulate(gaps))
    return [(k, t, v) for k, t, v in zip(keys, ts, values)]


windowings = st.one_of(
    st.integers(1, 8).map(lambda size: (Tumbling(size), lambda s: oracle(s, size, size))),
    st.tuples(st.integers(1, 4), st.integers(1, 3)).map(
        lambda p: (Sliding(p[0] * p[1], p[0]), lambda s: oracle(s, p[0] * p[1], p[0]))),
    st.integers(1, 6).map(lambda gap: (Session(gap), lambda s: session_oracle(s, gap))))


@PROPS
@given(stream=streams(), windowing=windowings, closing=st.sampled_from(["key", "time"]),
       crashes=st.lists(st.tuples(st.integers(1, 30), st.floats(0, 1)), min_size=1, max_size=3),
       chunk_bytes=st.sampled_from([1, 60, 200, 1 << 20]), truncate=st.booleans(),
       key=st.sampled_from([None, b"0123456789abcdef"]), rnd=st.randoms(use_true_random=False))
def test_every_window_result_exactly_once_across_crashes_with_torn_tails(stream, windowing, closing, crashes,
                                                                        chunk_bytes, truncate, key, rnd):
    windows, expected = windowing
    url = memory_url()
    downstream = Downstream(url, key)
    fired = cut = 0
    for crash_after, fraction in crashes:
        finished, op, tearable = run_attempt(stream, url, windows, closing, rnd, crash_after, chunk_bytes, truncate,
                                             downstream, key)
        if finished:
            break
        fired += 1
        if tearable:
            cut += tear(url, fraction)
    else:
        finished, op, _ = run_attempt(stream, url, windows, closing, rnd, None, chunk_bytes, truncate, downstream, key)
    assert finished
    if fired:
        event("crashed mid-run")
    if cut:
        event("tail torn")
    downstream.poll()
    assert downstream.got == expected(stream)
    log = OutputLog(url, key=key)
    if not truncate:
        assert Counter((r.window, r.value) for r in log.results()) == downstream.got
    times = [r.t for r in log.records()]
    assert times == sorted(times), "the log is in timestamp order"


def test_the_property_crashes_mid_run_and_tears_frames():
    """The fault injection of the property fires: a crash mid-stream with a torn tail, here
    with a fixed scenario, is recovered to the oracle's results."""
    stream = [(k % 3, t // 2, t) for k, t in zip(range(40), range(40))]
    url = memory_url()
    rnd = random.Random(0)
    finished, _, tearable = run_attempt(stream, url, Tumbling(4), "key", rnd, 25, 1 << 20, False)
    assert not finished and tearable  # crashed at tuple 25 of 40, in the middle of a flush
    assert tear(url, 0.5) > 0
    log = OutputLog(url)
    list(log.frames_backward())
    assert log.torn_frames == 1
    finished, op, _ = run_attempt(stream, url, Tumbling(4), "key", rnd, None, 1, False)
    assert finished and op.ignored > 0  # the replay went through the per-window filter
    assert Counter((r.window, r.value) for r in OutputLog(url).results()) == oracle(stream, 4, 4)


# ---------------------------------------------------------------------- scripted rules
def recover(url, windows=Tumbling(10), closing="time"):
    log = OutputLog(url)
    ec = construct(log.frames_backward())
    op = EventualWindows(windows, SumCount, closing=closing)
    op.restore(ec)
    return log, ec, op


def test_each_window_ignores_replayed_tuples_its_footprint_holds_equal_timestamps_included():
    """a's Gcheck at (1, 2) holds the tuple at (1, 2) but not the one at (1, 3), of the same
    timestamp; b's Gopen at (0, 1) makes T = (0, 1); c's Gopen at (2, 4) is tc. Without the
    per-window filter a counts (1, 2) twice and c counts (2, 4) twice; filtering by timestamp
    alone would drop (1, 3) from a."""
    url = memory_url()
    log = OutputLog(url)
    op = EventualWindows(Tumbling(10), SumCount, closing="time")
    stream = [("a", 1, Position(0, 0)), ("b", 10, Position(0, 1)), ("a", 2, Position(1, 2)), ("a", 4, Position(1, 3)),
              ("c", 5, Position(2, 4))]
    for key, value, t in stream:
        log.append(op.on_tuple(key, value, t))
        if t == Position(1, 2):
            log.append(op.checkpoint([("a", 0)]))
    log.flush()  # crash here
    log, ec, op = recover(url)
    assert (ec.tc, ec.n, ec.T) == (Position(2, 4), 3, Position(0, 1))
    assert ec.footprints[("a", 0)].state == (3, 2) and ec.footprints[("a", 0)].kind is Kind.CHECK
    for key, value, t in stream[2:]:
        log.append(op.on_tuple(key, value, t))
    assert op.ignored == 2  # (1, 2) by a, (2, 4) by c
    log.append(op.on_tuple("z", 0, Position(12, 5)))
    log.append(op.end_of_input())
    log.flush()
    assert sorted((r.window, r.value) for r in log.results()) == [
        (("a", 0), (7, 3)), (("b", 0), (10, 1)), (("c", 0), (5, 1)), (("z", 10), (0, 1))]


def test_a_window_closed_before_the_crash_is_not_emitted_again():
    """(a, 0) closed at tc; b's Gopen at (0, 0) makes T older than a's tuples, which are replayed:
    they must not reopen (a, 0) (the rule "any other window iff p > tc")."""
    url = memory_url()
    log = OutputLog(url)
    op = EventualWindows(Tumbling(5), SumCount, closing="key")
    stream = [("b", 1, Position(0, 0)), ("a", 1, Position(1, 1)), ("a", 2, Position(2, 2)), ("a", 5, Position(6, 3))]
    for key, value, t in stream:
        log.append(op.on_tuple(key, value, t))
    log.flush()  # crash here
    log, ec, op = recover(url, Tumbling(5), "key")
    assert set(ec.footprints) == {("b", 0), ("a", 5)} and ec.T == Position(0, 0)
    for key, value, t in stream[1:] + [("a", 1, Position(20, 4)), ("b", 1, Position(21, 5))]:
        log.append(op.on_tuple(key, value, t))
    log.append(op.end_of_input())
    log.flush()
    results = [(r.window, r.value) for r in log.results()]
    assert results.count((("a", 0), (3, 2))) == 1
    assert sorted(results) == sorted([(("a", 0), (3, 2)), (("a", 5), (5, 1)), (("b", 0), (1, 1)),
                                      (("a", 20), (1, 1)), (("b", 20), (1, 1))])


def test_a_torn_control_record_is_discarded_and_the_previous_footprint_used():
    url = memory_url()
    log = OutputLog(url, key=b"0123456789abcdef")
    op = EventualWindows(Tumbling(10), SumCount, closing="time")
    log.append(op.on_tuple("a", 1, Position(0, 0)))
    log.append(op.on_tuple("a", 2, Position(1, 1)))
    log.append(op.checkpoint([("a", 0)]))
    log.flush()
    log.append(op.on_tuple("a", 4, Position(2, 2)))
    log.append(op.checkpoint([("a", 0)]))
    log.flush()  # the segment of the Gcheck at (2, 2), alone
    assert tear(url, 0.7) > 0  # the crash tore it mid-record
    log = OutputLog(url, key=b"0123456789abcdef")
    ec = construct(log.frames_backward())
    assert log.torn_frames == 1
    assert ec.footprints[("a", 0)] == Footprint(Kind.CHECK, ("a", 0), (3, 2), Position(1, 1), 1, Position(0, 0))
    op = EventualWindows(Tumbling(10), SumCount, closing="time")
    op.restore(ec)
    log.append(op.on_tuple("a", 4, Position(2, 2)))
    log.append(op.on_tuple("z", 0, Position(10, 3)))
    log.append(op.end_of_input())
    log.flush()
    assert [(r.window, r.value) for r in log.results()] == [(("a", 0), (7, 3)), (("z", 10), (0, 1))]


def _three_tuples_recovered():
    """An operator recovered from a log of (b, 0), (a, 1), (a, 6) by key-closed 5 s windows."""
    url = memory_url()
    log = OutputLog(url)
    op = EventualWindows(Tumbling(5), SumCount, closing="key")
    for key, value, t in [("b", 1, Position(0, 0)), ("a", 1, Position(1, 1)), ("a", 2, Position(6, 2))]:
        log.append(op.on_tuple(key, value, t))
    log.flush()
    return recover(url, Tumbling(5), "key")[2]


def test_a_replay_that_differs_from_the_logged_input_is_refused():
    op = _three_tuples_recovered()
    with pytest.raises(ReplayMismatch, match="did not replay the input"):
        op.on_tuple("b", 1, Position(5, 1))  # never in the input: it would close (b, 0) before tc


def test_a_replayed_input_that_ends_before_tc_is_refused():
    op = _three_tuples_recovered()
    op.on_tuple("a", 1, Position(1, 1))
    with pytest.raises(ReplayMismatch, match=r"ended at \(1, 1\), before the recovered tc \(6, 2\)"):
        op.end_of_input()


def test_recovery_refuses_a_log_truncated_past_the_extent():
    url = memory_url()
    log = OutputLog(url)
    op = EventualWindows(Tumbling(100), SumCount)
    log.append(op.on_tuple("a", 1, Position(0, 0)))
    log.flush()
    log.append(op.on_tuple("b", 1, Position(1, 1)))
    log.flush()
    log.truncate_behind(Position(1, 0))  # wrongly: a's Gopen is the extent's start
    with pytest.raises(CheckpointStorageError, match="needs footprints of 2 open windows"):
        construct(OutputLog(url).frames_backward(), where="operator 'sum'")


def test_an_empty_log_recovers_to_the_beginning_and_a_closed_out_log_to_nothing():
    url = memory_url()
    assert construct(OutputLog(url).frames_backward()).tc is None
    log = OutputLog(url)
    op = EventualWindows(Tumbling(3), SumCount)
    log.append(op.on_tuple("a", 1, Position(0, 0)))
    log.append(op.on_tuple("a", 1, Position(4, 1)))  # closes (a, 0), opens (a, 3)
    log.append(op.end_of_input())
    log.flush()
    ec = construct(OutputLog(url).frames_backward())
    assert (ec.tc, ec.n, ec.T, ec.footprints) == (Position(4, 1), 0, Position(4, 1), {})
    assert [r for r in OutputLog(url).records() if isinstance(r, Result)][-1].n == 0
