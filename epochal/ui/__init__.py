"""The web dashboard of a running job (Flink's web UI, Spark's Structured Streaming tab):
the job graph with per-operator rates and back-pressure, the checkpoint history with each
epoch's duration split, live charts, restarts and savepoints, and two actions (savepoint,
stop with a savepoint) behind a token.

* ``layout`` — the job graph as positioned boxes and edges (pure);
* ``model`` — what the page shows, built from the driver's live state (pure bookkeeping:
  the checkpoint rows of every attempt, bounded time series);
* ``server`` — the HTTP server: one HTML page, its script and a small JSON API, loopback
  and a token by default (``MetricsConfig.ui``);
* ``offline`` — the read-only view of a job started elsewhere, from its checkpoint storage
  (``epochal ui <storage> <job>``).

Plain HTML, pure SVG drawn by one vendored-free script (``static/app.js``): no Node
toolchain. May import: ``graph``, ``plan``, ``metrics``, ``backends`` (storage, for the
offline view), ``errors``, ``config``; never the runtime (the driver hands it callables).
"""
from epochal.ui.server import DashboardServer

__all__ = ["DashboardServer"]
