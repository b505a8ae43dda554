"""Prometheus exposition of a job's progress events (``metrics.prometheus_port``).

The driver serves ``/metrics`` with ``prometheus_client`` (``pip install 'epochal[metrics]'``).
A custom collector reads the newest progress event at scrape time (pull, nothing to keep in
sync); every sample carries the ``job`` label, task samples a ``task`` label and operator
samples an ``operator`` label; a source reader with figures of its own (the CEC window operator)
adds per-operator gauges (:data:`_READER_GAUGES`).
"""
from __future__ import annotations

from epochal.errors import ConfigError

__all__ = ["PrometheusExporter"]


class PrometheusExporter:
    """Serves ``/metrics`` on ``host:port`` (``port`` 0: any free port; :attr:`address` says
    which). ``host`` defaults to loopback (``MetricsConfig.prometheus_host``).

    Raises:
        ConfigError: prometheus_client is missing, or ``host:port`` cannot be bound.
    """

    def __init__(self, reporter, port: int, host: str = "127.0.0.1"):
        try:
            from prometheus_client import start_http_server
            from prometheus_client.core import CollectorRegistry
        except ImportError:
            raise ConfigError("metrics.prometheus_port: prometheus_client is not installed; "
                              "pip install 'epochal[metrics]'") from None
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(reporter))
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"metrics.prometheus_host / prometheus_port: cannot serve /metrics on {host}:{port}: "
                              f"{exc}") from exc
        self.address = self._server.server_address[:2]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Collector:
    def __init__(self, reporter):
        self.reporter = reporter

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        p = self.reporter.latest or self.reporter.snapshot()
        job = p["job"]

        def gauge(name, doc, value, labels=(), values=()):
            g = GaugeMetricFamily(name, doc, labels=["job", *labels])
            if value is not None:
                g.add_metric([job, *values], value)
            return g

        yield gauge("epochal_up", "1 while the job runs, 0 once it finished or failed",
                    1.0 if p["state"] in ("starting", "running", "restarting") else 0.0)
        yield gauge("epochal_records_in_per_second", "records read by the sources per second", p["records_in_per_s"])
        yield gauge("epochal_records_out_per_second", "records written by the sinks per second",
                    p["records_out_per_s"])
        yield gauge("epochal_last_completed_epoch", "newest completed checkpoint", p["last_completed_epoch"])
        yield gauge("epochal_watermark_seconds", "the job's event time (lowest task watermark)", p["watermark"])
        restarts = CounterMetricFamily("epochal_restarts", "attempts that failed and were restarted", labels=["job"])
        restarts.add_metric([job], len(p.get("restarts", ())))
        yield restarts
        durations = GaugeMetricFamily("epochal_checkpoint_duration_seconds", "checkpoint duration (trigger to "
                                      "last acknowledgement) over the attempt", labels=["job", "quantile"])
        for q in ("p50", "p99"):
            v = p["checkpoints"]["duration_s"][q]
            if v is not None:
                durations.add_metric([job, q[1:]], v)
        yield durations
        per_task = {
            "epochal_task_records_in_per_second": ("records_in_per_s", "records a task took in per second"),
            "epochal_task_records_out_per_second": ("records_out_per_s", "records a task sent per second"),
            "epochal_task_backpressure_ratio": ("backpressure_ratio", "share of time a task waited for credit"),
            "epochal_task_queued_batches": ("queued_batches", "batches queued in a task's inputs"),
            "epochal_task_watermark_seconds": ("watermark", "a task's output event time"),
            "epochal_task_cpu_load": ("cpu_load", "CPU cores a task's process kept busy over the last interval"),
        }
        for name, (key, doc) in per_task.items():
            g = GaugeMetricFamily(name, doc, labels=["job", "task"])
            for task, t in p["tasks"].items():
                if t.get(key) is not None:
                    g.add_metric([job, task], t[key])
            yield g
        cpu = CounterMetricFamily("epochal_task_cpu_seconds", "CPU seconds of a task's process since the task "
                                  "(its attempt) started", labels=["job", "task"])
        for task, t in p["tasks"].items():
            if t.get("cpu_s") is not None:
                cpu.add_metric([job, task], t["cpu_s"])
        yield cpu
        for name, key, doc in (("epochal_operator_records_in_per_second", "records_in_per_s", "records per second"),
                               ("epochal_operator_records_out_per_second", "records_out_per_s", "records per second")):
            g = GaugeMetricFamily(name, doc, labels=["job", "operator"])
            for op, o in p["operators"].items():
                g.add_metric([job, op], o[key])
            yield g
        for name, key, doc in _READER_GAUGES:  # a source reader's own figures (progress: an operator's "reader")
            g = GaugeMetricFamily(name, doc, labels=["job", "operator"])
            for op, o in p["operators"].items():
                if (o.get("reader") or {}).get(key) is not None:
                    g.add_metric([job, op], o["reader"][key])
            yield g


#: per operator, from its source reader's figures (the CEC window operator's, docs/eventual.md "Metrics")
_READER_GAUGES = (
    ("epochal_operator_open_windows", "open_windows", "windows open in the operator (eventual checkpoints)"),
    ("epochal_operator_extent_lag_seconds", "extent_lag_s", "event time from T, the oldest footprint, to the "
     "operator's newest input: how far back a recovery now would replay (eventual checkpoints)"),
    ("epochal_operator_footprints_per_second", "footprints_per_s", "Gopen and Gcheck records written per second "
     "(eventual checkpoints)"),
    ("epochal_operator_checkpoint_load", "checkpoint_load", "share of the last interval the operator spent on "
     "its Gchecks, against its budget (eventual checkpoints)"),
)
