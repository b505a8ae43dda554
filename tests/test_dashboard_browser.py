"""The dashboard in a real browser (issue 35): Playwright drives the system Chromium
(``apt-get install chromium``; never a downloaded browser) against a running job.

The local-runtime test walks the page as a user would: the graph shows the plan's
operators, the checkpoint table grows, the latency chart's latest point equals the latency
computed from the job's own completed epochs, a savepoint triggered by the page's button is
in storage, and a task process SIGKILLed from outside shows up as a restart with its cause —
while the job's committed output still equals the plain-Python oracle. The Spark test stops
a job on embedded Spark with the page's "stop with savepoint" button; a local job is drained
and stopped with "Drain and stop".

Screenshots go to the test's tmp dir (and to ``$EPOCHAL_SCREENSHOTS`` when set, which is how
``docs/img/dashboard.png`` was made).
"""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

import epochal as ep
import pipelines

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no system Chromium at {CHROMIUM} (apt-get install -y chromium chromium-driver)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def _shot(page, tmp_path: Path, name: str, *selectors: str) -> Path:
    """A screenshot of the whole page, or of the region that holds ``selectors``' elements."""
    path = tmp_path / f"{name}.png"
    page.evaluate("window.scrollTo(0, 0)")  # the sticky header at the top of a full-page shot
    if selectors:
        boxes = [page.locator(s).bounding_box() for s in selectors]
        x0, y0 = min(b["x"] for b in boxes), min(b["y"] for b in boxes)
        x1, y1 = max(b["x"] + b["width"] for b in boxes), max(b["y"] + b["height"] for b in boxes)
        page.screenshot(path=str(path), full_page=True, clip={"x": x0, "y": y0, "width": x1 - x0, "height": y1 - y0})
    else:
        page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    if os.environ.get("EPOCHAL_SCREENSHOTS"):
        shutil.copy(path, Path(os.environ["EPOCHAL_SCREENSHOTS"]) / path.name)
    return path


def _count(page, selector: str) -> int:
    return page.eval_on_selector_all(selector, "els => els.length")


def test_dashboard_shows_a_running_job_and_its_restart(tmp_path, browser):
    n_lines = 5400
    out = pipelines.unique_dir(tmp_path, "out")
    flow = pipelines.wordcount("dashboard", out, n_lines=n_lines, rate=90)  # 15 s of input: the kill comes mid-run
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval="0.3s",
                                                                        storage=f"file://{tmp_path}/ckpt"),
                        restart=ep.RestartStrategy(max_attempts=2, delay=0.0),
                        metrics=ep.MetricsConfig(ui=True, interval=0.3))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    console_errors = []  # a missing favicon, a script error: none while the job runs
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    try:
        assert handle.ui_url.startswith("http://127.0.0.1:") and "token=" in handle.ui_url
        page.goto(handle.ui_url + "&poll=500")  # the page polls every 2 s by default
        # the graph: every operator of the plan, the shuffles drawn as key-group edges
        page.wait_for_function(f"document.querySelectorAll('#graph g.op').length === {len(flow.nodes)}")
        names = page.eval_on_selector_all("#graph g.op", "els => els.map(e => e.dataset.name)")
        assert sorted(names) == sorted(flow.nodes)
        assert page.get_attribute("#graph path.edge[data-source=pair][data-target=count]", "data-kind") == "hash"
        page.wait_for_function("document.querySelector('#graph g.op[data-name=lines]').dataset.in > 0")
        # the checkpoint table grows
        page.wait_for_function("document.querySelectorAll('#checkpoints tr[data-status=completed]').length >= 3")
        before = _count(page, "#checkpoints tr[data-status=completed]")
        page.wait_for_function(f"document.querySelectorAll('#checkpoints tr[data-status=completed]').length"
                               f" >= {before + 2}")
        # the latency chart's latest point: the newest epoch's completion minus its predecessor's trigger,
        # computed here from the job's own epochs (JobHandle.completed_epochs)
        page.wait_for_selector("#chart-latency circle.latest")
        latest = page.evaluate("""() => ({value: Number(document.querySelector('#chart-latency circle.latest')
                                             .dataset.value),
                                         epoch: Number(document.querySelector(
                                             '#checkpoints tr[data-status=completed]').dataset.epoch)})""")
        epochs = {e["epoch"]: e for e in handle.completed_epochs}
        newest, previous = epochs[latest["epoch"]], epochs[max(e for e in epochs if e < latest["epoch"])]
        expected = newest["wall_time"] - (previous["wall_time"] - previous["duration_s"])
        assert latest["value"] == pytest.approx(expected, abs=1e-6)
        assert 0 < latest["value"] < 30
        assert float(page.get_attribute("#chart-throughput circle.latest[data-label=in]", "data-value")) > 0
        # CPU: the tasks' cores busy as a series, and per operator in the graph
        page.wait_for_selector("#chart-cpu circle.latest[data-label=tasks]")
        assert 0 < float(page.get_attribute("#chart-cpu circle.latest[data-label=tasks]", "data-value")) < 8
        assert "CPU" in page.text_content("#graph g.op[data-name=count] .op-pressure")
        # a savepoint from the page's button is in storage
        page.click("#btn-savepoint")
        page.wait_for_function("document.getElementById('action-result').dataset.url")
        url = page.get_attribute("#action-result", "data-url")
        point = ep.state.open_checkpoint(url)
        assert point.kind == "savepoint"
        page.wait_for_function(f"[...document.querySelectorAll('#savepoints .sp-url')].some(e => e.textContent"
                               f" === {url!r})")
        _shot(page, tmp_path, "dashboard")
        # the running attempt says so, not a dash
        page.wait_for_function("document.querySelector(\"#attempts tbody tr[data-generation='0'] td:nth-child(5)\")"
                               ".textContent === 'running'")
        assert console_errors == []
        # SIGKILL a task process from outside: the page shows the restart and its cause
        assert handle.running
        victim = next(t for t in handle.metrics()["tasks"] if t.startswith("count"))
        pid = handle.metrics()["tasks"][victim]["pid"]
        assert pid and pid != os.getpid()
        os.kill(pid, signal.SIGKILL)
        page.wait_for_function("document.querySelectorAll('#attempts tbody tr').length >= 2")
        page.wait_for_function("document.getElementById('restore').textContent.includes('restored epoch')")
        restore = page.text_content("#restore")
        cause = page.text_content("#attempts tbody tr[data-generation='0'] td.cause")
        assert victim in cause and ("killed" in cause or "exited" in cause or "disconnected" in cause), cause
        assert cause[:60] in restore
        _shot(page, tmp_path, "dashboard-restart")
        result = handle.wait(180)
    finally:
        page.close()
        if handle.running:
            handle.cancel()
    assert result.attempts == 2 and victim in result.failures[0]  # the kill fired mid-run
    assert pipelines.output(out) == pipelines.wordcount_oracle(n_lines)


@pytest.mark.spark
@pytest.mark.slow  # 45 s on the shared 2-core machine (the JVM, then the job): opt-in with -m slow
def test_stop_with_savepoint_from_the_page_on_spark(tmp_path, browser):
    out = pipelines.unique_dir(tmp_path, "out")
    flow = pipelines.wordcount("dashboard_spark", out, n_lines=40_000, rate=200)  # ~50 s: far more than the test waits
    handle = flow.start(runtime="spark", checkpoint=ep.CheckpointConfig(interval="0.5s",
                                                                        storage=f"file://{tmp_path}/ckpt"),
                        metrics=ep.MetricsConfig(ui=True, interval=0.5))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS * 2)
    page.on("dialog", lambda d: d.accept())  # "Stop the job with a savepoint?"
    try:
        page.goto(handle.ui_url + "&poll=500")  # the page polls every 2 s by default
        page.wait_for_function(f"document.querySelectorAll('#graph g.op').length === {len(flow.nodes)}")
        page.wait_for_function("document.getElementById('state').textContent === 'running'")
        page.wait_for_function("document.querySelectorAll('#checkpoints tr[data-status=completed]').length >= 2")
        assert page.text_content("#summary").startswith("spark")
        page.click("#btn-stop")
        page.wait_for_function("document.getElementById('action-result').dataset.url")
        url = page.get_attribute("#action-result", "data-url")
        result = handle.wait(120)
    finally:
        page.close()
        if handle.running:
            handle.cancel()
    assert result.stopped_with_savepoint == url
    point = ep.state.open_checkpoint(url)
    assert point.kind == "savepoint" and point.epoch == result.savepoints[-1]["epoch"]
    committed = pipelines.output(out)
    assert 0 < sum(committed.values()) and pipelines.contains_all(pipelines.wordcount_oracle(40_000), committed)


def test_drain_and_stop_from_the_page(tmp_path, browser):
    """The page's "Drain and stop" button: the job stops with a drained savepoint, and its
    committed output holds every window of the events the savepoint's sources read —
    the plain-Python oracle of test_drain.py."""
    import cloudpickle

    import test_drain
    import test_event_time
    from epochal.windows import Tumbling

    cloudpickle.register_pickle_by_value(test_event_time)
    out = pipelines.unique_dir(tmp_path, "out")
    flow = test_event_time.windows_flow("dashboard_drain", out, Tumbling(1.0), rate=200.0)  # 15 s of input
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval="0.3s",
                                                                        storage=f"file://{tmp_path}/ckpt"),
                        metrics=ep.MetricsConfig(ui=True, interval=0.3))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
    try:
        page.goto(handle.ui_url + "&poll=300")
        page.wait_for_function("document.getElementById('state').textContent === 'running'")
        page.wait_for_function("document.querySelectorAll('#checkpoints tr[data-status=completed]').length >= 2")
        page.click("#btn-drain")
        page.wait_for_function("document.getElementById('action-result').dataset.url")
        url = page.get_attribute("#action-result", "data-url")
        result = handle.wait(60)
        # the job and its dashboard server are gone: the page says how the job ended, acts no more
        page.wait_for_function("document.getElementById('error').textContent.includes('has ended')")
        assert page.text_content("#state") == "stopped at a savepoint"
        assert all(page.is_disabled(b) for b in ("#btn-savepoint", "#btn-stop", "#btn-drain"))
        assert "has ended" in page.text_content("#error") and url in page.text_content("#error")
    finally:
        page.close()
        if handle.running:
            handle.cancel()
    assert dialogs and dialogs[0].startswith("End event time")
    assert result.stopped_with_savepoint == url
    assert test_event_time.results(out) == test_event_time.pane_oracle(1.0, 1.0, test_drain._cut_events(url))


def test_a_regions_dashboard_links_every_region(tmp_path, browser):
    """A job of two regions: each region's page names its region and shows both side by side;
    following the other region's link opens that region's page."""
    import epochal as ep
    from epochal.sinks import FileSink
    from pipelines import unique_dir

    flow = ep.Dataflow("browser-regions", parallelism=1)
    for name in ("left", "right"):
        flow.source(name, ep.sources.GeneratorSource(lambda split, offset: iter(range(offset, 10**9)), num_splits=1,
                                                     records_per_second=200.0), region=name) \
            .sink(f"{name}-out", FileSink(unique_dir(tmp_path, name)))
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.2), metrics=ep.MetricsConfig(ui=True))
    try:
        page = browser.new_page()
        page.goto(handle.ui_urls["left"])
        page.wait_for_function("document.querySelectorAll('#regions .region').length === 2", timeout=30_000)
        page.wait_for_function("document.querySelector('#regions').textContent.includes('epoch')", timeout=30_000)
        assert page.text_content("#job") == "browser-regions / region left"
        assert page.text_content("#regions .current").startswith("left: running")
        _shot(page, tmp_path, "regions")
        page.click("#regions a.region")
        page.wait_for_function("document.querySelector('#job').textContent.endsWith('region right')", timeout=30_000)
        page.close()
    finally:
        handle.cancel()
        try:
            handle.wait(60)
        except ep.JobFailedError:
            pass  # cancelled
