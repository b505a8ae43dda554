"""Issue 11 ("No silent data loss")'s reproductions through the public API, run against old and new code:
prints one line per case with what happened. Not a test (pytest does not collect it): the
closing note of issue 11 quotes its output on the commit before the issue and on main.

    python tests/probes/no_silent_loss_before_after.py <empty tmp dir>
    # the old code: git worktree add /tmp/old cde6aa5~1, then run it with PYTHONPATH=/tmp/old
"""
import collections
import dataclasses
import os
import sys
import time
import traceback

import epochal as ep
from epochal.sinks import FileSink, read_committed

TMP = sys.argv[1]
WORDS = [f"w{i}" for i in range(37)]
PER_SPLIT = 600


def words_from(split, offset):
    return (WORDS[(split * 7 + i * 13) % len(WORDS)] for i in range(offset, PER_SPLIT))


def oracle():
    c = collections.Counter()
    for s in range(2):
        c.update(words_from(s, 0))
    return c


def counting(out, name="count", max_parallelism=128):
    f = ep.Dataflow("probe", parallelism=2, max_parallelism=max_parallelism)
    (f.source("words", ep.sources.GeneratorSource(words_from, num_splits=2, records_per_second=400.0))
        .map("pair", lambda w: (w, 1)).key_by(lambda p: p[0])
        .reduce(name, lambda a, b: (a[0], a[1] + b[1]))
        .sink("out", FileSink(out)))
    return f


def final_counts(out):
    best = {}
    for r in read_committed(out):
        w, n = r
        best[w] = max(best.get(w, 0), n)
    return best


def outcome(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        return f"error: {type(exc).__name__}: {' | '.join(str(exc).splitlines()[:3])[:300]}"


def stop_midway(out, storage):
    handle = counting(out).start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2, storage=storage))
    deadline = time.monotonic() + 60
    while len(handle.completed_epochs) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    handle.cancel()
    try:
        handle.wait(30)
    except Exception:
        pass


def resumed(case, **change):
    out, storage = f"{TMP}/{case}-out", f"file://{TMP}/{case}-ckpt"
    stop_midway(out, storage)

    def run():
        counting(out, **change).run(runtime="local", resume=True,
                                   checkpoint=ep.CheckpointConfig(interval=0.2, storage=storage))
        got, want = final_counts(out), oracle()
        wrong = sum(1 for w in want if got.get(w) != want[w])
        return f"finished; {wrong} of {len(want)} keys with wrong final counts"
    return outcome(run)


print("1a resume with max_parallelism 128 -> 64:", resumed("mp", max_parallelism=64))
print("1b resume with the stateful operator renamed:", resumed("rename", name="count2"))


def two_sinks():
    out = f"{TMP}/two"
    f = ep.Dataflow("two", parallelism=1)
    s = f.source("n", ep.sources.CollectionSource(list(range(200))))
    s.filter("even", lambda x: x % 2 == 0).sink("a", FileSink(out))
    s.filter("odd", lambda x: x % 2 == 1).sink("b", FileSink(out))
    f.run(runtime="local")
    return f"finished; {len(list(read_committed(out)))} of 200 records in the directory"


print("2  two FileSinks on one directory:", outcome(two_sinks))


@dataclasses.dataclass(frozen=True)
class Word:
    text: str


def main_class():
    out = f"{TMP}/main"
    f = ep.Dataflow("mainclass", parallelism=2)
    (f.source("w", ep.sources.CollectionSource([Word(w) for w in WORDS * 3]))
        .key_by(lambda w: w.text).reduce("n", lambda a, b: a).map("txt", lambda w: w.text).sink("out", FileSink(out)))
    f.run(runtime="local", restart=ep.RestartStrategy(max_attempts=1))
    return f"finished; {len(list(read_committed(out)))} records"


print("3  a __main__ dataclass crossing a channel:", outcome(main_class))


def flat_map_str():
    out = f"{TMP}/fm"
    f = ep.Dataflow("fm", parallelism=1)
    f.source("s", ep.sources.CollectionSource(["ab", "cd"])).flat_map("up", str.upper).sink("out", FileSink(out))
    f.run(runtime="local", restart=ep.RestartStrategy(max_attempts=1))
    return f"finished; output {sorted(read_committed(out))}"


print("5a flat_map returning a str:", outcome(flat_map_str))


def sink_is_file():
    path = f"{TMP}/afile"
    open(path, "w").close()
    f = ep.Dataflow("nd", parallelism=1)
    f.source("s", ep.sources.CollectionSource([1, 2])).sink("out", FileSink(path))
    t0 = time.monotonic()
    try:
        f.run(runtime="local", restart=ep.RestartStrategy(max_attempts=3, delay=0))
    finally:
        print(f"   (took {time.monotonic() - t0:.1f} s)")
    return "finished"


print("5b a sink path that is a file:", outcome(sink_is_file))


def rebalance_key_by():
    f = ep.Dataflow("rk", parallelism=2)
    f.source("s", ep.sources.CollectionSource([1, 2])).rebalance().key_by(lambda x: x).map("m", lambda x: x) \
        .sink("out", FileSink(f"{TMP}/rk"))
    f.plan()
    return "planned without complaint"


print("5c rebalance().key_by(...):", outcome(rebalance_key_by))
