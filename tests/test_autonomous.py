"""Autonomous channels between regions (seed 000 §3.2, Figure 1(c); epochal.regions.relay):
an operator of region "main" reads one consistent input (orders) and one autonomous input
(clicks, produced by region "side"). Checked against plain-Python oracles: main's own input
stays exact whatever fails; clicks cross at least once when only "side" fails (it replays)
and at most once when "main" fails (the channel is not replayed); a failure on either side
never restarts the other."""
from __future__ import annotations

import collections
import json
import os
import signal
import threading
import time

import cloudpickle
import pytest

import epochal as ep
from epochal.errors import PipelineDefinitionError
from epochal.sinks import FileSink
from epochal.testing import CrashAtRecord
from pipelines import output, unique_dir
import test_regions
from test_regions import Count, Opened, opens

cloudpickle.register_pickle_by_value(test_regions)  # its classes are unpickled in the tasks

ORDERS, CLICKS = [f"o{i}" for i in range(7)], [f"c{i}" for i in range(5)]


def order(split: int, offset: int):
    i = offset
    while True:
        yield ORDERS[(split * 3 + i) % len(ORDERS)]
        i += 1


def click(split: int, offset: int):
    i = offset
    while True:
        yield CLICKS[(split + i * 2) % len(CLICKS)]
        i += 1


def figure_1c(name: str, out: str, *, n_orders: int, n_clicks: int, rate: float, main, side,
              pids_main: str | None = None, pids_side: str | None = None, parallelism: int = 2) -> ep.Dataflow:
    """Region ``main``: orders and the clicks channel → a running count per key → ``out``.
    Region ``side``: clicks → ``tag`` → the autonomous channel into main."""
    flow = ep.Dataflow(name, parallelism=parallelism)
    orders = flow.source("orders", ep.sources.GeneratorSource(order, num_splits=2, limit=n_orders // 2,
                                                              records_per_second=rate), region=main)
    clicks = flow.source("clicks", ep.sources.GeneratorSource(click, num_splits=2, limit=n_clicks // 2,
                                                              records_per_second=rate), region=side)
    tagged = clicks.key_by(lambda c: c).process("tag", Pass(pids_side))
    (orders.union(tagged.autonomous("clicks-in"))
     .key_by(lambda k: k).process("count", Count(pids_main)).sink("out", FileSink(out)))
    return flow


class Pass(ep.KeyedProcessFunction):
    """Passes records on; marks its processes (``test_regions.Opened``)."""

    def __init__(self, pid_dir: str | None = None):
        self.opened = Opened(pid_dir)

    def open(self, ctx):
        self.opened.mark()

    def process(self, key, record):
        yield record


def oracle(gen, n: int) -> collections.Counter:
    return collections.Counter(k for s in range(2) for k, _ in zip(gen(s, 0), range(n // 2)))


def counted(out: str, keys) -> tuple[collections.Counter, dict]:
    """The count outputs ``[key, n]`` of ``keys`` and each key's highest ``n``."""
    got = collections.Counter(t for t in output(out) if json.loads(t)[0] in keys)
    final: dict = {}
    for text in got:
        k, n = json.loads(text)
        final[k] = max(final.get(k, 0), n)
    return got, final


def exact(got: collections.Counter, truth: collections.Counter) -> bool:
    return got == collections.Counter(json.dumps([k, i]) for k, c in truth.items() for i in range(1, c + 1))


# ------------------------------------------------------------------ layout (build time)
def test_an_autonomous_channel_keeps_two_regions_apart():
    flow = figure_1c("layout", "/tmp/never", n_orders=10, n_clicks=10, rate=1.0, main="main", side="side")
    parts = {p.name: p.nodes for p in flow.regions()}
    assert parts == {"main": ("orders", "clicks-in", "count", "out"), "side": ("clicks", "tag")}
    # unannotated components on either side of a channel are regions of their own
    plain = ep.Dataflow("plain", parallelism=1)
    s = plain.source("s", ep.sources.CollectionSource([1])).map("m", str)
    s.autonomous().map("n", str).sink("o", FileSink("/tmp/o"))
    assert {p.name: p.nodes for p in plain.regions()} == {"s": ("s", "m"), "m.autonomous": ("m.autonomous", "n", "o")}


def test_savepoints_take_each_channels_reader_before_its_producer():
    """``cut_order``: a reader's cut before its producers' (a chain side → main → report,
    listed producer first), the layout order otherwise, and a cycle of channels still lists
    every region once."""
    from epochal.regions.layout import RegionPart
    from epochal.runtime.driver.regions import cut_order, region_channels

    flow = figure_1c("order", "/tmp/never", n_orders=10, n_clicks=10, rate=1.0, main="main", side="side")
    parts = flow.regions()
    assert region_channels(flow, parts) == [("side", "main")]
    assert cut_order(parts, region_channels(flow, parts)) == ["main", "side"]
    named = [RegionPart(ep.Region(n), (n,)) for n in ("side", "main", "report", "other")]
    assert cut_order(named, [("side", "main"), ("main", "report")]) == ["report", "main", "side", "other"]
    cyclic = cut_order(named, [("side", "main"), ("main", "side")])
    assert sorted(cyclic) == sorted(p.name for p in named) and cyclic.index("main") < cyclic.index("side")


def test_the_command_line_shows_the_channel(tmp_path, capsys):
    from epochal.cli import main

    script = tmp_path / "fig.py"
    script.write_text("import epochal as ep\n"
                      "flow = ep.Dataflow('fig', parallelism=1)\n"
                      "a = flow.source('a', ep.sources.CollectionSource([1]), region='main')\n"
                      "b = flow.source('b', ep.sources.CollectionSource([2]), region='side')\n"
                      "a.union(b.autonomous('b-in')).map('m', str).sink('o', ep.sinks.FileSink('/tmp/o'))\n")
    assert main(["regions", f"{script}:flow"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  operators: a, b-in, m, o" in out and "  operators: b" in out
    assert "  autonomous channel: b -> b-in (at most once into this region)" in out


def test_autonomous_channel_errors_name_the_operators():
    flow = ep.Dataflow("errs", parallelism=1)
    s = flow.source("s", ep.sources.CollectionSource([(1, 2)]))
    with pytest.raises(PipelineDefinitionError, match="'s.autonomous' after 'wm'.*event time.*with_watermarks"):
        s.with_watermarks("wm", timestamp=lambda r: r[0]).autonomous("s.autonomous")
    with pytest.raises(PipelineDefinitionError, match="already partitioned \\(hash\\).*key_by.*after autonomous"):
        s.key_by(lambda r: r[0]).autonomous()
    loop = ep.Dataflow("same", parallelism=1)
    a = loop.source("a", ep.sources.CollectionSource([1]))
    a.union(a.autonomous("x")).map("both", str).sink("o", FileSink("/tmp/o"))  # both ends in one region
    with pytest.raises(PipelineDefinitionError, match="autonomous channel from 'a' into 'x' has both ends in region"):
        loop.regions()


# ------------------------------------------------------------------ local runtime, injected crashes
N = 6000


def crash_in(tmp_path, failing: str, operator: str, record: int):
    """Figure 1(c) with a crash at ``record`` of ``operator`` in region ``failing`` (its
    epochs 0.3 s, the other's 0.05 s): the result, the output and the other region's opens."""
    out, pids = unique_dir(tmp_path, "out"), tmp_path / "pids"
    pids.mkdir()
    other = "side" if failing == "main" else "main"
    intervals = {failing: 0.3, other: 0.05}
    regions = {name: ep.Region(name, checkpoint=ep.CheckpointConfig(interval=intervals[name])) for name in intervals}
    result = figure_1c(f"{failing}-fails", out, n_orders=N, n_clicks=N, rate=1500.0, **{f"pids_{other}": str(pids)},
                       **regions).run(
        runtime="local", checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")),
        faults=[CrashAtRecord(operator, subtask=0, record=record, how="exit", after_epoch=1)])
    assert result.regions[failing].attempts == 2, f"the crash in region {failing!r} did not fire"
    untouched = result.regions[other]
    assert untouched.attempts == 1 and not untouched.failures, f"region {other!r} was restarted: {untouched.failures}"
    assert len(opens(pids)) == 2, f"region {other!r} opened its operator again"
    got, _ = counted(out, ORDERS)
    assert exact(got, oracle(order, N)), "main's own input is not exact"
    return out


def test_the_producing_region_fails_clicks_cross_at_least_once_and_main_is_untouched(tmp_path):
    out = crash_in(tmp_path, "side", "tag", record=900)
    _, final = counted(out, CLICKS)
    truth = oracle(click, N)
    assert all(final.get(k, 0) >= c for k, c in truth.items()), (final, truth)  # none lost
    assert sum(final.values()) > sum(truth.values()), "side replayed nothing: the crash landed before any handover"


def test_the_consuming_region_fails_clicks_cross_at_most_once_and_side_is_untouched(tmp_path):
    out = crash_in(tmp_path, "main", "count", record=1500)
    got, final = counted(out, CLICKS)
    truth = oracle(click, N)
    assert all(final.get(k, 0) <= c for k, c in truth.items()), (final, truth)  # none twice
    assert exact(got, collections.Counter(final)), "main's count of the clicks it took is not exact"


def test_an_autonomous_region_takes_no_snapshot_and_replays_from_its_start(tmp_path):
    """Region side is ``ep.Autonomous``: no periodic epoch, so a crash in it restarts it from
    its sources' start (no restore), its clicks cross again (duplicates downstream, none
    lost), and main — consistent, 0.05 s epochs — is never restarted and stays exact."""
    out = unique_dir(tmp_path, "out")
    with pytest.raises(PipelineDefinitionError, match="takes no periodic snapshot"):
        ep.Autonomous("side", checkpoint=ep.CheckpointConfig(interval=0.1))
    with pytest.raises(PipelineDefinitionError, match="at-least-once"):
        ep.Autonomous("side", guarantee="exactly-once")
    result = figure_1c("autonomous-side", out, n_orders=N, n_clicks=N, rate=1500.0,
                       main=ep.Region("main", checkpoint=ep.CheckpointConfig(interval=0.05)),
                       side=ep.Autonomous("side")).run(
        runtime="local", checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")),
        faults=[CrashAtRecord("tag", subtask=0, record=900, how="exit")])
    side, main = result.regions["side"], result.regions["main"]
    assert side.attempts == 2 and side.restored_from == [None, None], "the autonomous region restored a snapshot"
    assert side.guarantee == "at-least-once" and all(e["reason"] == "final" for e in side.completed_epochs)
    assert main.attempts == 1 and not main.failures and len(main.completed_epochs) > 1
    got, _ = counted(out, ORDERS)
    assert exact(got, oracle(order, N)), "main's own input is not exact"
    _, final = counted(out, CLICKS)
    truth = oracle(click, N)
    assert all(final.get(k, 0) >= c for k, c in truth.items()), (final, truth)  # none lost
    assert sum(final.values()) > sum(truth.values()), "side replayed nothing: the crash landed before any handover"


# ------------------------------------------------------------------ Spark, SIGKILLs from outside
@pytest.mark.spark
def test_side_sigkilled_repeatedly_on_spark_main_stays_exact(tmp_path, spark):
    """The producing region's task processes are SIGKILLed from outside, twice, while both
    regions run: 'side' restarts each time, 'main' never (its processes opened once), main's
    own input is exact and no click is lost."""
    n = 8000
    out = unique_dir(tmp_path, "out")
    pids_main, pids_side = tmp_path / "pm", tmp_path / "ps"
    pids_main.mkdir()
    pids_side.mkdir()
    flow = figure_1c("spark-autonomous", out, n_orders=n, n_clicks=n, rate=800.0, pids_main=str(pids_main),
                     pids_side=str(pids_side),
                     main=ep.Region("main", checkpoint=ep.CheckpointConfig(interval=0.1)),
                     side=ep.Region("side", checkpoint=ep.CheckpointConfig(interval=0.2)))
    handle = flow.start(spark=spark, checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c")))
    killed: list[int] = []

    def kill_twice():
        side, main = handle.regions["side"], handle.regions["main"]
        for round_ in range(2):
            deadline = time.monotonic() + 120
            while len(opens(pids_side)) < 2 * (round_ + 1) or not side.completed_epochs:
                if time.monotonic() > deadline or not side.running:
                    return
                time.sleep(0.01)
            time.sleep(0.3)  # let the restarted side hand over records again
            for name in reversed(opens(pids_side)):
                pid = int(name.split("-")[0])
                if pid in killed or not (side.running and main.running):
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    break
                except ProcessLookupError:
                    continue

    killer = threading.Thread(target=kill_twice)
    killer.start()
    result = handle.wait(300)
    killer.join()
    main, side = result.regions["main"], result.regions["side"]
    assert len(killed) == 2 and side.attempts >= 3, f"SIGKILLs {killed} did not restart 'side' twice: {side.failures}"
    assert main.attempts == 1 and not main.failures, f"region 'main' was restarted: {main.failures}"
    assert len(opens(pids_main)) == 2, f"region 'main' opened its operator again: {opens(pids_main)}"
    got, _ = counted(out, ORDERS)
    assert exact(got, oracle(order, n))
    _, final = counted(out, CLICKS)
    assert all(final.get(k, 0) >= c for k, c in oracle(click, n).items()), final


# ------------------------------------------------------------------ savepoints: the channel is part of the cut
def test_a_savepoint_holds_what_the_channel_carries_and_a_restore_hands_it_over(tmp_path, monkeypatch):
    """Stop with a savepoint while clicks cross (nothing fails), restore into fresh storage:
    what the lanes held and what main took after its last epoch belongs to the savepoint
    (side's relay sink snapshots what main has not checkpointed yet), so over both runs
    every click is counted exactly once — as every order is. Lanes of 40 records: main (the
    reader) stops first, side's lane fills, and side still reaches its stop barrier."""
    from epochal.regions import relay

    monkeypatch.setattr(relay, "DEFAULT_CAPACITY", 40)
    n = 6000
    out = unique_dir(tmp_path, "out")

    def job(rate):
        return figure_1c("sp-channel", out, n_orders=n, n_clicks=n, rate=rate,
                         main=ep.Region("main", checkpoint=ep.CheckpointConfig(interval=0.3)),
                         side=ep.Region("side", checkpoint=ep.CheckpointConfig(interval=0.05)))
    handle = job(600.0).start(runtime="local", checkpoint=ep.CheckpointConfig(
        storage="file://" + unique_dir(tmp_path, "c1")))  # 5 s of input per source subtask
    deadline = time.monotonic() + 60
    while (sum(c["taken"] for c in handle.relay.stats().values()) < 300
           or min(len(h.completed_epochs) for h in handle.regions.values()) < 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    url = handle.stop_with_savepoint("file://" + unique_dir(tmp_path, "sp"), timeout=60)
    first = handle.wait(60)
    assert first.stopped_with_savepoint == url
    assert handle.relay.capacity == 40
    queued = sum(c["queued"] for c in handle.relay.stats().values())
    assert queued > 2 * 40, f"no lane filled past its capacity while the job stopped: {queued} queued"
    _, final = counted(out, CLICKS)
    assert 0 < sum(final.values()) < n, f"the stop did not land while clicks crossed: {final}"
    job(None).run(runtime="local", restore_from=url,
                  checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c2")))
    got, _ = counted(out, ORDERS)
    assert exact(got, oracle(order, n)), "main's own input is not exact"
    got, final = counted(out, CLICKS)
    assert exact(got, oracle(click, n)), ("clicks were lost or doubled across the savepoint", final,
                                          {k: c for k, c in got.items() if c > 1})


DRIVER = """
import sys, time
sys.path.insert(0, {tests!r})
import cloudpickle, epochal as ep, test_autonomous
cloudpickle.register_pickle_by_value(test_autonomous)
flow = test_autonomous.driver_death_job({out!r}, 600.0)
handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(storage={url!r}))
deadline = time.monotonic() + 60
taken = lambda: sum(c["taken"] for c in handle.relay.stats().values())
main = handle.regions["main"]
while len(main.completed_epochs) < 2 or not handle.regions["side"].completed_epochs:
    if time.monotonic() > deadline or not handle.running:
        sys.exit("no epochs within 60 s")
    time.sleep(0.02)
epochs, since = len(main.completed_epochs), taken()
while taken() < since + 300:  # 300 clicks taken since main's latest epoch: main's checkpoint lacks them
    if time.monotonic() > deadline or not handle.running:
        sys.exit("no clicks crossed within 60 s")
    if len(main.completed_epochs) != epochs:
        epochs, since = len(main.completed_epochs), taken()
    time.sleep(0.01)
print("CROSSED", flush=True)
time.sleep(60)
"""


DRIVER_N = 6000  # 5 s of input at 600 records/s per source subtask


def driver_death_job(out: str, rate):
    return figure_1c("driver-dies", out, n_orders=DRIVER_N, n_clicks=DRIVER_N, rate=rate,
                     main=ep.Region("main", checkpoint=ep.CheckpointConfig(interval=1.0)),
                     side=ep.Region("side", checkpoint=ep.CheckpointConfig(interval=0.05)))


def test_a_driver_that_dies_loses_nothing_the_channel_carried(tmp_path):
    """The driver is SIGKILLed while clicks cross, 300 clicks after main's latest epoch (the
    relay's lanes and what main took die with it; side's latest epoch is later); resumed
    from each region's latest checkpoint, the lanes are refilled from side's snapshots:
    every click is counted at least once (main's count of what it took stays exact), and
    every order exactly once."""
    import subprocess
    import sys

    out, url = unique_dir(tmp_path, "out"), "file://" + unique_dir(tmp_path, "c")
    script = DRIVER.format(tests=os.path.dirname(__file__), out=out, url=url)
    log = tmp_path / "driver.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        if proc.stdout.readline().strip() != "CROSSED":
            proc.kill()
            proc.wait()
            pytest.fail(f"the driver did not get clicks across: {log.read_text()[-3000:]}")
    finally:
        proc.kill()
        proc.wait()
    _, before = counted(out, CLICKS)
    assert sum(before.values()) < DRIVER_N, "the job had finished before its driver died"
    result = driver_death_job(out, None).run(runtime="local", resume=True, checkpoint=ep.CheckpointConfig(storage=url))
    assert all(r.restored_from[0] is not None for r in result.regions.values()), result.regions
    got, _ = counted(out, ORDERS)
    assert exact(got, oracle(order, DRIVER_N)), "main's own input is not exact"
    got, final = counted(out, CLICKS)
    truth = oracle(click, DRIVER_N)
    assert all(final.get(k, 0) >= c for k, c in truth.items()), ("clicks were lost with the driver", final, truth)
    assert exact(got, collections.Counter(final)), "main's count of the clicks it took is not exact"


def test_a_savepoint_while_both_regions_run_restores_every_click_exactly_once(tmp_path):
    """``handle.savepoint()`` (no stop) while clicks cross: main's savepoint is taken before
    side's and side keeps, in its savepoint, every click main's does not hold. The job is
    cancelled soon after and restored from the savepoint: each key's final count equals the
    oracle's (a lost click makes it smaller, a doubled one larger; what the cancelled run
    committed after the savepoint is counted again from the savepoint's state)."""
    n = 6000
    out = unique_dir(tmp_path, "out")

    def job(out, rate):
        return figure_1c("sp-running", out, n_orders=n, n_clicks=n, rate=rate,
                         main=ep.Region("main", checkpoint=ep.CheckpointConfig(interval=0.05)),
                         side=ep.Region("side", checkpoint=ep.CheckpointConfig(interval=0.05)))
    handle = job(out, 600.0).start(runtime="local", checkpoint=ep.CheckpointConfig(
        storage="file://" + unique_dir(tmp_path, "c1")))
    deadline = time.monotonic() + 60
    while (sum(c["taken"] for c in handle.relay.stats().values()) < 600
           or min(len(h.completed_epochs) for h in handle.regions.values()) < 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    url = handle.savepoint("file://" + unique_dir(tmp_path, "sp"), timeout=60)
    assert handle.running, "the job ended before its savepoint"
    handle.cancel()
    with pytest.raises(ep.JobFailedError, match="cancelled"):
        handle.wait(60)
    _, cancelled = counted(out, CLICKS)
    # midway: some clicks committed, not all (a busy machine may take seconds over the savepoint)
    assert 0 < sum(cancelled.values()) < n, f"not cancelled midway: {cancelled}"
    job(out, None).run(runtime="local", restore_from=url,
                       checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c2")))
    _, final = counted(out, ORDERS)
    assert final == dict(oracle(order, n)), "main's own input is not exact"
    _, final = counted(out, CLICKS)
    assert final == dict(oracle(click, n)), ("clicks were lost or doubled across the savepoint", final)


def test_a_restore_that_changes_a_channel_producers_parallelism_is_refused(tmp_path):
    """The lanes are per producer subtask: restoring side's relay sink at another
    parallelism is refused, naming the channel's operator and what to keep."""
    out = unique_dir(tmp_path, "out")

    def job(rate, parallelism):
        return figure_1c("sp-rescale", out, n_orders=3000, n_clicks=3000, rate=rate, parallelism=parallelism,
                         main=ep.Region("main", checkpoint=ep.CheckpointConfig(interval=0.05)),
                         side=ep.Region("side", checkpoint=ep.CheckpointConfig(interval=0.05)))
    handle = job(600.0, 2).start(runtime="local", checkpoint=ep.CheckpointConfig(
        storage="file://" + unique_dir(tmp_path, "c1")))
    deadline = time.monotonic() + 60
    while min(len(h.completed_epochs) for h in handle.regions.values()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    url = handle.stop_with_savepoint("file://" + unique_dir(tmp_path, "sp"), timeout=60)
    handle.wait(60)
    with pytest.raises(ep.JobFailedError, match=r"tag-clicks-in.out.*parallelism 3.*parallelism 2.*unchanged"):
        job(None, 3).run(runtime="local", restore_from=url, restart=ep.RestartStrategy(max_attempts=0),
                         checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c2")))
