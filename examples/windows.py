"""Event-time windows: tumbling, sliding and session windows over clicks that arrive out of
order, watermarks, allowed lateness and the late side output — exactly once through a crash.

The clicks of three users span two minutes of event time, out of order by up to a second.
A few are replayed long after their time (a phone that was offline): some within the
tumbling windows' allowed lateness (their window fires again, with the record counted), some
beyond it (they go to the late output unchanged). Half-way, the window task's process exits
after a completed checkpoint; the job restarts from it. Every output is compared with windows
computed in plain Python.

    python examples/windows.py [--runtime spark|local] [--no-crash]

Contract: :func:`run` builds and runs the job once in a fresh directory and returns what
each sink committed; :func:`oracle` computes the same from :data:`CLICKS` without epochal.
"""
from __future__ import annotations

import argparse
import collections
import os
import tempfile

import epochal as ep
from epochal.sinks import FileSink, read_committed
from epochal.testing import CrashAtRecord
from epochal.windows import Count, Session, Sliding, Sum, Tumbling

STEP = 0.1        # seconds of event time between two clicks
JITTER = 0.9      # how far a click's timestamp lies behind its place in the stream, at most
BOUND = 2.0       # the watermarks' max_out_of_orderness (> JITTER: no on-time click is late)
LATENESS = 30.0   # the tumbling windows' allowed lateness
POLL = 64         # the source reads this many clicks per poll; a watermark follows each poll
USERS = ("ann", "dee", "bob", "eve")  # two of each on either subtask of the windows


def _clicks() -> list[dict]:
    """1200 on-time clicks, plus one replayed click after every 97th from the 500th on.

    In even 10 s blocks ann and dee click, in odd ones bob and eve: every user's sessions
    end with a block. A replayed click is stamped 25 s (within the lateness) or 80 s
    (beyond it) behind the stream."""
    clicks = []
    for i in range(1200):
        block = int(i * STEP // 10)
        user = USERS[i % 2 + 2 * (block % 2)]
        jitter = (i * 7919 % 97) / 97 * JITTER
        clicks.append({"user": user, "ts": round(i * STEP - jitter, 6), "amount": i % 7 + 1, "id": i})
        if i >= 500 and i % 97 == 0:
            back = 25.0 if (i // 97) % 2 else 80.0
            clicks.append({"user": USERS[i % 4], "ts": round(i * STEP - back, 6), "amount": 100, "id": f"replay-{i}"})
    return clicks


CLICKS = _clicks()


def clicks_from(split: int, offset: int):
    """The source's generator: the clicks from ``offset`` on (replayable: a pure list)."""
    return iter(CLICKS[offset:])


# --8<-- [start:graph]
def build(work: str) -> ep.Dataflow:
    flow = ep.Dataflow("click-windows", parallelism=2)
    source = ep.sources.GeneratorSource(clicks_from, num_splits=1, limit=len(CLICKS), records_per_second=1000)
    clicks = (flow.source("clicks", source, parallelism=1)
                  .with_watermarks("click-time", timestamp=lambda c: c["ts"],   # seconds
                                   max_out_of_orderness=BOUND))
    by_user = clicks.key_by(lambda c: c["user"])

    # 10 s tumbling windows: the amount per user; late clicks within 30 s fire the window again
    spent = by_user.window(Tumbling("10s"), allowed_lateness=LATENESS).aggregate(
        "spent-per-10s", Sum(lambda c: c["amount"]), parallelism=2)
    spent.sink("spent", FileSink(f"{work}/spent"))          # WindowResult(key, start, end, value)
    spent.late().sink("too-late", FileSink(f"{work}/late"))  # clicks beyond the lateness, unchanged

    # 10 s windows every 5 s, and sessions closed by 3 s without a click
    (by_user.window(Sliding("10s", "5s")).aggregate("clicks-per-10s", Count(), parallelism=2)
            .sink("sliding", FileSink(f"{work}/sliding")))
    (by_user.window(Session("3s")).aggregate("clicks-per-session", Count(), parallelism=2)
            .sink("sessions", FileSink(f"{work}/sessions")))
    return flow
# --8<-- [end:graph]


def run(work: str, runtime: str = "spark", spark=None, crash: bool = True):
    """Run the job once; returns ``(result, outputs)`` with each sink's committed rows."""
    faults = [CrashAtRecord("spent-per-10s", subtask=1, record=200, how="exit", after_epoch=1)] if crash else []
    # --8<-- [start:run]
    result = build(work).run(guarantee="exactly-once",
                             checkpoint=ep.CheckpointConfig(interval="200ms", storage=f"file://{work}/checkpoints"),
                             channels=ep.ChannelConfig(batch_size=POLL),  # the source's poll size
                             runtime=runtime, spark=spark, faults=faults)
    # --8<-- [end:run]
    outputs = {name: list(read_committed(f"{work}/{name}")) for name in ("spent", "late", "sliding", "sessions")}
    return result, outputs


def _us(t: float) -> int:
    return round(t * 1_000_000)


def lateness_of(i: int) -> str:
    """``"on-time"``, ``"refires"`` (its tumbling window certainly fired, certainly not expired)
    or ``"dropped"`` (certainly expired), whatever the batching: the watermark when click ``i``
    arrives lies between the one a whole poll earlier and the one of every click before it."""
    w_lo = max(_us(c["ts"]) for c in CLICKS[:max(1, i - POLL + 1)]) - _us(BOUND) - 1
    w_hi = max(_us(c["ts"]) for c in CLICKS[:max(1, i)]) - _us(BOUND) - 1
    t = _us(CLICKS[i]["ts"])
    end = t - t % _us(10) + _us(10)
    if end - 1 > w_hi:
        return "on-time"
    if end - 1 <= w_lo and end - 1 + _us(LATENESS) > w_hi:
        return "refires"
    if end - 1 + _us(LATENESS) <= w_lo:
        return "dropped"
    raise AssertionError(f"click {i} {CLICKS[i]} is ambiguously late")


def oracle() -> dict:
    """Every sink's rows computed in plain Python, as multisets of tuples."""
    kinds = [lateness_of(i) for i in range(len(CLICKS))]
    on_time = [c for c, k in zip(CLICKS, kinds) if k == "on-time"]
    spent, refires = collections.Counter(), collections.defaultdict(list)
    for c, k in zip(CLICKS, kinds):
        start = (_us(c["ts"]) - _us(c["ts"]) % _us(10)) / 1e6
        if k == "on-time":
            spent[(c["user"], start)] += c["amount"]
        elif k == "refires":
            refires[(c["user"], start)].append(c["amount"])
    tumbling = collections.Counter()
    for window in set(spent) | set(refires):
        total = spent[window]
        if window in spent:
            tumbling[(window[0], window[1], window[1] + 10, total)] += 1
        for amount in refires[window]:  # each late click fires its window again, counted
            total += amount
            tumbling[(window[0], window[1], window[1] + 10, total)] += 1
    sliding = collections.Counter()
    for c in on_time:  # the replayed clicks are behind every sliding window's end: late, dropped
        t = _us(c["ts"])
        last = t - t % _us(5)
        for start in (last, last - _us(5)):
            sliding[(c["user"], start / 1e6, start / 1e6 + 10)] += 1
    sessions = collections.Counter()
    for user in USERS:
        times = sorted(_us(c["ts"]) for c in on_time if c["user"] == user)
        first = prev = times[0]
        n = 0
        for t in times:  # a click 3 s or more after the previous one opens a new session
            if t >= prev + _us(3):
                sessions[(user, first / 1e6, (prev + _us(3)) / 1e6, n)] += 1
                first, n = t, 0
            prev, n = t, n + 1
        sessions[(user, first / 1e6, (prev + _us(3)) / 1e6, n)] += 1
    late = collections.Counter(tuple(sorted(c.items())) for c, k in zip(CLICKS, kinds) if k == "dropped")
    return {"spent": tumbling, "late": late,
            "sliding": collections.Counter((u, s, e, n) for (u, s, e), n in sliding.items()),
            "sessions": sessions}


def as_counters(outputs: dict) -> dict:
    """The committed rows as the oracle's multisets."""
    rows = lambda name: [(r["key"], r["start"], r["end"], r["value"]) for r in outputs[name]]  # noqa: E731
    return {"spent": collections.Counter(rows("spent")), "sliding": collections.Counter(rows("sliding")),
            "sessions": collections.Counter(rows("sessions")),
            "late": collections.Counter(tuple(sorted(r.items())) for r in outputs["late"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default=os.environ.get("EPOCHAL_RUNTIME", "spark"), choices=["spark", "local"])
    parser.add_argument("--no-crash", action="store_true")
    args = parser.parse_args()
    result, outputs = run(tempfile.mkdtemp(prefix="epochal-windows-"), args.runtime, crash=not args.no_crash)
    print(f"{result.attempts} attempt(s), restored from epochs {result.restored_from[1:]}")
    got, expected = as_counters(outputs), oracle()
    for name in ("spent", "late", "sliding", "sessions"):
        print(f"  {name}: {sum(got[name].values())} rows; equal to plain Python: {got[name] == expected[name]}")
    if got != expected:
        raise SystemExit("the committed windows differ from the plain-Python windows")


if __name__ == "__main__":
    main()
