"""Connectors: one package per external system, its source and sink side by side.

Each connector shares its client configuration between source and sink, is thin over the
sinks' two-phase-commit base (:class:`~epochal.sinks.base.TwoPhaseCommitSink`) and the
replayable-source interface (:mod:`epochal.sources.base`), and asks the external system at
recovery which epochs it already holds (DESIGN.md "Connectors"). Users import connectors
where they import every source and sink (``epochal.sources.KafkaSource``,
``epochal.sinks.KafkaSink``). Client libraries are optional extras, imported only when a
connector is used, never when epochal is imported.

A connector may import ``epochal.sinks.base``, ``epochal.sources.base``, ``epochal.errors``,
``epochal.config`` and its client library; never the runtime.
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
