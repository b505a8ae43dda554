"""A stop with a savepoint of a job of regions when one region's input has already ended
(the campaign's regions seeds 1002 and 1003, issue 46): the regions stop one after the
other (:func:`epochal.runtime.driver.regions.cut_order`), so a region that finished instead
of stopping must not fail the job's stop after the others stopped — its end is its cut
(:func:`~epochal.runtime.driver.region_savepoints.savepoint_of_end`) and a restore runs the stopped
regions on. Before that, ``stop_with_savepoint`` raised ``SavepointError`` with region
``main`` already stopped: no savepoint to restore, and main's input after its stop was never
read — silent loss. Checked against plain-Python counts."""
from __future__ import annotations

import time

import cloudpickle

import epochal as ep
from epochal.sinks import FileSink
from pipelines import unique_dir
import test_autonomous
import test_regions
from test_autonomous import CLICKS, ORDERS, Pass, click, counted, exact, oracle, order
from test_regions import Count

cloudpickle.register_pickle_by_value(test_regions)
cloudpickle.register_pickle_by_value(test_autonomous)

N_ORDERS, N_CLICKS = 2400, 200


def flow(out: str, rate: float | None) -> ep.Dataflow:
    """Figure 1(c): region ``main`` — orders (throttled at ``rate`` per split) and the
    clicks channel → a count per key → ``out``; region ``side`` — a few clicks, unthrottled,
    so its input ends long before main's."""
    f = ep.Dataflow("stop-after-end", parallelism=2)
    orders = f.source("orders", ep.sources.GeneratorSource(order, num_splits=2, limit=N_ORDERS // 2,
                                                           records_per_second=rate), region="main")
    clicks = f.source("clicks", ep.sources.GeneratorSource(click, num_splits=2, limit=N_CLICKS // 2),
                      region="side")
    tagged = clicks.key_by(lambda c: c).process("tag", Pass())
    (orders.union(tagged.autonomous("clicks-in"))
     .key_by(lambda k: k).process("count", Count()).sink("out", FileSink(out)))
    return f


def _stopped_after_side_finished(tmp_path, out: str) -> str:
    """Run the flow until side finished and main completed two epochs, then stop it with a
    savepoint while main reads on; the savepoint's URL."""
    handle = flow(out, 200.0).start(runtime="local", checkpoint=ep.CheckpointConfig(
        interval=0.1, storage="file://" + unique_dir(tmp_path, "c1")))  # 6 s of orders per split
    deadline = time.monotonic() + 60
    while (handle.regions["side"].running or len(handle.regions["main"].completed_epochs) < 2) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not handle.regions["side"].running, "side's input did not end"
    assert handle.regions["main"].running, "main ended before the stop"
    url = handle.stop_with_savepoint("file://" + unique_dir(tmp_path, "sp"), timeout=60)
    handle.wait(60)
    got, _ = counted(out, ORDERS)
    assert 0 < sum(got.values()) < N_ORDERS, f"the stop did not land while main read: {sum(got.values())} orders"
    return url


def test_a_stop_after_the_producing_region_finished_restores_both_exactly_once(tmp_path):
    """Side's input ends and side finishes while main reads on; the job is stopped with a
    savepoint and restored into fresh storage: every order and every click counted exactly
    once over both runs (the plain-Python oracle)."""
    out = unique_dir(tmp_path, "out")
    url = _stopped_after_side_finished(tmp_path, out)
    flow(out, None).run(runtime="local", restore_from=url,
                        checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c2")))
    got, final = counted(out, ORDERS)
    assert exact(got, oracle(order, N_ORDERS)), ("orders lost or doubled across the stop", final)
    got, final = counted(out, CLICKS)
    assert exact(got, oracle(click, N_CLICKS)), ("clicks lost or doubled across the stop", final)


def test_the_savepoint_of_a_finished_region_allows_a_guarantee_switch(tmp_path):
    """The same stop, then a restore under at-least-once (the campaign's regions seed 30006:
    a guarantee switch). A region that finished committed every transaction of its end, so
    its part of the savepoint says so as a stop's does (``_sinks_committed``); before, the
    restore was refused for region ``side`` ("checkpoint N was taken exactly-once and its
    sinks may hold pre-committed epochs") although the same stop is allowed when no region
    had finished. Afterwards no order and no click is lost (each key's final count reaches
    the plain-Python truth)."""
    out = unique_dir(tmp_path, "out")
    url = _stopped_after_side_finished(tmp_path, out)
    flow(out, None).run(runtime="local", restore_from=url, guarantee="at-least-once",
                        checkpoint=ep.CheckpointConfig(storage="file://" + unique_dir(tmp_path, "c2")))
    for keys, truth in ((ORDERS, oracle(order, N_ORDERS)), (CLICKS, oracle(click, N_CLICKS))):
        _, final = counted(out, keys)
        assert all(final.get(k, 0) >= c for k, c in truth.items()), ("lost across the switch", final, truth)
