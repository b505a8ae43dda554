"""Live metrics of running jobs: progress events (:mod:`epochal.metrics.progress`), the
driver's reporter (:mod:`epochal.metrics.reporter`) and Prometheus
(:mod:`epochal.metrics.prometheus`). Configure with :class:`epochal.config.MetricsConfig`."""
from epochal.metrics.progress import ProgressBuilder, percentile, status_line

__all__ = ["ProgressBuilder", "percentile", "status_line"]
