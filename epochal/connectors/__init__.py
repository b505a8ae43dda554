"""Connectors: one package per external system, its source and sink side by side.

A connector shares its client configuration between source and sink, is thin over the
sinks' two-phase-commit base (:class:`~epochal.sinks.base.TwoPhaseCommitSink`) and the
replayable-source interface (:mod:`epochal.sources.base`), and at recovery asks the external
system which epochs it already holds instead of trusting local memory (DESIGN.md
"Connectors"). Users import connectors where they import every other source and sink
(``epochal.sinks.DeltaSink``, ``epochal.sources.DeltaSource``). Client libraries are
optional extras, imported only when a connector is used, never by ``import epochal``.

A connector imports ``epochal.sinks.base``, ``epochal.sources.base``, ``epochal.errors``,
``epochal.config`` and its client library; never the runtime.
"""
