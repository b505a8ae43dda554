"""Connectors: one package per external system, its source and its sink side by side.

``epochal/connectors/<system>/`` (``kafka/``, ``delta/``, ``iceberg/``, ``postgres/``, ...)
holds everything epochal knows about one system: the client configuration its source and
sink share, the source (an :class:`epochal.sources.base.Source` whose reader snapshots its
offsets), and the sink — thin over the two-phase-commit base: a
:class:`~epochal.sinks.base.TwoPhaseCommitSink` writer implements ``begin_transaction``,
``write_to``, ``pre_commit``, ``commit`` (idempotent) and ``abort``, and the base owns the
protocol (seed 004 §4.1.3, Table 4.1). Which transactions to commit or abort given what the
system reports after a restore is a pure function of the connector, unit- and
Hypothesis-tested without processes.

Users import connectors where they import every source and sink —
``epochal.sources.KafkaSource``, ``epochal.sinks.KafkaSink``, ``DeltaSink``,
``IcebergSink``, ``PostgresSink`` — re-exported by :mod:`epochal.sources` and
:mod:`epochal.sinks`. A system's client library is an optional extra
(``pip install 'epochal[kafka]'``): it is imported when a source or sink is built, never
when this package or a re-export is imported, and building one without it fails at once
naming the extra to install.

What a connector may import: the public bases and shared pieces — :mod:`epochal.sinks.base`,
:mod:`epochal.sources.base`, :mod:`epochal.errors`, :mod:`epochal.config`,
:mod:`epochal.alignment.factory` (``SinkMode``: a sink reads ``SinkContext.mode``, never
the guarantee), :mod:`epochal.durable`, :mod:`epochal.backends.keygroups`,
:mod:`epochal.serde`, :mod:`epochal.testing` — and its own client library. Never
:mod:`epochal.runtime` (connectors run inside operators, on the task thread and the
uploader), never pyspark. This ``__init__`` imports nothing at module level; its
:func:`lazy_exports` is how :mod:`epochal.sinks` and :mod:`epochal.sources` re-export connectors.
"""


def lazy_exports(module: str, names: dict[str, str]):
    """A module ``__getattr__`` (PEP 562) that imports ``names[attr]`` on first access of
    ``attr`` and caches it in ``module``. ``epochal.sinks`` and ``epochal.sources`` export
    connectors this way: connectors import the sink and source bases, so those packages
    cannot import them eagerly, and users need no client library to import epochal."""
    import importlib
    import sys

    def __getattr__(attr: str):
        target = names.get(attr)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(target), attr)
        setattr(sys.modules[module], attr, value)
        return value

    return __getattr__
