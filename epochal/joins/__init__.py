"""Joins of two keyed streams in event time, built on keyed two-input functions
(:mod:`epochal.coprocess`):

* ``a.key_by(k).interval_join(b.key_by(k), lower, upper, how=...)``: rows whose times lie
  within ``[lower, upper]`` of each other (:mod:`epochal.joins.interval`);
* ``a.key_by(k).window_join(b.key_by(k), Tumbling(...) | Sliding(...) | Session(...), how=...)``:
  rows in the same window (:mod:`epochal.joins.windowed`);
* ``a.key_by(k).temporal_join(table.key_by(k), how=...)``: each row with the version of a
  changelog current at its time (:mod:`epochal.joins.temporal`).

``how``: ``"inner"``, ``"left"``, ``"right"``, ``"full"`` (temporal: inner or left); an outer
row comes out once the watermark proves it has no partner. Finish with ``.apply(name, fn)``.
Join state is keyed state, cleaned as the watermark passes; rows at or behind the watermark
are late (``.late()``). Exactly-once, rescaling by key group: as any keyed operator.
"""
from epochal.joins.functions import pair

__all__ = ["pair"]
