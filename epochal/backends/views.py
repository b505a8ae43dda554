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
  "Facts": its iteration is not, so a view never iterates it); for whole-map reads also a
  checkpoint directory of the same instant, iterated read-only, deleted at release.
"""
from __future__ import annotations

import pickle
import threading
from collections.abc import Callable

from rocksdict import AccessType, Options, Rdict

from epochal.backends.rocksdb_layout import scan

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


class ViewReleased(LookupError):
    """A read of a view released meanwhile (the version left the held set): ask again."""


class RocksDBView(StateView):
    """A RocksDB snapshot read by point lookups. ``key_of(kind, state, kg, key)`` is the
    backend's key layout (``None``: the state was never written).

    With ``checkpoint`` (a checkpoint directory of the same instant, hard-linked SSTs) a
    whole map is read by iterating that directory, opened read-only on the first such read
    (a rocksdict snapshot iterates live data, DESIGN.md "Facts"); :meth:`release` closes it
    once the reads in progress end, then ``release`` (the caller's: deletes the directory)."""

    def __init__(self, snapshot, key_of: Callable, release: Callable[[], None] | None = None,
                 checkpoint: str | None = None):
        super().__init__(release)
        self._snapshot, self._key_of = snapshot, key_of
        self.checkpoint = checkpoint
        self.reads_whole_maps = checkpoint is not None
        self._db = None  # the checkpoint, opened read-only
        self._reads = threading.Lock()  # whole-map reads vs. closing the checkpoint
        self._released = False

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
        if self.checkpoint is None:
            raise NotImplementedError("this RocksDB version was pinned for point reads only (no state read whole "
                                      "maps when it was pinned)")
        prefix = self._key_of("m", state, kg, key)
        with self._reads:
            if self._released:
                raise ViewReleased("the version was released")
            if prefix is None:
                return {}
            if self._db is None:
                self._db = Rdict(self.checkpoint, Options(raw_mode=True), access_type=AccessType.read_only(False))
            return {mk: value for _k, (_key, mk, value) in
                    ((k, pickle.loads(raw)) for k, raw in scan(self._db, prefix, _prefix_end(prefix)))}

    def release(self) -> None:
        with self._reads:
            self._released = True
            db, self._db = self._db, None
        if db is not None:
            db.close()
        super().release()


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes([stripped[-1] + 1])


class CheckpointView(StateView):
    """A RocksDB checkpoint directory (:meth:`RocksDBView.checkpoint`), opened read-only by
    another process — the task's query sidecar (:mod:`epochal.query.sidecar`) — that reads
    it without the task's interpreter lock. The directory describes itself (state ids under
    :data:`~epochal.backends.rocksdb_layout.META`). Opened at construction (off the query
    path); :meth:`release` waits for a read in progress, closes, then calls ``release``."""

    def __init__(self, path: str, release: Callable[[], None] | None = None):
        super().__init__(release)
        from epochal.backends.rocksdb_layout import META

        self._db = Rdict(path, Options(raw_mode=True), access_type=AccessType.read_only(False))
        self._sids: dict[tuple[str, str], bytes] = {}
        for k, raw in scan(self._db, META, META + b"\xff\xff\xff"):
            text = raw.decode("utf-8", "surrogatepass")
            self._sids[(text[0], text[1:])] = k[2:4]
        self._reads = threading.Lock()

    def _key(self, kind: str, state: str, key) -> bytes | None:
        """The key of ``key`` without its key group (the backend's layout); ``None``: the
        state was never written, or ``key`` is of a type no state stores."""
        from epochal.backends.keygroups import _encode  # the backend's canonical key encoding

        sid = self._sids.get((kind, state))
        if sid is None:
            return None
        try:
            ek = _encode(key)
        except TypeError:
            return None
        return sid + len(ek).to_bytes(4, "big") + ek

    def get(self, state: str, kg: int, key, default=None):
        k = self._key("v", state, key)
        with self._reads:
            if self._db is None:
                raise ViewReleased("the version was released")
            raw = None if k is None else self._db.get(kg.to_bytes(2, "big") + k)
        return default if raw is None else pickle.loads(raw)[1]

    def map_items(self, state: str, kg: int, key) -> dict:
        k = self._key("m", state, key)
        if k is None:
            return {}
        prefix = kg.to_bytes(2, "big") + k
        with self._reads:
            if self._db is None:
                raise ViewReleased("the version was released")
            return {mk: value for _key, mk, value in
                    (pickle.loads(raw) for _k, raw in scan(self._db, prefix, _prefix_end(prefix)))}

    def release(self) -> None:
        with self._reads:
            db, self._db = self._db, None
        if db is not None:
            db.close()
        super().release()
