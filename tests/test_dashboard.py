"""The dashboard's pieces without a browser (issue 35): the graph layout, the checkpoint
split and latency definitions, the model across attempts, the server's token rules and
the configuration's errors. The browser tests are in ``test_dashboard_browser.py``."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

import epochal as ep
from epochal.epochs.history import EpochHistory
from epochal.errors import ConfigError, SavepointError
from epochal.ui.layout import graph_view
from epochal.ui.model import DashboardModel, critical_split
from epochal.ui.server import DashboardServer


def test_layout_puts_every_edge_forward_except_loop_back_edges():
    flow = ep.Dataflow("layout", parallelism=2)
    a = flow.source("a", ep.sources.CollectionSource([1, 2]))
    b = flow.source("b", ep.sources.CollectionSource([3]), parallelism=1)
    mapped = a.map("m", lambda x: x)
    keyed = mapped.union(b.map("bm", lambda x: x)).key_by(lambda x: x).reduce("r", lambda x, y: x + y)
    keyed.sink("out", ep.sinks.FileSink("/tmp/never-run"))
    view = graph_view(flow.nodes)
    col = {n["name"]: n["column"] for n in view["nodes"]}
    for e in view["edges"]:
        assert col[e["target"]] > col[e["source"]], e
    kinds = {(e["source"], e["target"]): e["kind"] for e in view["edges"]}
    assert "hash" in kinds.values() and kinds[("a", "m")] == "forward"
    assert {n["name"] for n in view["nodes"]} == set(flow.nodes)
    boxes = {(n["x"], n["y"]) for n in view["nodes"]}
    assert len(boxes) == len(view["nodes"])  # no two boxes on one spot
    assert all(n["x"] + n["width"] <= view["width"] and n["y"] + n["height"] <= view["height"] for n in view["nodes"])


def test_layout_marks_the_loop_back_edge_and_points_it_backwards():
    import pipelines

    flow = pipelines.collatz("loops", "/tmp/never-run", n=10)
    view = graph_view(flow.nodes)
    col = {n["name"]: n["column"] for n in view["nodes"]}
    back = [e for e in view["edges"] if e["feedback"]]
    assert back, "the collatz loop has a back-edge"
    for e in back:
        assert col[e["target"]] <= col[e["source"]]
    for e in view["edges"]:
        if not e["feedback"]:
            assert col[e["target"]] > col[e["source"]]


def _completed(epoch, wall, duration, ack_late=0.3):
    return {"epoch": epoch, "reason": "periodic", "duration_s": duration, "wall_time": wall, "bytes": 100 * epoch,
            "state_bytes": 1000, "metadata_s": 0.01, "channel_state_bytes": 0, "channel_state_records": 0,
            "tasks": {"a[0]": {"barrier_s": 0.05, "alignment_s": 0.01, "sync_s": 0.002, "upload_wait_s": 0.0,
                               "upload_s": 0.03, "ack_s": 0.1},
                      "b[0]": {"barrier_s": 0.1, "alignment_s": 0.04, "sync_s": 0.01, "upload_wait_s": 0.01,
                               "upload_s": 0.1, "ack_s": ack_late}}}


def test_critical_split_follows_the_last_acknowledging_task_and_adds_up():
    e = _completed(1, 100.0, 0.3)
    split = critical_split(e)
    assert split["task"] == "b[0]"
    assert split["alignment"] == pytest.approx(0.04) and split["barrier"] == pytest.approx(0.06)
    assert split["upload"] == pytest.approx(0.11)
    phases = sum(split[p] for p in ("barrier", "alignment", "sync", "upload", "ack"))
    assert phases == pytest.approx(0.3)  # = the slowest task's ack_s = duration
    assert split["metadata"] == pytest.approx(0.01)


def _model(state):
    import pipelines

    plan = pipelines.wordcount("model", "/tmp/never-run").plan()
    return DashboardModel(plan, lambda: state, lambda: None), plan


def test_model_keeps_the_checkpoints_of_every_attempt_and_defines_latency():
    first, second = EpochHistory(10), EpochHistory(10)
    state = {"state": "running", "generation": 0, "history": first, "timeline": [], "savepoints": [],
             "highest_triggered": 2}
    model, plan = _model(state)
    first.add_completed(_completed(1, 100.0, 0.3))
    first.add_completed(_completed(2, 101.0, 0.4))
    first.add_aborted({"epoch": 3, "reason": "declined", "detail": "task b[0] declined"})
    view = model.view()
    assert [r["epoch"] for r in view["checkpoints"]] == [1, 2, 3]
    # epoch 2's latency: its completion (101.0) minus epoch 1's trigger (100.0 - 0.3)
    assert view["checkpoints"][1]["latency_s"] == pytest.approx(1.3)
    assert view["latency"] == [{"epoch": 2, "time": 101.0, "latency_s": pytest.approx(1.3)}]
    assert view["checkpoints"][2]["status"] == "aborted" and "declined" in view["checkpoints"][2]["detail"]
    # a restart: a new attempt, a new (empty) history; the old rows stay, the restore is explained
    state.update(generation=1, history=second, timeline=[
        {"generation": 0, "started_s": 0.0, "restored_epoch": None, "cause": "task b[0] disconnected (killed)"},
        {"generation": 1, "started_s": 5.0, "restored_epoch": 2, "restored_bytes": 123, "cause": None}],
        savepoints=[{"epoch": 4, "url": "file:///sp", "bytes": 9}])
    second.add_completed(_completed(4, 110.0, 0.2))
    view = model.view()
    assert [(r["epoch"], r["generation"]) for r in view["checkpoints"]] == [(1, 0), (2, 0), (3, 0), (4, 1)]
    assert view["checkpoints"][-1]["savepoint"] == "file:///sp"
    assert view["restore"]["epoch"] == 2 and "killed" in view["restore"]["cause"]
    assert [a["generation"] for a in view["attempts"]] == [0, 1]
    assert {n["name"] for n in view["graph"]["nodes"]} == set(plan.nodes)
    assert view["sinks"][0]["open_per_subtask"] == 1  # highest triggered 2 < last completed 4: none in flight
    json.dumps(view)  # JSON-able


def test_model_series_take_each_progress_event():
    state = {"state": "running", "generation": 0, "history": None}
    model, plan = _model(state)
    source_task = next(t.id for t in plan.tasks if t.is_source)
    other = next(t.id for t in plan.tasks if not t.is_source)
    model.on_progress({"time": 50.0, "records_in_per_s": 10.0, "records_out_per_s": 7.0,
                       "tasks": {source_task: {"watermark": 45.0, "rss_bytes": 1000, "backpressure_ratio": 0.5,
                                               "cpu_load": 0.25},
                                 other: {"cpu_load": 0.5}}})
    (point,) = model.view()["series"]
    assert point["records_in_per_s"] == 10.0 and point["watermark_lag_s"] == {"lines": 5.0}
    assert point["tasks_rss"] == 1000 and point["backpressure"] == 0.5 and point["driver_rss"] > 0
    assert point["tasks_cpu"] == 0.75 and point["driver_cpu"] is None  # the driver's: a rate, from the next event on
    ops = model._operators({"tasks": {source_task: {"cpu_load": 0.25}}})
    source_ops = set(next(t.chain for t in plan.tasks if t.id == source_task))
    assert {n for n, o in ops.items() if o["cpu_load"] == 0.25} == source_ops
    end = time.process_time() + 0.05
    while time.process_time() < end:  # the driver busy between two events
        pass
    model.on_progress({"time": 50.1, "tasks": {}})
    assert model.view()["series"][-1]["driver_cpu"] > 0.2


def _get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url, body, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_server_needs_the_token_for_data_and_the_header_for_actions():
    calls = []
    server = DashboardServer(lambda: {"x": float("inf"), "y": 1.5}, lambda stop, timeout, drain: calls.append((stop, drain)) or "file:///sp-1")
    try:
        base = f"http://{server.address[0]}:{server.address[1]}"
        assert server.address[0] == "127.0.0.1"  # loopback by default
        status, page = _get(base + "/")
        assert status == 200 and b"/static/app.js" in page
        assert _get(base + "/static/app.js")[0] == 200
        assert _get(base + "/static/../server.py")[0] == 404
        assert _get(base + "/api/state")[0] == 401
        assert _get(base + "/api/state?token=wrong")[0] == 401
        status, body = _get(base + f"/api/state?token={server.token}")
        assert status == 200 and json.loads(body) == {"x": None, "y": 1.5}
        assert _get(base + "/api/state", {"X-Epochal-Token": server.token})[0] == 200
        # actions: the header only (a link or a form from another origin cannot set it)
        assert _post(base + f"/api/savepoint?token={server.token}", {"stop": False})[0] == 401
        assert _post(base + "/api/savepoint", {"stop": "yes"}, {"X-Epochal-Token": server.token})[0] == 400
        assert calls == []
        assert _post(base + "/api/savepoint", {"stop": True}, {"X-Epochal-Token": server.token}) == \
            (200, {"url": "file:///sp-1", "stop": True, "drain": False})
        assert _post(base + "/api/savepoint", {"drain": True}, {"X-Epochal-Token": server.token})[0] == 400
        assert _post(base + "/api/savepoint", {"stop": True, "drain": 1}, {"X-Epochal-Token": server.token})[0] == 400
        assert _post(base + "/api/savepoint", {"stop": True, "drain": True}, {"X-Epochal-Token": server.token}) == \
            (200, {"url": "file:///sp-1", "stop": True, "drain": True})
        assert calls == [(True, False), (True, True)]
    finally:
        server.close()
    read_only = DashboardServer(lambda: {}, None, token="s" * 20)
    try:
        base = f"http://{read_only.address[0]}:{read_only.address[1]}"
        assert _post(base + "/api/savepoint", {}, {"X-Epochal-Token": "s" * 20})[0] == 405
    finally:
        read_only.close()


def test_server_reports_a_savepoint_failure_to_the_page():
    def fail(stop, timeout, drain):
        raise SavepointError("epoch 7 was aborted")
    server = DashboardServer(lambda: {}, fail)
    try:
        base = f"http://{server.address[0]}:{server.address[1]}"
        status, body = _post(base + "/api/savepoint", {"stop": False}, {"X-Epochal-Token": server.token})
        assert status == 409 and "epoch 7 was aborted" in body["error"]
    finally:
        server.close()


@pytest.mark.parametrize("kwargs, key", [({"ui": "yes"}, "metrics.ui"), ({"ui_port": -1}, "metrics.ui_port"),
                                         ({"ui_port": True}, "metrics.ui_port"), ({"ui_host": ""}, "metrics.ui_host"),
                                         ({"ui_token": "short"}, "metrics.ui_token")])
def test_bad_dashboard_configuration_names_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        ep.MetricsConfig(**kwargs)


def test_a_port_in_use_is_a_config_error_naming_the_keys():
    first = DashboardServer(lambda: {})
    try:
        with pytest.raises(ConfigError, match="ui_host / ui_port"):
            DashboardServer(lambda: {}, port=first.address[1])
    finally:
        first.close()


def test_epochal_ui_serves_a_finished_jobs_checkpoints_from_storage(tmp_path, capsys):
    """`epochal ui <storage> <job>` as its own process: the operators and the retained
    checkpoints and savepoint of a job that ran elsewhere, read-only."""
    import os
    import signal
    import subprocess
    import sys

    import pipelines
    from epochal.backends.storage import CheckpointStorage

    storage = f"file://{tmp_path}/ckpt"
    flow = pipelines.wordcount("offline", pipelines.unique_dir(tmp_path, "out"), n_lines=2000, rate=400)
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval="0.2s", storage=storage, retained=3))
    savepoint = handle.savepoint()
    handle.wait(120)
    job = CheckpointStorage(storage, "offline")
    complete = [e for e in job.all_epochs() if job.read_metadata(e)]
    proc = subprocess.Popen([sys.executable, "-m", "epochal.cli", "ui", storage, "offline"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ})
    try:
        line = proc.stdout.readline()
        assert "read-only" in line, line + proc.stderr.read()
        url = line.split(": ", 1)[1].strip()
        base, token = url.split("/?token=")
        status, body = _get(f"{base}/api/state", {"X-Epochal-Token": token})
        assert status == 200
        doc = json.loads(body)
        assert [r["epoch"] for r in doc["checkpoints"]] == complete and len(complete) >= 1
        assert {n["name"] for n in doc["graph"]["nodes"]} == set(flow.nodes)
        assert [s["url"] for s in doc["savepoints"]] == [savepoint]
        assert doc["actions"] is False
        assert _post(f"{base}/api/savepoint", {}, {"X-Epochal-Token": token})[0] == 405
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    from epochal.cli import main

    assert main(["ui", storage, "nosuchjob"]) == 1
    assert "no checkpoints of job 'nosuchjob'" in capsys.readouterr().err
