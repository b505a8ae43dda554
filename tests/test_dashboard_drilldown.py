"""The dashboard's drill-down pieces without a browser (issue 49): per-subtask rows and their
spread, the exceptions list, a checkpoint's per-task page through the server, the rates of a
progress event that fell between two task reports, the graph layout's box widths, and the
page's number formatting (``static/format.js`` run by node). The views in a real browser
against a real job are in ``test_dashboard_browser.py``."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import epochal as ep
from epochal.epochs.history import EpochHistory
from epochal.metrics.progress import ProgressBuilder
from epochal.ui.drilldown import TRACE_CHARS, exceptions
from epochal.ui.layout import SMALL_CHAR, NAME_CHAR, graph_view
from epochal.ui.model import DashboardModel
from epochal.ui.server import DashboardServer
from test_dashboard import _completed, _get

FORMAT_JS = Path(__file__).resolve().parent.parent / "epochal" / "ui" / "static" / "format.js"


def _plan():
    import pipelines

    return pipelines.wordcount("drill", "/tmp/never-run").plan()


def _report(t, n, bp=0.0):
    return {"time": t, "records_in": n, "records_out": n, "backpressure_s": bp, "queued_batches": 0,
            "watermark": -2**62, "operators": {"lines": (n, n)}, "cpu_s": 0.0}


def test_a_progress_event_between_two_task_reports_keeps_the_tasks_rate():
    """Before: the event built when no task reported since the previous one read 0 rec/s (7 of
    60 readings of a steady job). Now it keeps the rate of the task's newest report."""
    plan = _plan()
    source = next(t.id for t in plan.tasks if t.is_source)
    builder = ProgressBuilder(plan)
    t0 = time.time() - 2.0
    rates = [builder.build({"state": "running"}, {source: r}, None)
             for r in (_report(t0, 0), _report(t0 + 1.0, 100), _report(t0 + 1.0, 100), _report(t0 + 2.0, 300))]
    task_rates = [e["tasks"][source]["records_in_per_s"] for e in rates]
    assert task_rates == [0.0, pytest.approx(100.0), pytest.approx(100.0), pytest.approx(200.0)]
    assert rates[2]["records_in_per_s"] == pytest.approx(100.0)  # the job's rate too
    assert rates[2]["tasks"][source]["operators"]["lines"]["records_in_per_s"] == pytest.approx(100.0)


def _progress(plan):
    """A progress event of two source subtasks that differ: one at 97 % back-pressure."""
    sources = sorted(t.id for t in plan.tasks if t.is_source)
    tasks = {sources[0]: {"records_in": 500, "records_out": 500, "records_in_per_s": 250.0, "records_out_per_s": 250.0,
                          "backpressure_ratio": 0.97, "cpu_load": 0.8, "watermark": None, "pid": 11,
                          "operators": {"lines": {"records_in": 500, "records_out": 500, "records_in_per_s": 250.0,
                                                  "records_out_per_s": 250.0}}},
             sources[1]: {"records_in": 40, "records_out": 40, "records_in_per_s": 0.0, "records_out_per_s": 0.0,
                          "backpressure_ratio": 0.0, "cpu_load": 0.1, "watermark": 12.5, "pid": 12,
                          "operators": {"lines": {"records_in": 40, "records_out": 40, "records_in_per_s": 0.0,
                                                  "records_out_per_s": 0.0}}}}
    return sources, {"time": 100.0, "tasks": tasks, "operators": {"lines": {"records_in": 540, "records_out": 540,
                                                                              "records_in_per_s": 250.0,
                                                                              "records_out_per_s": 250.0}}}


def test_an_operator_has_a_row_per_subtask_and_its_box_shows_the_spread():
    plan = _plan()
    sources, progress = _progress(plan)
    history = EpochHistory(10)
    entry = _completed(1, 100.0, 0.3)
    entry["tasks"] = {sources[0]: {"ack_s": 0.2, "state_bytes": 4096}, sources[1]: {"ack_s": 0.1, "state_bytes": 64}}
    history.add_completed(entry)
    model = DashboardModel(plan, lambda: {"state": "running", "generation": 0, "history": history}, lambda: progress)
    ops = model.view()["operators"]
    rows = ops["lines"]["subtasks"]
    assert [r["task"] for r in rows] == sources and [r["subtask"] for r in rows] == [0, 1]
    assert [r["records_in_per_s"] for r in rows] == [250.0, 0.0] and [r["backpressure"] for r in rows] == [0.97, 0.0]
    assert [r["state_bytes"] for r in rows] == [4096, 64] and rows[1]["watermark"] == 12.5
    spread = ops["lines"]["spread"]["backpressure"]
    assert (spread["min"], spread["max"], spread["argmin"], spread["argmax"]) == (0.0, 0.97, 1, 0)
    assert ops["lines"]["backpressure"] == 0.97  # the box's one figure is the highest; the spread shows the lowest
    keyed = ops["count"]["subtasks"]  # subtasks that have not reported yet still have their row
    assert len(keyed) == 2 and all(r["reported"] is False for r in keyed)


def test_exceptions_keep_every_failure_with_its_traceback_bounded():
    long_trace = "Traceback (most recent call last):\n" + "\n".join(f'  File "f.py", line {i}' for i in range(300)) \
        + "\nValueError: bad record 7"
    timeline = [{"generation": 0, "failed_s": 3.5, "restored_epoch": None,
                 "cause": "task count[1]: ValueError: bad record 7\n" + long_trace},
                {"generation": 1, "failed_s": 9.0, "restored_epoch": 4, "cause": "task pair[0] disconnected (killed)"},
                {"generation": 2, "restored_epoch": 6, "cause": None}]
    failovers = [{"generation": 3, "tasks": ["a[0]", "b[0]"], "cause": "task a[0] exited", "restored_epoch": 7}]
    rows = exceptions(timeline, failovers)
    assert [(r["kind"], r["generation"], r["restored_epoch"]) for r in rows] == \
        [("attempt", 0, 4), ("attempt", 1, 6), ("failover", 3, 7)]
    assert rows[0]["cause"] == "task count[1]: ValueError: bad record 7"
    trace = rows[0]["traceback"]
    assert trace.startswith("Traceback") and trace.endswith("ValueError: bad record 7")  # head and tail kept
    assert len(trace) <= TRACE_CHARS + 10 and "lines left out" in trace
    assert rows[1]["traceback"] == "" and rows[2]["tasks"] == ["a[0]", "b[0]"]


def test_a_checkpoints_page_has_every_tasks_ack_through_the_server():
    plan = _plan()
    history = EpochHistory(10)
    entry = _completed(1, 100.0, 0.3)
    entry["tasks"]["a[0]"].update(bytes=10, state_bytes=100, snapshot_kind="aligned")
    history.add_completed(entry)
    history.add_aborted({"epoch": 2, "reason": "declined", "detail": "task b[0] declined"})
    model = DashboardModel(plan, lambda: {"state": "running", "generation": 0, "history": history}, lambda: None)
    model.view()
    server = DashboardServer(model.view, checkpoint=model.checkpoint)
    try:
        base = f"http://{server.address[0]}:{server.address[1]}"
        head = {"X-Epochal-Token": server.token}
        assert _get(base + "/api/checkpoint?epoch=1")[0] == 401
        status, body = _get(base + "/api/checkpoint?epoch=1", head)
        page = json.loads(body)
        assert status == 200 and page["epoch"] == 1 and [t["task"] for t in page["tasks"]] == ["a[0]", "b[0]"]
        a = page["tasks"][0]
        assert (a["alignment_s"], a["sync_s"], a["upload_s"], a["state_bytes"]) == (0.01, 0.002, 0.03, 100)
        assert page["tasks"][1]["state_bytes"] is None and "durable_s" in page["missing"]
        assert "tasks" not in model.view()["checkpoints"][0]  # the polled document stays small
        status, body = _get(base + "/api/checkpoint?epoch=2", head)
        assert status == 200 and json.loads(body)["tasks"] == [] and "aborted" in json.loads(body)["note"]
        assert _get(base + "/api/checkpoint?epoch=99", head)[0] == 404
        assert _get(base + "/api/checkpoint?epoch=x", head)[0] == 400
    finally:
        server.close()


def test_boxes_are_as_wide_as_their_labels_and_never_overlap():
    flow = ep.Dataflow("layout-long", parallelism=2)
    a = flow.source("a-source-with-a-rather-long-descriptive-name", ep.sources.CollectionSource([1]))
    b = flow.source("b", ep.sources.CollectionSource([2]), parallelism=12)
    m = a.map("normalise-and-enrich-the-customer-records", lambda x: x)
    u = m.union(b.map("bm", lambda x: x)).key_by(lambda x: x).reduce("r", lambda x, y: x)
    u.sink("out", ep.sinks.FileSink("/tmp/never-run"))
    view = graph_view(flow.nodes)
    boxes = view["nodes"]
    for n in boxes:
        need = NAME_CHAR * len(n["name"]) + SMALL_CHAR * len(f"{n['kind']} ×{n['parallelism']}")
        assert n["width"] >= need, n
        assert n["x"] + n["width"] <= view["width"] and n["y"] + n["height"] <= view["height"]
    for i, p in enumerate(boxes):
        for q in boxes[i + 1:]:
            apart = (p["x"] + p["width"] <= q["x"] or q["x"] + q["width"] <= p["x"]
                     or p["y"] + p["height"] <= q["y"] or q["y"] + q["height"] <= p["y"])
            assert apart, (p, q)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_pages_numbers_change_unit_with_their_magnitude():
    script = f"""
    const f = require({json.dumps(str(FORMAT_JS))});
    console.log(JSON.stringify({{
      s: [0.00045, 0.0123, 0.85, 12.5, 210, 7200, 9000, null].map(f.fmtS),
      rate: [0, 5, 850, 12500, 3.2e6].map(f.fmtRate),
      bytes: [512, 1536, 3.5 * 2 ** 30].map(f.fmtBytes),
      lagHours: f.axis("time", 5 * 3600).ticks.map((t) => t.label),
      latency: f.axis("time", 0.3).ticks.map((t) => t.label),
      rates: f.axis("count", 45000).ticks.map((t) => t.label),
      memory: f.axis("bytes", 300 * 2 ** 20).ticks.map((t) => t.label),
      top: f.axis("time", 5 * 3600).max, nice: [0.3, 7, 12, 45, 99].map(f.niceCeil)}}));
    """
    out = json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True,
                                    timeout=30).stdout)
    assert out["s"] == ["450 µs", "12.3 ms", "850 ms", "12.5 s", "3.5 min", "2 h", "2.5 h", "–"]
    assert out["rate"] == ["0", "5", "850", "12.5k", "3.2M"]
    assert out["bytes"] == ["512 B", "1.5 KiB", "3.5 GiB"]
    assert out["lagHours"] == ["0", "2.5 h", "5 h"] and out["top"] >= 5 * 3600  # a lag of hours fits its axis
    assert out["latency"] == ["0", "250 ms", "500 ms"]
    assert out["rates"] == ["0", "25k", "50k"] and out["memory"] == ["0", "250 MiB", "500 MiB"]
    assert out["nice"] == [0.5, 10, 20, 50, 100]


def test_a_failover_stays_in_the_exceptions_after_the_next_attempt_starts():
    """The driver's failover log belongs to one attempt's server; the model keeps every
    failover it saw, once, beside the attempts' failures."""
    plan = _plan()
    history = EpochHistory(10)
    history.add_completed(_completed(1, 100.0, 0.3))
    failover = {"region": 1, "tasks": ["count[1]"], "generation": 1, "cause": "task count[1] exited",
                "restored_epoch": 1}
    state = {"state": "running", "generation": 0, "history": history, "failovers": [failover],
             "timeline": [{"generation": 0, "started_s": 0.0, "restored_epoch": None}]}
    model = DashboardModel(plan, lambda: state, lambda: None)
    model.view()
    model.view()  # seen twice: listed once
    state.update(generation=2, history=EpochHistory(10), failovers=[], timeline=[
        {"generation": 0, "started_s": 0.0, "restored_epoch": None, "failed_s": 4.0,
         "cause": "task lines[0] disconnected (killed)"},
        {"generation": 2, "started_s": 4.1, "restored_epoch": 1}])
    rows = model.view()["exceptions"]
    assert [(r["kind"], r["generation"], r["cause"]) for r in rows] == [
        ("attempt", 0, "task lines[0] disconnected (killed)"), ("failover", 1, "task count[1] exited")]
