"""The how-to pages' examples (docs/how-to/*.md cut their code from examples/*.py with snippet
markers, so a page cannot drift from what runs here): each example runs on the one embedded
Spark session of the test run, and what it committed is compared with a plain-Python oracle
written in this file from the example's input data (not the example's own check), with the
injected fault or the stop/restore asserted to have happened mid-run.

The examples are loaded by path and pickled by value (task processes cannot import
``examples/``), as a user's ``__main__`` script is.
"""
from __future__ import annotations

import collections
import importlib.util
import sys
from pathlib import Path

import cloudpickle
import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.spark


def load(name: str):
    """``examples/<name>.py`` as a module whose functions travel by value."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def us(t: float) -> int:
    return round(t * 1_000_000)


# ------------------------------------------------------------------------------- windows
def windows_oracle(clicks: list[dict], poll: int, bound: float, lateness: float) -> dict:
    """Tumbling 10 s sums with refires and the late output, sliding 10 s / 5 s counts and
    3 s-gap session counts of the on-time clicks. A click's lateness is decided from its
    position: the watermark at its arrival lies between the one a poll earlier and the one
    of every click before it; an ambiguous click is an error of the test data."""
    kinds = []
    for i, c in enumerate(clicks):
        lo = max(us(x["ts"]) for x in clicks[:max(1, i - poll + 1)]) - us(bound) - 1
        hi = max(us(x["ts"]) for x in clicks[:max(1, i)]) - us(bound) - 1
        end = us(c["ts"]) // us(10) * us(10) + us(10)
        if end - 1 > hi:
            kinds.append("on-time")
        elif end - 1 <= lo and end - 1 + us(lateness) > hi:
            kinds.append("refires")
        elif end - 1 + us(lateness) <= lo:
            kinds.append("dropped")
        else:
            raise AssertionError(f"click {i} is ambiguously late")
    assert kinds.count("refires") >= 2 and kinds.count("dropped") >= 2, kinds.count
    on_time = [c for c, k in zip(clicks, kinds) if k == "on-time"]
    # a window fires once with its on-time clicks (all arrive before it fires), then again
    # with each click that refires it, in arrival order
    totals, tumbling = collections.defaultdict(int), collections.Counter()
    for c in on_time:
        totals[(c["user"], us(c["ts"]) // us(10) * 10)] += c["amount"]
    tumbling.update((user, float(start), float(start + 10), total) for (user, start), total in totals.items())
    for c, k in zip(clicks, kinds):
        if k == "refires":
            w = (c["user"], us(c["ts"]) // us(10) * 10)
            totals[w] += c["amount"]
            tumbling[(w[0], float(w[1]), float(w[1] + 10), totals[w])] += 1
    sliding = collections.Counter()
    for c in on_time:
        first = us(c["ts"]) // us(5) * 5
        for start in (first - 5, first):
            sliding[(c["user"], float(start), float(start + 10))] += 1
    sessions = collections.Counter()
    for user in {c["user"] for c in on_time}:
        times = sorted(us(c["ts"]) for c in on_time if c["user"] == user)
        groups = [[times[0]]]
        for t in times[1:]:
            (groups[-1].append(t) if t < groups[-1][-1] + us(3) else groups.append([t]))
        for g in groups:
            sessions[(user, g[0] / 1e6, (g[-1] + us(3)) / 1e6, len(g))] += 1
    return {"spent": tumbling,
            "sliding": collections.Counter((u, s, e, n) for (u, s, e), n in sliding.items()),
            "sessions": sessions,
            "late": collections.Counter(tuple(sorted(c.items())) for c, k in zip(clicks, kinds) if k == "dropped")}


def test_windows_example(tmp_path, spark):
    """examples/windows.py (docs/how-to/windows.md): tumbling windows with allowed lateness and
    their late output, sliding and session windows, through a crash of a window process."""
    ex = load("windows")
    result, outputs = ex.run(str(tmp_path), runtime="spark", spark=spark)
    assert result.attempts == 2 and result.restored_from[1], (result.failures, result.restored_from)
    assert "spent-per-10s[1]" in result.failures[0]
    got = {name: collections.Counter((r["key"], r["start"], r["end"], r["value"]) for r in outputs[name])
           for name in ("spent", "sliding", "sessions")}
    got["late"] = collections.Counter(tuple(sorted(r.items())) for r in outputs["late"])
    expected = windows_oracle(ex.CLICKS, ex.POLL, ex.BOUND, ex.LATENESS)
    for name in expected:
        assert got[name] == expected[name], name


# --------------------------------------------------------------------------------- joins
def row(r) -> tuple | None:
    return None if r is None else tuple(sorted(r.items()))


def test_joins_example(tmp_path, spark):
    """examples/joins.py (docs/how-to/joins.md): a left interval join, an inner tumbling-window
    join and a left temporal join through a crash of the interval join's process; each output
    equals nested loops over the inputs, and no row was late."""
    ex = load("joins")
    result, outputs = ex.run(str(tmp_path), runtime="spark", spark=spark)
    assert result.attempts == 2 and result.restored_from[1], (result.failures, result.restored_from)
    assert "bid-after-open[0]" in result.failures[0]
    bids, auctions, reserves = ex.BIDS, ex.AUCTIONS, ex.RESERVES
    opened = collections.Counter()
    for b in bids:
        partners = [a for a in auctions if a["auction"] == b["auction"] and us(b["ts"]) - us(10) <= us(a["ts"]) <= us(b["ts"])]
        for a in partners or [None]:
            opened[row(dict(b, item=a["item"] if a else None))] += 1
    assert None in {dict(r)["item"] for r in opened} and len(opened) > 100  # both kinds of row occur
    windowed = collections.Counter((row(b), row(a)) for b in bids for a in auctions
                                   if b["auction"] == a["auction"] and us(b["ts"]) // us(10) == us(a["ts"]) // us(10))
    current = collections.Counter()
    for b in bids:
        versions = sorted((us(r["ts"]), r["reserve"]) for r in reserves
                          if r["auction"] == b["auction"] and us(r["ts"]) <= us(b["ts"]))
        current[row(dict(b, reserve=versions[-1][1] if versions else None))] += 1
    assert collections.Counter(map(row, outputs["opened"])) == opened
    assert collections.Counter((row(b), row(a)) for b, a in outputs["windowed"]) == windowed
    assert collections.Counter(map(row, outputs["vs-reserve"])) == current
    assert outputs["opened-late"] == []


# ------------------------------------------------------------------------------- regions
def test_regions_example(tmp_path, spark):
    """examples/regions.py (docs/how-to/regions.md): a crash in region ``payments`` restarts
    that region alone; a crash of ``audit``'s pipeline 1 restarts that failover region alone;
    both outputs are exact."""
    ex = load("regions")
    result, outputs = ex.run(str(tmp_path), runtime="spark", spark=spark)
    payments, audit = result.regions["payments"], result.regions["audit"]
    assert payments.attempts == 2 and "count[0]" in payments.failures[0], payments.failures
    assert payments.restored_from[1] and payments.failovers == []
    assert [f["tasks"] for f in audit.failovers] == [["events[1]"]], (audit.failures, audit.failovers)
    assert audit.failovers[0]["restored_epoch"] >= 1
    assert not any("count" in f for f in audit.failures)  # the payments crash left audit alone
    n = ex.PER_SPLIT
    per_account = collections.Counter(ex.payment(s, i)["account"] for s in (0, 1) for i in range(n))
    assert collections.Counter(tuple(r) for r in outputs["counts"]) == collections.Counter(
        (account, k) for account, c in per_account.items() for k in range(1, c + 1))
    assert collections.Counter(r["event"] for r in outputs["audited"]) == collections.Counter(
        f"e{s}-{i}" for s in (0, 1) for i in range(n))
    assert all(r["audited"] for r in outputs["audited"])


# ------------------------------------------------------------------------ queryable state
def test_queryable_state_example(tmp_path, spark):
    """examples/queryable_state.py (docs/how-to/queryable-state.md): read-committed answers
    through the handle, a QueryClient and the ``epochal query`` command while the job runs on
    Spark; every answer equals a plain-Python count of the input its epoch's checkpoint had
    read, and the output committed at the stop equals the count at the savepoint."""
    from epochal.sinks import read_committed
    from epochal.state import list_source_offsets

    ex = load("queryable_state")
    result, answers, storage = ex.run(str(tmp_path), runtime="spark", spark=spark)

    def count(url, started=False):
        offsets = {}
        for entry in list_source_offsets(url):
            offsets.update(entry["offsets"] or {})
        assert set(offsets) <= {"0", "1"} and (not started or min(offsets.get(s, 0) for s in "01") > 0), offsets
        return collections.Counter(ex.word(int(s), i) for s, n in offsets.items() for i in range(n))

    assert {how for how, _, _ in answers} == {"handle", "client", "shell"}
    assert len({epoch for _, epoch, _ in answers}) >= 3
    for how, epoch, values in answers:
        expected = count(f"{storage}/{ex.JOB}/chk-{epoch}")
        assert values == {w: expected[w] for w in ex.WORDS}, (how, epoch)
    assert result.stopped_with_savepoint and result.attempts == 1
    final = collections.defaultdict(int)
    for r in read_committed(str(tmp_path / "out")):
        final[r["word"]] = max(final[r["word"]], r["n"])
    assert final == dict(count(result.stopped_with_savepoint, started=True))


# ---------------------------------------------------------------------------- savepoints
def test_savepoints_example(tmp_path, spark):
    """examples/savepoints.py (docs/how-to/savepoints.md): a savepoint while running, a stop
    with a savepoint (output and state end exactly there), a restore rescaled 2 -> 3 that
    finishes the input (every running-count row once), and a rollback to the older
    savepoint whose FileSink removes the abandoned future (one history, every row once)."""
    from epochal.state import list_source_offsets

    ex = load("savepoints")
    steps = ex.run(str(tmp_path), runtime="spark", spark=spark)

    def read(url):
        offsets = {}
        for entry in list_source_offsets(url):
            offsets.update(entry["offsets"])
        return {int(s): n for s, n in offsets.items()}

    def rows(offsets):
        counts = collections.Counter(ex.word(s, i) for s, n in offsets.items() for i in range(n))
        return counts, collections.Counter((w, k) for w, n in counts.items() for k in range(1, n + 1))

    before, stop = read(steps["stop"]["before"]), read(steps["stop"]["savepoint"])
    assert sorted(stop) == [0, 1] and all(0 < before[s] < stop[s] < ex.END for s in (0, 1)), (before, stop)
    counts, expected = rows(stop)
    assert steps["stop"]["counts"] == expected and steps["stop"]["state"] == dict(counts)
    _, everything = rows({0: ex.END, 1: ex.END})
    restore, rollback = steps["restore"]["result"], steps["rollback"]["result"]
    assert restore.restored_from[0] is not None and rollback.restored_from[0] < restore.restored_from[0]
    assert steps["restore"]["counts"] == everything
    assert steps["rollback"]["counts"] == everything  # without rollback="remove": the epochs after `before` twice
