"""Reading checkpoints offline (epochal.state): map and value state with each encoding, loop
logs and unaligned channel state listed out of savepoints (and restored from them after
a rescale), and errors that name the damaged file."""
from __future__ import annotations

import collections
import json
import os
import pickle
import shutil
import time

import pyarrow as pa
import pytest

import epochal as ep
from epochal.errors import CheckpointStorageError, ConfigError
from epochal.sinks import FileSink, read_committed

from pipelines import canon, collatz_step, join, lines_from, running_counts, unique_dir, visits_golden, visits_loop

JOIN_N = 1200


@pytest.fixture(scope="module")
def joined(tmp_path_factory):
    """A finished join job (keyed map state "seen"); its storage URL."""
    tmp = tmp_path_factory.mktemp("join")
    storage = "file://" + unique_dir(tmp, "ckpt")
    join("join", unique_dir(tmp, "out"), n=JOIN_N).run(runtime="local",
                                                      checkpoint=ep.CheckpointConfig(interval=0.2, storage=storage,
                                                                                     inline_state=0))  # files
    return f"{storage}/join"


def join_leftovers(n: int = JOIN_N) -> dict:
    """Plain Python: what the join keeps in its map state at the end — the side of every
    id that never met its other side (orders: 3 splits of n // 3, payments: 2 of n // 4)."""
    orders = {s + 3 * i for s in range(3) for i in range(n // 3)}
    payments = {2 * (s + 2 * i) for s in range(2) for i in range(n // 4)}
    left = {oid: {"order": f"o{oid}"} for oid in orders - payments}
    left.update({pid: {"payment": pid * 10} for pid in payments - orders})
    return left


def test_map_state_of_a_job_directory_equals_the_oracle(joined):
    table = ep.state.read(joined, "join")  # the job directory: its newest checkpoint (the final one)
    assert json.loads(table.schema.metadata[b"state_kinds"]) == {"seen": "map"}
    assert table.schema.field("key").type == pa.int64() and table.schema.field("map_key").type == pa.string()
    got = collections.defaultdict(dict)
    for r in table.to_pylist():
        assert r["state"] == "seen"
        got[r["key"]][r["map_key"]] = r["value"]
    assert dict(got) == join_leftovers()


def test_encodings_and_filters(joined):
    auto = ep.state.read(joined, "join")
    pickled = ep.state.read(joined, "join", encoding="pickle")
    assert pickled.schema.field("value").metadata == {b"encoding": b"pickle"}
    assert [pickle.loads(v) for v in pickled.column("value").to_pylist()] == auto.column("value").to_pylist()
    assert auto.schema.field("value").type == pa.string()  # every value a str: typed
    as_repr = ep.state.read(joined, "join", encoding="repr", limit=5)
    assert as_repr.num_rows == 5 and as_repr.schema.field("key").type == pa.string()
    assert ep.state.read(joined, "join", state="nothing").num_rows == 0
    with pytest.raises(ConfigError, match="encoding"):
        ep.state.read(joined, "join", encoding="yaml")


def test_reading_the_wrong_operator_says_what_is_there(joined):
    with pytest.raises(ConfigError, match=r"no operator 'count'; its operators: join \(process\), orders \(source\)"):
        ep.state.read(joined, "count")
    with pytest.raises(ConfigError, match=r"operator 'out' is a sink: it has no keyed state \(keyed operators: join\)"):
        ep.state.read(joined, "out")
    (row,) = [r for r in ep.state.list_source_offsets(joined, "payments")]
    assert row["offsets"] == {"0": JOIN_N // 4, "1": JOIN_N // 4}  # the final checkpoint: all read


def test_missing_and_corrupt_files_are_named(tmp_path, joined):
    copy = str(tmp_path / "copy")
    ep.state.write_savepoint(ep.state.open_checkpoint(joined), copy)
    sp = ep.state.open_checkpoint(copy)
    state_file = next(h for h in sp.handles() if h.path.endswith("join-0.state"))
    path = os.path.join(copy, state_file.path)
    with open(path, "ab") as f:
        f.write(b"x")
    with pytest.raises(CheckpointStorageError, match=f"state file file://{path} is corrupt: size mismatch"):
        ep.state.read(copy, "join")
    with pytest.raises(CheckpointStorageError, match=f"file file://{path} is corrupt: size mismatch"):
        ep.state.open_checkpoint(copy).verify()
    os.unlink(path)
    with pytest.raises(CheckpointStorageError, match=f"state file file://{path} is missing"):
        ep.state.read(copy, "join")
    meta = os.path.join(copy, f"chk-{sp.epoch:010d}", "_metadata")
    with open(meta, "w") as f:
        f.write("{not json")
    with pytest.raises(CheckpointStorageError, match=f"file://{meta} is not valid JSON"):
        ep.state.read(copy, "join")
    with open(os.path.join(copy, "_savepoint"), "w") as f:
        f.write("[]")
    with pytest.raises(CheckpointStorageError, match=f"file://{copy}/_savepoint is corrupt: not a JSON object"):
        ep.state.open_checkpoint(copy)


# ------------------------------------------------------------------ loop logs
def collatz_after(n: int, steps: int) -> int:
    r = (n, n, 0)
    for _ in range(steps):
        r = collatz_step(r)
    return r[1]


def hop_until(tmp_path, make_flow, logged, hops=6, channels=None, **run):
    """Start the job, stop it with a savepoint; restore the next hop from that savepoint
    (new checkpoint storage) until ``logged(savepoint)`` holds records. Returns the savepoint."""
    previous = None
    for hop in range(hops):
        handle = make_flow(hop).start(runtime="local", restore_from=previous, channels=channels,
                                      checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c"),
                                                                     **run))
        deadline = time.monotonic() + 60
        while len(handle.completed_epochs) < 2:
            assert time.monotonic() < deadline and handle.running, handle.wait(0)
            time.sleep(0.01)
        asked = time.monotonic()
        url = handle.stop_with_savepoint(str(tmp_path / f"sp{hop}"), timeout=60)
        result = handle.wait(10)
        assert result.stopped_with_savepoint == url and result.attempts == 1, result.failures
        # the tasks end at once (a loop's feedback tasks once failed on the head's closed
        # channel, and the driver waited 30 s for them to "exit on their own")
        assert time.monotonic() - asked < 15, f"stopping with a savepoint took {time.monotonic() - asked:.1f} s"
        if logged(url, result.completed_epochs[-1]):
            return url
        previous = url
    pytest.fail(f"no savepoint with records in transit after {hops} stops")


def test_loop_logs_are_listed_copied_and_replayed_after_a_rescale(tmp_path, capfd):
    out = unique_dir(tmp_path, "out")

    def logged(url, epoch):
        rows = ep.state.list_loop_logs(url, records=True)
        assert sorted(r["subtask"] for r in rows) == [0, 1] and {r["operator"] for r in rows} == {"loop"}
        assert sum(r["records"] for r in rows) == epoch["loop_logged"]  # what the heads reported
        for r in rows:
            assert len(r["items"]) == r["records"]
            for n, c, k, passes in r["items"]:  # each is a true Collatz state of its number
                assert collatz_after(n, k) == c and passes == k
        return any(r["segments"] for r in rows)  # some head's log spilled into its own files

    url = hop_until(tmp_path, lambda hop: visits_loop("visits", out, 2, 400, log_memory_records=3), logged,
                    interval=0.1)
    assert "failed" not in capfd.readouterr().err  # no task failed on its way out (the tasks' stderr is ours)
    moved = str(tmp_path / "moved")
    shutil.move(url, moved)
    visits_loop("visits", out, 3, 400).run(runtime="local", restore_from=moved, checkpoint=ep.CheckpointConfig(
        interval=0.1, storage="file://" + unique_dir(tmp_path, "c")))
    assert canon(read_committed(out)) == visits_golden(400)


# ------------------------------------------------------------------ channel state
CHANNELS = ep.ChannelConfig(batch_size=64, credits=4)
UA_LINES = 2400


def slow(record):
    end = time.perf_counter() + 0.0003
    while time.perf_counter() < end:
        pass
    return record


def counting(name: str, out: str, count_parallelism: int = 2) -> ep.Dataflow:
    """Word count with a slow map behind the count: the count's input queues are full when
    barriers arrive, so unaligned snapshots hold channel state (as in test_unaligned_recovery)."""
    flow = ep.Dataflow(name, parallelism=2)
    (flow.source("lines", ep.sources.GeneratorSource(lines_from, num_splits=4, limit=UA_LINES // 4,
                                                     records_per_second=800.0))
        .flat_map("split", str.split).map("pair", lambda w: (w, 1)).key_by(lambda p: p[0])
        .reduce("count", lambda a, b: (a[0], a[1] + b[1]), parallelism=count_parallelism)
        .map("slow", slow, parallelism=count_parallelism).rebalance()
        .sink("out", FileSink(out), parallelism=2))
    return flow


def test_channel_state_is_listed_and_replayed_after_a_rescale(tmp_path):
    out = unique_dir(tmp_path, "out")

    def in_flight(url, epoch):
        rows = ep.state.list_channel_state(url, records=True)
        assert sum(r["records"] for r in rows) == epoch["channel_state_records"]
        assert all(len(r["items"]) == r["records"] and r["consumer"] in ("count", "out") for r in rows)
        return epoch["channel_state_records"] > 0

    url = hop_until(tmp_path, lambda hop: counting("ua", out), in_flight, channels=CHANNELS, interval=0.2,
                    unaligned=True)
    counting("ua", out, count_parallelism=3).run(
        runtime="local", restore_from=url, channels=CHANNELS,
        checkpoint=ep.CheckpointConfig(interval=0.3, storage="file://" + unique_dir(tmp_path, "c"), unaligned=True))
    assert canon(read_committed(out)) == canon(running_counts(UA_LINES, 4))
