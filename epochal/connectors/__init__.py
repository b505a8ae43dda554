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
