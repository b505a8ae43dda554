"""In-memory keyed state with copy-on-write asynchronous snapshots (seed 004 §4.5.1,
Table 4.1 "Local (Heap)"; seed 001 "Approach 3 (copy-on-write)").

State lives in one plain ``dict`` per (state, key group) — a *bucket*. The synchronous
part of a snapshot bumps a version and keeps references to the current bucket dicts:
O(number of non-empty buckets), independent of the number of keys. From then on a bucket
dict captured by a pending snapshot is frozen — never mutated again:

* the first write (or read-for-mutation) of a frozen bucket replaces it by a shallow copy
  (Flink's ``CopyOnWriteStateMap``, at key-group granularity);
* values are objects the user may mutate after :meth:`~HeapStateBackend.get`: a mutable
  value (anything but int/float/complex/str/bytes/bool/None and tuples/frozensets of them)
  still shared with a pending snapshot is ``copy.deepcopy``-ed once per key per snapshot
  version before it is returned; map-state inner dicts are copied the same way.

So :meth:`SnapshotJob.run` can pickle the frozen dicts on the uploader thread, without
locks, while the task keeps processing (``snapshot_mode="thread"``).

Snapshot modes, one per ``snapshot_mode``:

* ``"fork"``: the synchronous part forks a child that serializes the state as of the
  barrier; the OS copies pages on write (:mod:`epochal.backends.forked`). The bookkeeping
  above stays idle (no bucket is ever frozen), so accesses take the fast paths. Needed
  because pickling on a thread holds the GIL: with hundreds of megabytes of state the task
  thread stalled as long as in the blocking baseline (``benchmarks/state.py``).
* ``"thread"`` (default where fork is unavailable): the copy-on-write scheme above,
  pickled on the uploader thread.
* ``"auto"`` (default on Linux): ``"fork"`` once the previous snapshot (or the restored
  state) was at least ``fork_min_bytes`` (16 MB), ``"thread"`` below. A fork has a fixed
  cost (page tables, then copy-on-write faults in the task process: measured 26 ms vs 8 ms
  sync part per task for kilobytes of state at parallelism 4 on 2 cores), while pickling
  kilobytes on a thread stalls the task for microseconds.
* ``"blocking"``: serializes inside :meth:`~HeapStateBackend.snapshot` — the measured
  baseline (seed 001 Fig. 2), never the right choice for a real job.

    >>> b = HeapStateBackend(range(0, 128))
    >>> b.put("count/sum", 7, "a", [1])
    >>> job = b.snapshot(1)
    >>> b.get("count/sum", 7, "a").append(2)    # copy: the snapshot keeps [1]
    >>> b2 = HeapStateBackend(range(0, 128)); b2.restore([job.run()])
    >>> b2.get("count/sum", 7, "a"), b.get("count/sum", 7, "a")
    ([1], [1, 2])
"""
from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from epochal.backends.base import KeyedStateBackend, SnapshotJob, decode_snapshot, encode_snapshot
from epochal.backends.forked import ForkedSnapshot, fork_available
from epochal.backends.views import HeapView
from epochal.backends.workdir import WorkDir, make_workdir
from epochal.errors import ConfigError

__all__ = ["HeapStateBackend"]

_MISSING = object()
_ATOMIC = frozenset({int, float, complex, str, bytes, bool, type(None)})


def _is_immutable(value) -> bool:
    t = type(value)
    if t in _ATOMIC:
        return True
    if t is tuple or t is frozenset:
        return all(_is_immutable(v) for v in value)
    return False


class _Bucket:
    """The dict of one (state, key group), plus its copy-on-write bookkeeping.

    ``version``: backend version when ``data`` was created; ``data`` is frozen while a
    pending snapshot has a fence above it. ``values_shared``: ``data`` was copied from a
    frozen dict, so its values (and map inner dicts) not listed in ``owned`` /
    ``owned_mk`` may still be referenced by a pending snapshot.
    """

    __slots__ = ("data", "version", "values_shared", "owned", "owned_mk")

    def __init__(self, data: dict, version: int):
        self.data = data
        self.version = version
        self.values_shared = False
        self.owned: set = set()
        self.owned_mk: set = set()


class HeapStateBackend(KeyedStateBackend):
    """Keyed state in Python dicts; snapshots are copy-on-write (see module docstring).

    Args:
        key_groups: the key groups this task owns.
        snapshot_mode: ``"auto"``, ``"fork"``, ``"thread"`` or ``"blocking"`` (see the
            module docstring); ``None`` picks ``"auto"`` where the platform can fork.
        fork_min_bytes: ``"auto"`` forks once a snapshot reached this size.
        tmp_dir: where forked children write snapshot files before the upload (default:
            the system's temporary directory); a directory on the checkpoint storage's
            device makes the publishing a rename.

    Raises:
        ConfigError: naming ``snapshot_mode`` for an unknown or unsupported mode.
    """

    MODES = ("auto", "fork", "thread", "blocking")
    FORK_MIN_BYTES = 16 << 20

    def __init__(self, key_groups: range, *, snapshot_mode: str | None = None, tmp_dir: str | None = None,
                 fork_min_bytes: int = FORK_MIN_BYTES):
        super().__init__(key_groups)
        if snapshot_mode is None:
            snapshot_mode = "auto" if fork_available() else "thread"
        if snapshot_mode not in self.MODES:
            raise ConfigError(f"backend option snapshot_mode: expected one of {self.MODES}, got {snapshot_mode!r}")
        if snapshot_mode in ("fork", "auto") and not fork_available():
            raise ConfigError(f"backend option snapshot_mode: {snapshot_mode!r} needs Linux; use 'thread'")
        self.snapshot_mode = snapshot_mode
        self.fork_min_bytes = fork_min_bytes
        self.last_snapshot_mode: str | None = None  # the mode the latest snapshot() used
        # size of the newest finished snapshot (or of the restored blobs); written by the
        # uploader thread, read by the task thread: a stale value only delays the switch
        self._last_bytes = 0
        self._tmp_parent = tmp_dir
        self._workdir: WorkDir | None = None
        self._forked: set[ForkedSnapshot] = set()
        self._values: dict[str, dict[int, _Bucket]] = {}
        self._maps: dict[str, dict[int, _Bucket]] = {}
        self._version = 1
        # Buckets with version < _highest_required are frozen. Raised only by the task
        # thread (snapshot), lowered by whichever thread finishes a job (under _lock); a
        # stale read on the task thread can only be too high → a harmless extra copy.
        self._highest_required = 0
        self._pending: Counter[int] = Counter()
        self._pins: Counter[int] = Counter()  # fences of pinned query views (pin_view)
        self._lock = threading.Lock()

    # ------------------------------------------------------------- copy-on-write core
    def _writable(self, b: _Bucket) -> dict:
        """``b.data``, first replaced by a private shallow copy if a snapshot froze it."""
        hr = self._highest_required
        if b.version < hr:
            b.data = dict(b.data)
            b.version = self._version
            b.values_shared = True
            b.owned = set()
            b.owned_mk = set()
        elif hr == 0 and b.values_shared:  # no snapshot pending: nothing is shared
            b.values_shared = False
            b.owned.clear()
            b.owned_mk.clear()
        return b.data

    def _private_value(self, b: _Bucket, key, value):
        """``value`` of ``key``, deep-copied first if a pending snapshot may see it."""
        data = self._writable(b)
        if b.values_shared and key not in b.owned:
            if not _is_immutable(value):
                value = copy.deepcopy(value)
                data[key] = value
            b.owned.add(key)
        return value

    def _inner_for_write(self, b: _Bucket, key, create: bool) -> dict | None:
        """``key``'s map dict, private to the live state (shallow-copied if shared)."""
        data = self._writable(b)
        inner = data.get(key)
        if inner is None:
            if not create:
                return None
            inner = data[key] = {}
        elif b.values_shared and key not in b.owned:
            inner = data[key] = dict(inner)
        if b.values_shared:
            b.owned.add(key)
        return inner

    def _bucket(self, tables: dict, state: str, kg: int) -> _Bucket:
        table = tables.get(state)
        if table is None:
            table = tables[state] = {}
        b = table.get(kg)
        if b is None:
            b = table[kg] = _Bucket({}, self._version)
        return b

    @staticmethod
    def _find(tables: dict, state: str, kg: int) -> _Bucket | None:
        table = tables.get(state)
        return None if table is None else table.get(kg)

    @staticmethod
    def _drop_if_empty(tables: dict, state: str, kg: int, b: _Bucket) -> None:
        if not b.data:
            table = tables[state]
            del table[kg]
            if not table:
                del tables[state]

    # -------------------------------------------------------------------- value state
    def get(self, state: str, kg: int, key, default=None):
        table = self._values.get(state)  # _find, inlined: this runs once per record
        b = None if table is None else table.get(kg)
        if b is None:
            return default
        value = b.data.get(key, _MISSING)
        if value is _MISSING:
            return default
        if type(value) in _ATOMIC or (self._highest_required == 0 and not b.values_shared):
            return value
        return self._private_value(b, key, value)

    def put(self, state: str, kg: int, key, value) -> None:
        table = self._values.get(state)
        b = None if table is None else table.get(kg)
        if b is None:
            b = self._bucket(self._values, state, kg)
        elif b.version >= self._highest_required and not b.values_shared:
            b.data[key] = value  # not frozen, nothing shared: what _writable would return as is
            return
        self._writable(b)[key] = value
        if b.values_shared:
            b.owned.add(key)

    def delete(self, state: str, kg: int, key) -> None:
        b = self._find(self._values, state, kg)
        if b is None or key not in b.data:
            return
        del self._writable(b)[key]
        b.owned.discard(key)
        self._drop_if_empty(self._values, state, kg, b)

    def contains(self, state: str, kg: int, key) -> bool:
        b = self._find(self._values, state, kg)
        return b is not None and key in b.data

    keeps_objects = True

    def value_items(self, state: str, kg: int) -> list[tuple[Any, Any]]:
        b = self._find(self._values, state, kg)
        return [] if b is None else list(b.data.items())

    # ---------------------------------------------------------------------- map state
    def map_get(self, state: str, kg: int, key, mk, default=None):
        b = self._find(self._maps, state, kg)
        inner = None if b is None else b.data.get(key)
        if inner is None:
            return default
        value = inner.get(mk, _MISSING)
        if value is _MISSING:
            return default
        if type(value) in _ATOMIC or (self._highest_required == 0 and not b.values_shared):
            return value
        inner = self._inner_for_write(b, key, create=False)
        if b.values_shared and (key, mk) not in b.owned_mk:
            if not _is_immutable(value):
                value = inner[mk] = copy.deepcopy(value)
            b.owned_mk.add((key, mk))
        return value

    def map_put(self, state: str, kg: int, key, mk, value) -> None:
        b = self._bucket(self._maps, state, kg)
        self._inner_for_write(b, key, create=True)[mk] = value
        if b.values_shared:
            b.owned_mk.add((key, mk))

    def map_delete(self, state: str, kg: int, key, mk) -> None:
        b = self._find(self._maps, state, kg)
        inner = None if b is None else b.data.get(key)
        if inner is None or mk not in inner:
            return
        inner = self._inner_for_write(b, key, create=False)
        del inner[mk]
        b.owned_mk.discard((key, mk))
        if not inner:
            del b.data[key]
            b.owned.discard(key)
            self._drop_if_empty(self._maps, state, kg, b)

    def map_contains(self, state: str, kg: int, key, mk) -> bool:
        b = self._find(self._maps, state, kg)
        inner = None if b is None else b.data.get(key)
        return inner is not None and mk in inner

    def map_items(self, state: str, kg: int, key) -> list[tuple[Any, Any]]:
        b = self._find(self._maps, state, kg)
        inner = None if b is None else b.data.get(key)
        if inner is None:
            return []
        if self._highest_required == 0 and not b.values_shared:
            return list(inner.items())
        inner = self._inner_for_write(b, key, create=False)
        if b.values_shared:
            for mk, value in inner.items():
                if (key, mk) not in b.owned_mk:
                    if not _is_immutable(value):
                        inner[mk] = copy.deepcopy(value)  # same keys: safe while iterating
                    b.owned_mk.add((key, mk))
        return list(inner.items())

    def map_clear(self, state: str, kg: int, key) -> None:
        b = self._find(self._maps, state, kg)
        if b is None or key not in b.data:
            return
        del self._writable(b)[key]
        b.owned.discard(key)
        self._drop_if_empty(self._maps, state, kg, b)

    def map_keys(self, state: str, kg: int) -> list:
        b = self._find(self._maps, state, kg)
        return [] if b is None else list(b.data)

    # ------------------------------------------------------------------- snapshots
    def _capture(self) -> dict[int, tuple[dict, dict]]:
        """``{kg: (values, maps)}`` referencing the current bucket dicts (no copying)."""
        sections: dict[int, tuple[dict, dict]] = {}
        for pos, tables in ((0, self._values), (1, self._maps)):
            for state, table in tables.items():
                for kg, b in table.items():
                    if b.data:
                        sections.setdefault(kg, ({}, {}))[pos][state] = b.data
        return sections

    def snapshot(self, epoch: int) -> SnapshotJob:
        """Freeze the current bucket dicts (O(buckets)); :meth:`SnapshotJob.run` pickles
        them later on the uploader thread. See :meth:`KeyedStateBackend.snapshot`."""
        mode = self.snapshot_mode
        if mode == "auto":
            mode = "fork" if self._last_bytes >= self.fork_min_bytes else "thread"
        self.last_snapshot_mode = mode
        if mode == "blocking":
            data = encode_snapshot(self._capture().items())
            return SnapshotJob(epoch, lambda: data)
        if mode == "fork":
            return self._fork_snapshot(epoch)
        self._version += 1
        fence = self._version  # every existing bucket has version < fence: frozen
        sections = self._capture()
        with self._lock:
            self._pending[fence] += 1
            self._highest_required = fence

        def release() -> None:
            with self._lock:
                self._pending[fence] -= 1
                if not self._pending[fence]:
                    del self._pending[fence]
                self._highest_required = max(max(self._pending, default=0), max(self._pins, default=0))

        def produce() -> bytes:
            data = encode_snapshot(sections.items())
            self._last_bytes = len(data)
            return data

        return SnapshotJob(epoch, produce, release)

    def _fork_snapshot(self, epoch: int) -> SnapshotJob:
        """Fork mode's synchronous part: one ``fork()``; the job uploads the child's file."""
        if self._workdir is None:
            self._workdir = make_workdir("heap", self._tmp_parent)
        snap = ForkedSnapshot.start(epoch, lambda: self._capture().items(), self._workdir.path)
        with self._lock:
            self._forked.add(snap)

        def release():
            snap.cancel()
            with self._lock:
                self._forked.discard(snap)

        def upload(storage, owner):
            result = snap.upload(storage, owner)
            self._last_bytes = len(result) if isinstance(result, bytes) else result["state_bytes"]
            return result

        return SnapshotJob(epoch, upload, release, uses_storage=True)

    def pin_view(self, states, whole_maps: bool = False) -> HeapView:
        """Freeze the buckets of ``states`` for a read-committed query view
        (:mod:`epochal.backends.views`): the same copy-on-write fence as a thread-mode
        snapshot, held until the view is released. O(buckets of ``states``)."""
        self._version += 1
        fence = self._version
        values = {s: {kg: b.data for kg, b in self._values.get(s, {}).items()} for s in states}
        maps = {s: {kg: b.data for kg, b in self._maps.get(s, {}).items()} for s in states}
        with self._lock:
            self._pins[fence] += 1
            self._highest_required = fence

        def release() -> None:
            with self._lock:
                self._pins[fence] -= 1
                if not self._pins[fence]:
                    del self._pins[fence]
                self._highest_required = max(max(self._pending, default=0), max(self._pins, default=0))

        return HeapView(values, maps, release)

    @property
    def pending_snapshots(self) -> int:
        """Snapshots taken whose job has neither finished running nor been released."""
        with self._lock:
            return sum(self._pending.values()) + len(self._forked)

    def restore(self, blobs: Iterable[bytes]) -> None:
        blobs = list(blobs)
        self._last_bytes = sum(len(b) for b in blobs)  # an upper bound of this task's share
        for blob in blobs:
            for kg, (values, maps) in decode_snapshot(blob, self.key_groups):
                for tables, part in ((self._values, values), (self._maps, maps)):
                    for state, entries in part.items():
                        b = self._bucket(tables, state, kg)
                        if b.data:
                            self._writable(b).update(entries)
                        else:  # adopt the freshly unpickled dict
                            b.data = entries

    def state_names(self) -> set[str]:
        return set(self._values) | set(self._maps)

    def drop_state(self, state: str) -> None:
        # pending snapshots hold their own frozen buckets: dropping the table leaves them intact
        self._values.pop(state, None)
        self._maps.pop(state, None)

    def entries(self) -> Iterator[tuple[str, str, int, Any, Any]]:
        for kind, tables in (("value", self._values), ("map", self._maps)):
            for state, table in tables.items():
                for kg, b in table.items():
                    for key, value in list(b.data.items()):
                        yield kind, state, kg, key, (dict(value) if kind == "map" else value)

    def close(self) -> None:
        with self._lock:
            forked, self._forked = list(self._forked), set()
        for snap in forked:
            snap.cancel()
        if self._workdir is not None:
            self._workdir.remove()
            self._workdir = None
        self._values.clear()
        self._maps.clear()
