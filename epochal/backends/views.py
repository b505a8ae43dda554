"""Pinned, read-only views of keyed state: what a read-committed query reads (seed 004
§4.3.1, "letting TaskManagers hold onto the state of committed snapshots").

:meth:`KeyedStateBackend.pin_view` (task thread, at an epoch's barrier) returns a
:class:`StateView` of the named states as of that instant; the view stays unchanged however
the task writes state afterwards, and any thread may read it — the task's query server reads
it while the task thread keeps processing (:mod:`epochal.query`). :meth:`StateView.release`
(idempotent, any thread) gives the pinned resources back:

* heap: the bucket dicts frozen by the copy-on-write fence the snapshot uses (a pinned
  bucket is copied on its first write after the pin, once per pin; never mutated);
* RocksDB: a ``db.snapshot()`` — point reads through it are consistent (DESIGN.md
  "Facts": its iteration is not, so a view never iterates it).
"""
from __future__ import annotations

import pickle
import threading
from collections.abc import Callable

_MISSING = object()


class StateView:
    """Read-only state of one task as of one instant. Thread: any."""

    #: a map state can be read whole (every map key of a key) through this view
    reads_whole_maps = True

    def __init__(self, release: Callable[[], None] | None = None):
        self._release = release
        self._lock = threading.Lock()

    def get(self, state: str, kg: int, key, default=None):
        """The value of ``key`` in value state ``state`` (key group ``kg``), or ``default``."""
        raise NotImplementedError

    def map_items(self, state: str, kg: int, key) -> dict:
        """``key``'s whole map in map state ``state`` (a fresh dict; empty if none)."""
        raise NotImplementedError

    def release(self) -> None:
        """Free what the view pins; idempotent, any thread. Reads after it are undefined."""
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()


class HeapView(StateView):
    """Frozen bucket dicts of the heap backend: ``{state: {kg: {key: value}}}`` per kind."""

    def __init__(self, values: dict, maps: dict, release: Callable[[], None]):
        super().__init__(release)
        self._values, self._maps = values, maps

    def get(self, state: str, kg: int, key, default=None):
        bucket = self._values.get(state, {}).get(kg)
        if bucket is None:
            return default
        return bucket.get(key, default)

    def map_items(self, state: str, kg: int, key) -> dict:
        bucket = self._maps.get(state, {}).get(kg)
        inner = None if bucket is None else bucket.get(key)
        return {} if inner is None else dict(inner)


class RocksDBView(StateView):
    """A RocksDB snapshot read by point lookups. ``key_of(kind, state, kg, key)`` is the
    backend's key layout (``None``: the state was never written)."""

    reads_whole_maps = False  # a rocksdict snapshot iterates live data (DESIGN.md "Facts")

    def __init__(self, snapshot, key_of: Callable, release: Callable[[], None] | None = None):
        super().__init__(release)
        self._snapshot, self._key_of = snapshot, key_of

    def _raw(self, k: bytes | None):
        if k is None:
            return None
        try:
            return self._snapshot[k]
        except KeyError:
            return None
        except Exception as exc:  # rocksdict raises a bare Exception for a missing key
            if "not found" in str(exc):
                return None
            raise

    def get(self, state: str, kg: int, key, default=None):
        raw = self._raw(self._key_of("v", state, kg, key))
        return default if raw is None else pickle.loads(raw)[1]

    def map_items(self, state: str, kg: int, key) -> dict:
        raise NotImplementedError("reading a whole map state from a committed RocksDB version is not supported "
                                  "(rocksdict snapshots iterate live data); query a value state, or use the heap "
                                  "backend for queryable map state")
