"""Test data for the joins (tests/test_joins*.py): one stream of rows of two sides,
out of order within a bound, with late rows whose lateness is unambiguous, and
plain-Python oracles (nested loops) for every join kind.

One source subtask emits every row ``(side, key, ts, id)``; ``with_watermarks`` follows it
(watermark after each poll of ``BATCH`` rows = max ts - ``BOUND`` - 1 µs), then one filter
per side. Each side reaches a join subtask through one channel (one producer, FIFO), and
the joins judge lateness by each input's own watermark (epochal.joins.functions), so a
row is late exactly when its side's watermark at its arrival passed it — which lies
between the watermark of the rows a whole poll earlier and that of all rows before it
(``category``). Every 53rd row from ``LATE_FROM`` on is sent 30 s back in time: certainly
late; every other row is certainly on time (its disorder < ``BOUND``).
"""
from __future__ import annotations

import collections
import os
import signal
import time

import epochal as ep

N = 3000
STEP = 0.01
DISORDER = 0.8
BOUND = 1.0
BATCH = 64
KEYS = tuple(f"k{i}" for i in range(16))
LATE_FROM = 400


def us(t: float) -> int:
    return round(t * 1_000_000)


def _normal(i: int) -> float:
    return round(i * STEP - ((i * 7919) % 97) / 97 * DISORDER, 6)


def row(split: int, i: int) -> tuple:
    side = "R" if (i * 40503 >> 5) % 3 == 0 else "L"
    ts = _normal(i) - 30.0 if i >= LATE_FROM and i % 53 == 0 else _normal(i)
    return side, KEYS[(i * 2654435761 >> 7) % len(KEYS)], round(ts, 6), i


def rows_from(split: int, offset: int, n: int = N):
    return (row(split, i) for i in range(offset, n))


def all_rows(n: int = N) -> list:
    return [row(0, i) for i in range(n)]


def _prefix_max(rows: list) -> list:
    out, m = [], None
    for r in rows:
        m = us(r[2]) if m is None else max(m, us(r[2]))
        out.append(m)
    return out


def category(i: int, rows: list, prefix: list | None = None) -> str:
    """"late" or "on time", certainly; anything in between fails the test data. ``prefix``:
    :func:`_prefix_max` of ``rows`` (computed if not given)."""
    prefix = prefix or _prefix_max(rows)
    w_lo = prefix[max(0, i - BATCH)] - us(BOUND) - 1  # the watermark after a poll a whole poll earlier
    w_hi = prefix[max(0, i - 1)] - us(BOUND) - 1  # the watermark of every row before it
    t = us(rows[i][2])
    if i == 0 or t > w_hi:
        return "on time"
    if t <= w_lo:
        return "late"
    raise AssertionError(f"test data: row {i} {rows[i]} is ambiguously late")


def split_rows(n: int = N) -> tuple[list, list, list]:
    """(left rows on time, right rows on time, late rows as (side name, row))."""
    rows = all_rows(n)
    prefix = _prefix_max(rows)
    left, right, late = [], [], []
    for i, r in enumerate(rows):
        if category(i, rows, prefix) == "late":
            late.append(("left" if r[0] == "L" else "right", r))
        else:
            (left if r[0] == "L" else right).append(r)
    return left, right, late


def sides(flow: ep.Dataflow, n: int = N, rate: float | None = 6000.0):
    """The keyed left and right streams of the rows (source and watermarks at parallelism 1)."""
    source = ep.sources.GeneratorSource(lambda s, o: rows_from(s, o, n), num_splits=1, limit=n,
                                        records_per_second=rate)
    timed = (flow.source("rows", source, parallelism=1)
             .with_watermarks("ts", timestamp=lambda r: r[2], max_out_of_orderness=BOUND))
    left = timed.filter("left", lambda r: r[0] == "L", parallelism=1).key_by(lambda r: r[1])
    right = timed.filter("right", lambda r: r[0] == "R", parallelism=1).key_by(lambda r: r[1])
    return left, right


def ids(left, right) -> tuple:
    """The join output the tests use: the two rows' ids (None for a missing side)."""
    return (left and left[3], right and right[3])


# ------------------------------------------------------------------------ oracles
def interval_oracle(left: list, right: list, lower: float, upper: float, how: str) -> collections.Counter:
    out = collections.Counter()
    matched_l, matched_r = set(), set()
    for l in left:
        for r in right:
            if l[1] == r[1] and us(l[2]) + us(lower) <= us(r[2]) <= us(l[2]) + us(upper):
                out[(l[3], r[3])] += 1
                matched_l.add(l[3])
                matched_r.add(r[3])
    if how in ("left", "full"):
        out.update((l[3], None) for l in left if l[3] not in matched_l)
    if how in ("right", "full"):
        out.update((None, r[3]) for r in right if r[3] not in matched_r)
    return out


def tumbling_oracle(left: list, right: list, size: float, how: str) -> collections.Counter:
    def window(r):
        return r[1], us(r[2]) // us(size)
    groups = collections.defaultdict(lambda: ([], []))
    for r in left:
        groups[window(r)][0].append(r)
    for r in right:
        groups[window(r)][1].append(r)
    return _pairs_by_group(groups.values(), how)


def _pairs_by_group(groups, how: str) -> collections.Counter:
    """The ids of every left × right pair within each ``(left rows, right rows)`` group, and
    an outer side's rows of a group with no partner."""
    out = collections.Counter()
    for ls, rs in groups:
        out.update((l[3], r[3]) for l in ls for r in rs)
        if how in ("left", "full") and not rs:
            out.update((l[3], None) for l in ls)
        if how in ("right", "full") and not ls:
            out.update((None, r[3]) for r in rs)
    return out


def session_oracle(left: list, right: list, gap: float, how: str) -> collections.Counter:
    """Sessions per key over both sides: a row spans [t, t + gap); rows whose spans overlap,
    directly or through others, are one session (a union of intervals, merged in time order)."""
    rows = sorted([(r[1], us(r[2]), 0, r) for r in left] + [(r[1], us(r[2]), 1, r) for r in right],
                  key=lambda e: (e[0], e[1]))
    groups: list = []
    for key, t, side, r in rows:
        if not groups or groups[-1][0] != key or t >= groups[-1][1]:
            groups.append([key, t + us(gap), [], []])
        groups[-1][1] = max(groups[-1][1], t + us(gap))
        groups[-1][2 + side].append(r)
    return _pairs_by_group(((ls, rs) for _, _, ls, rs in groups), how)


def temporal_oracle(probes: list, versions: list, how: str) -> collections.Counter:
    out = collections.Counter()
    for p in probes:
        before = [v for v in versions if v[1] == p[1] and us(v[2]) <= us(p[2])]
        if before:
            out[(p[3], max(before, key=lambda v: (us(v[2]), v[3]))[3])] += 1
        elif how == "left":
            out[(p[3], None)] += 1
    return out


class PidRecorder:
    """Records the pid of the first process that calls :meth:`mark` in ``pid_dir`` (a file
    named by it), so that a test can SIGKILL a task process from outside."""

    def __init__(self, pid_dir: str):
        self.pid_dir, self.recorded = pid_dir, False

    def mark(self) -> None:
        if not self.recorded:
            self.recorded = True
            open(os.path.join(self.pid_dir, str(os.getpid())), "w").close()


def sigkill_once_checkpointed(handle, pid_dir: str, committed) -> tuple:
    """Waits (up to 120 s) for a completed checkpoint and a pid in ``pid_dir``, SIGKILLs the
    first pid (os.kill from the test) and waits for the job: ``(result, rows committed
    before the kill)`` (``committed()`` counts them). Asserts that the kill caused a restart
    on Spark."""
    deadline = time.monotonic() + 120
    while not (handle.completed_epochs and os.listdir(pid_dir)):
        assert time.monotonic() < deadline and handle.running, "no checkpoint (or no join output) within 120 s"
        time.sleep(0.01)
    committed_before = committed()
    victim = int(sorted(os.listdir(pid_dir))[0])
    os.kill(victim, signal.SIGKILL)
    result = handle.wait(300)
    assert result.runtime == "spark" and result.attempts >= 2, f"the SIGKILL of {victim} caused no restart"
    return result, committed_before


def rescale_2_to_3(build, out: str, tmp_path, pairs, expected: collections.Counter, checkpoint_dir) -> tuple:
    """Runs ``build(out, 2)`` until 2 epochs completed, stops it with a savepoint (asserting it
    stopped before half of ``expected`` was committed), then ``build(out, 3)`` from that
    savepoint to the end; asserts the committed ``pairs(out)`` equal ``expected``. Returns
    ``(savepoint url, the second run's result)``. ``checkpoint_dir(name)`` gives a fresh
    checkpoint directory."""
    url = str(tmp_path / "sp")
    handle = build(out, 2).start(runtime="local", channels=ep.ChannelConfig(batch_size=BATCH),
                                 checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + checkpoint_dir("ck1")))
    deadline = time.monotonic() + 60
    while len(handle.completed_epochs) < 2:
        assert time.monotonic() < deadline and handle.running, "no 2 epochs within 60 s"
        time.sleep(0.01)
    assert handle.stop_with_savepoint(url, timeout=60) == url
    handle.wait(30)
    first = pairs(out)
    assert 0 < sum(first.values()) < sum(expected.values()) // 2, "not stopped midway"
    result = build(out, 3).run(runtime="local", restore_from=url, channels=ep.ChannelConfig(batch_size=BATCH),
                               checkpoint=ep.CheckpointConfig(interval=0.1, storage="file://" + checkpoint_dir("ck2")))
    assert result.restored_from[0] == ep.state.open_checkpoint(url).epoch
    assert pairs(out) == expected
    return url, result


def _ship_by_value() -> None:
    """Task processes cannot import this test helper: its functions travel by value
    (as tests/conftest.py does for tests/pipelines.py)."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_ship_by_value()
