"""How each kind of queryable state is read (seed 004 §4.3.1, :mod:`epochal.query`).

An operator that serves state registers one :class:`StateReader` per queryable name in its
task's registry (``ctx.extras["queryable"]``, ``{"<operator>/<name>": reader}``):

* :class:`ValueReader` — a value state (``ctx.value_state(name, queryable=True)``, a
  ``reduce``'s accumulator ``"acc"``);
* :class:`MapReader` — a map state: a key's whole map;
* the window operators' readers (:mod:`epochal.windows.queries`) and the columnar
  aggregate's (:mod:`epochal.columnar.queries`).

A reader says which backend states a version must pin (:attr:`StateReader.states`), what
operator-level value belongs to the version (:meth:`StateReader.mark`: read on the task
thread at the pin, e.g. a window operator's watermark at the barrier) and how one key is
read (:meth:`StateReader.read`) from a *source*: a pinned view
(:class:`~epochal.backends.views.StateView`, read-committed, on a query thread) or the live
backend (read-uncommitted, on the task thread). Both sources answer ``get(state, kg, key,
default)`` and ``map_items(state, kg, key)``. ``read`` must not modify what the source
returns (a view's objects are shared by every reader of the version).
"""
from __future__ import annotations

from typing import Any


class StateReader:
    """Reads one queryable name of one operator (see the module docstring)."""

    #: the backend states a read-committed version of this reader pins
    states: tuple[str, ...] = ()
    #: reads iterate a key's map entries (a RocksDB version then pins a checkpoint)
    whole_maps = False
    #: how a build-time message names the kind of state
    kind = "state"
    #: attributes only :meth:`mark` uses (clocks bound to the operator): left out when the
    #: reader is pickled for a query sidecar (:mod:`epochal.query.sidecar`), which only reads
    task_side: tuple[str, ...] = ()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in self.task_side}

    def mark(self) -> Any:
        """Task thread, at a pin (and for a live read): the operator-level value the reads
        of this version need (``None``: none)."""
        return None

    def read(self, source, kg: int, key, mark: Any) -> Any:
        """The answer for ``key`` (key group ``kg``) from ``source``, with the ``mark`` of
        the version (or of now, live)."""
        raise NotImplementedError


class ValueReader(StateReader):
    """One value per key; absent keys read as ``default``."""

    kind = "value"

    def __init__(self, state: str, default: Any = None):
        self.states = (state,)
        self.default = default

    def read(self, source, kg, key, mark):
        return source.get(self.states[0], kg, key, self.default)


class MapReader(StateReader):
    """A key's whole map (a fresh ``dict``; empty if none)."""

    kind = "map"
    whole_maps = True

    def __init__(self, state: str):
        self.states = (state,)

    def read(self, source, kg, key, mark):
        return dict(source.map_items(self.states[0], kg, key))


class QueryableFlag:
    """Marks an operator's options (a ``Node.extra`` entry) as serving its state to queries."""

    def __eq__(self, other):
        return isinstance(other, QueryableFlag)

    def __hash__(self):
        return hash(QueryableFlag)


def register(extras: dict | None, name: str, reader: StateReader) -> None:
    """Add ``reader`` under ``name`` (``"<operator>/<state>"``) to the task's registry;
    nothing outside a task (no registry)."""
    registry = (extras or {}).get("queryable")
    if registry is not None:
        registry[name] = reader
