"""The driver's reporter thread: one progress event per interval, to whoever listens.

Started with the job (:func:`epochal.runtime.driver.job.start_job`), stopped when it ends (after a
last event with the final state). Per event, in this order: the driver's subscribers (the dashboard), the user's listener, one JSON
line on the ``epochal.progress`` logger (INFO), the value Prometheus scrapes
(:mod:`epochal.metrics.prometheus`). ``JobHandle.metrics()`` builds a fresh event on the
caller's thread. A listener that raises is logged once and dropped — metrics never fail a job.
"""
from __future__ import annotations

import json
import logging
import sys
import threading

from epochal.metrics.progress import ProgressBuilder, status_line

log = logging.getLogger("epochal.progress")


class Reporter:
    """Publishes progress events of one job (see the module docstring).

    ``source()`` returns ``(driver_state, live, history)`` for
    :meth:`~epochal.metrics.progress.ProgressBuilder.build`; it is called on the reporter
    thread and on threads asking :meth:`snapshot`.
    """

    def __init__(self, plan, config, source):
        self.config = config
        self._source = source
        self._builder = ProgressBuilder(plan)
        self._lock = threading.Lock()
        self.latest: dict | None = None
        self._listener = config.listener
        self._subscribers: list = []  # the driver's own consumers (the dashboard's series)
        self._stop = threading.Event()
        self._exporter = None
        if config.prometheus_port is not None:
            from epochal.metrics.prometheus import PrometheusExporter

            self._exporter = PrometheusExporter(self, config.prometheus_port, config.prometheus_host)
        self._thread = threading.Thread(target=self._loop, name=f"epochal-metrics-{plan.job}", daemon=True)
        self._thread.start()

    @property
    def prometheus_address(self) -> tuple[str, int] | None:
        return None if self._exporter is None else self._exporter.address

    def subscribe(self, fn) -> None:
        """Call ``fn(progress)`` with every published event, on the reporter thread, before the
        user's listener (for the driver's own consumers, e.g. the dashboard). A subscriber
        that raises is logged; it keeps its subscription."""
        self._subscribers.append(fn)

    def snapshot(self) -> dict:
        """A progress event built now (also kept as :attr:`latest`)."""
        with self._lock:
            progress = self._builder.build(*self._source())
            self.latest = progress
            return progress

    def _publish(self) -> None:
        progress = self.snapshot()
        for fn in self._subscribers:
            try:
                fn(progress)
            except Exception:
                log.exception("a progress subscriber (%r) failed", fn)
        if self._listener is not None:
            try:
                self._listener(progress)
            except Exception as exc:
                log.warning("metrics listener %r raised %s: %s — it gets no further events",
                            self._listener, type(exc).__name__, exc)
                self._listener = None
        if self.config.log and log.isEnabledFor(logging.INFO):
            log.info("%s", json.dumps(progress, default=str))

    def _loop(self) -> None:
        while not self._stop.wait(self.config.interval):
            try:
                self._publish()
            except Exception:  # never let metrics take the driver down
                log.exception("building a progress event failed")

    def close(self) -> None:
        """Publish a last event (the job's final state) and stop. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(5.0)
        try:
            self._publish()
        except Exception:
            log.exception("building the last progress event failed")
        if self._exporter is not None:
            self._exporter.close()


class StatusLine:
    """A live one-line status on a terminal (``\\r``-rewritten), for ``Dataflow.run``."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self._width = 0

    def show(self, progress: dict) -> None:
        self.show_text(status_line(progress))

    def show_text(self, text: str) -> None:
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def end(self) -> None:
        if self._width:
            self.stream.write("\n")
            self.stream.flush()
