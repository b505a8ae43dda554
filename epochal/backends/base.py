"""Keyed state of one physical task, snapshotted per epoch (seed 004 §4.1.4, §4.2, §4.5.1).

A :class:`KeyedStateBackend` holds every keyed state of the operators chained into one
task, for the key groups the task owns. An epoch snapshot has two parts (seed 004 §4.5.1,
seed 001 "non-blocking checkpointing"):

1. **synchronous** — :meth:`KeyedStateBackend.snapshot`, on the task thread at the
   barrier, with exclusive access to the state: pins the state as of this instant
   (copy-on-write freeze, RocksDB snapshot, ...) and returns quickly;
2. **asynchronous** — :meth:`SnapshotJob.run`, on a background uploader thread while the
   task keeps processing records: serializes the pinned state to bytes.

In Table 4.1 terms the synchronous part is the backend's *pre-commit* and
:meth:`SnapshotJob.release` its *abort* ("delete snapshot").

Snapshot bytes are in the portable format of :mod:`epochal.backends.formats` (organised
by key group), which this module re-exports (``encode_snapshot``, ``decode_snapshot``,
``write_snapshot``, ``FORMAT_VERSION``).
"""
from __future__ import annotations

import enum
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from epochal.backends.formats import FORMAT_VERSION, decode_snapshot, encode_snapshot, to_portable, write_snapshot
from epochal.errors import EpochalError

__all__ = [
    "FORMAT_VERSION",
    "KeyedStateBackend",
    "SnapshotJob",
    "SnapshotJobState",
    "decode_snapshot",
    "encode_snapshot",
    "write_snapshot",
]


class SnapshotJobState(enum.Enum):
    """Lifecycle of a :class:`SnapshotJob`: PENDING → RUNNING → DONE | FAILED, or
    PENDING → RELEASED (also RUNNING → RELEASED when released while running)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    RELEASED = "released"


class SnapshotJob:
    """The asynchronous part of one epoch's snapshot of one backend.

    Created by :meth:`KeyedStateBackend.snapshot`; the uploader calls :meth:`run` exactly
    once on its own thread, or :meth:`release` if the epoch is aborted before the upload.
    Either way the backend's pinned resources are freed exactly once (``on_release``).

    Args:
        epoch: the epoch this snapshot belongs to.
        produce: returns the snapshot bytes; runs on the uploader thread.
        on_release: frees what the synchronous part pinned; called once, on the thread
            that finishes the job (after ``produce`` returned or raised, or at release).
        uses_storage: ``produce`` uploads files itself: it is called as
            ``produce(storage, owner)`` (see :meth:`run`) and returns a small picklable
            dict describing what it uploaded (an incremental snapshot, seed 004 §4.5.2)
            instead of the snapshot bytes.
    """

    def __init__(
        self,
        epoch: int,
        produce: Callable[..., Any],
        on_release: Callable[[], None] | None = None,
        uses_storage: bool = False,
    ):
        self.epoch = epoch
        self._produce: Callable[..., Any] | None = produce
        self._on_release = on_release
        self.uses_storage = uses_storage
        self._lock = threading.Lock()
        self._state = SnapshotJobState.PENDING
        self._release_requested = False

    @property
    def state(self) -> SnapshotJobState:
        return self._state

    def run(self, storage=None, owner: str | None = None) -> bytes | dict:
        """Serialize the state as it was at the :meth:`KeyedStateBackend.snapshot` call.

        Thread: any (normally the uploader), concurrently with the task mutating state.
        Not idempotent: a second call, or a call after :meth:`release`, raises.

        Args:
            storage: the task's :class:`~epochal.backends.storage.CheckpointStorage`;
                only jobs with ``uses_storage`` use it (they upload their files there
                and return a descriptor dict instead of bytes; without storage, a forked
                heap snapshot returns its bytes, an incremental RocksDB one raises).
            owner: storage-safe name of the task (its private shared-file area).

        Raises:
            EpochalError: the job already ran or was released.
        """
        with self._lock:
            if self._state is not SnapshotJobState.PENDING:
                raise EpochalError(
                    f"snapshot job of epoch {self.epoch} cannot run: it is {self._state.value}"
                )
            self._state = SnapshotJobState.RUNNING
            produce, self._produce = self._produce, None
        outcome = SnapshotJobState.FAILED
        try:
            data = produce(storage, owner) if self.uses_storage else produce()
            outcome = SnapshotJobState.DONE
            return data
        finally:
            with self._lock:
                self._state = SnapshotJobState.RELEASED if self._release_requested else outcome
            self._free()

    def release(self) -> None:
        """Give up the snapshot (epoch aborted / upload cancelled) and free its resources.

        Idempotent; safe from any thread. While :meth:`run` executes, the resources are
        freed when it returns (its bytes stay valid).
        """
        with self._lock:
            if self._state is SnapshotJobState.RUNNING:
                self._release_requested = True
                return
            if self._state is not SnapshotJobState.PENDING:
                return
            self._state = SnapshotJobState.RELEASED
            self._produce = None
        self._free()

    def _free(self) -> None:
        on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release()

    def __repr__(self) -> str:
        return f"SnapshotJob(epoch={self.epoch}, state={self._state.value})"


class KeyedStateBackend(ABC):
    """Keyed state of one physical task, for the key groups ``key_groups`` it owns.

    States are named ``"<operator>/<state>"`` (e.g. ``"count/sum"``); a name is used
    either as a value state or as a map state. Every accessor takes the key's key group
    ``kg`` (computed once per record by the caller with
    :func:`epochal.backends.keygroups.key_group_for`); it must lie in ``key_groups``.

    Threading: every method except :meth:`SnapshotJob.run` / ``release`` is called on the
    task thread only. Values handed to :meth:`put` or returned by :meth:`get` belong to the
    backend: after the next :meth:`snapshot`, mutate a value only after obtaining it again
    with :meth:`get` / :meth:`map_get` (backends copy values shared with a pending snapshot).
    """

    def __init__(self, key_groups: range):
        if not isinstance(key_groups, range) or key_groups.step != 1:
            raise ValueError(f"key_groups must be a contiguous range, got {key_groups!r}")
        self.key_groups = key_groups

    # ----------------------------------------------------------------- value state
    @abstractmethod
    def get(self, state: str, kg: int, key, default=None):
        """The value of ``key`` in ``state``, or ``default``. The returned value may be
        mutated in place by the caller (then :meth:`put` it back)."""

    @abstractmethod
    def put(self, state: str, kg: int, key, value) -> None:
        """Set the value of ``key`` in ``state``; idempotent."""

    @abstractmethod
    def delete(self, state: str, kg: int, key) -> None:
        """Remove ``key`` from ``state``; idempotent (a missing key is not an error)."""

    @abstractmethod
    def contains(self, state: str, kg: int, key) -> bool:
        """Whether ``key`` has a value in ``state``."""

    # ------------------------------------------------------- value state, many keys
    #: values stay the very objects handed to :meth:`put` (no copy, no serialization per
    #: write; a snapshot serializes them later): a large immutable value — a columnar
    #: aggregate's block of many keys (:mod:`epochal.columnar.state`) — costs nothing to put
    keeps_objects: bool = False

    def get_many(self, state: str, kgs: list[int], keys: list, default=None) -> list:
        """``[get(state, kg, key, default) ...]`` for parallel lists ``kgs`` / ``keys``, in
        one batch where the backend can (RocksDB: one ``multi_get``)."""
        return [self.get(state, kg, key, default) for kg, key in zip(kgs, keys)]

    def put_many(self, state: str, kgs: list[int], keys: list, values: list) -> None:
        """``put`` of parallel lists, in one batch where the backend can (RocksDB: one
        ``WriteBatch``); idempotent."""
        for kg, key, value in zip(kgs, keys, values):
            self.put(state, kg, key, value)

    @abstractmethod
    def value_items(self, state: str, kg: int) -> list[tuple[Any, Any]]:
        """Every ``(key, value)`` of value state ``state`` in key group ``kg`` (a copy, any
        order). Task thread; used to convert state after a restore."""

    # ------------------------------------------------------------------- map state
    @abstractmethod
    def map_get(self, state: str, kg: int, key, mk, default=None):
        """The value under user map key ``mk`` of ``key``'s map, or ``default``."""

    @abstractmethod
    def map_put(self, state: str, kg: int, key, mk, value) -> None:
        """Set ``mk`` → ``value`` in ``key``'s map; idempotent."""

    @abstractmethod
    def map_delete(self, state: str, kg: int, key, mk) -> None:
        """Remove ``mk`` from ``key``'s map; idempotent."""

    @abstractmethod
    def map_contains(self, state: str, kg: int, key, mk) -> bool:
        """Whether ``key``'s map has ``mk``."""

    @abstractmethod
    def map_items(self, state: str, kg: int, key) -> list[tuple[Any, Any]]:
        """A list (a copy; safe to iterate while writing) of ``key``'s ``(mk, value)``."""

    @abstractmethod
    def map_clear(self, state: str, kg: int, key) -> None:
        """Remove ``key``'s whole map; idempotent."""

    #: ``True`` when :meth:`map_first_key` can find the smallest key of a map state in a
    #: key group without reading the others (keys kept sorted by their canonical bytes, as
    #: RocksDB does). Timer queues then keep only one head per key group in memory
    #: (:mod:`epochal.time.timers`); otherwise they index every timer in memory.
    ordered_map_keys: bool = False

    @abstractmethod
    def map_keys(self, state: str, kg: int) -> list:
        """Every key of key group ``kg`` whose map in ``state`` is not empty (a copy, any
        order). Task thread; used to rebuild in-memory indexes after a restore."""

    def map_first_key(self, state: str, kg: int):
        """The key of ``kg`` with a non-empty map in ``state`` whose canonical encoding
        (:func:`~epochal.backends.keygroups.stable_hash`'s) sorts first, or ``None``.
        Only for backends with :attr:`ordered_map_keys`."""
        raise NotImplementedError(f"{type(self).__name__} keeps no key order (ordered_map_keys is False)")

    # -------------------------------------------------------------- epoch snapshot
    @abstractmethod
    def snapshot(self, epoch: int) -> SnapshotJob:
        """Pin the state as of now for epoch ``epoch`` (synchronous part, §4.5.1).

        Called on the task thread at the barrier, after every record before the barrier
        was applied and before any record after it. Must return quickly; the returned job's
        :meth:`SnapshotJob.run` later yields bytes equal to the state at this call, however
        the task mutates state meanwhile. Several snapshots may be pending at once.
        """

    @abstractmethod
    def restore(self, blobs: Iterable[bytes]) -> None:
        """Load snapshot ``blobs`` (from any tasks, any key-group ranges) before processing.

        Called once on the task thread, on an empty backend, before the first record.
        Keeps only entries whose key group is in ``key_groups`` (rescaling, §4.2.2).

        Raises:
            CheckpointStorageError: a blob is not a valid snapshot.
        """

    @abstractmethod
    def entries(self) -> Iterator[tuple[str, str, int, Any, Any]]:
        """Every entry as ``(kind, state, kg, key, value)``, ``kind`` being ``"value"`` or
        ``"map"`` (then ``value`` is a ``{mk: v}`` dict copy). For tests and debugging."""

    def restore_from(self, items: Iterable[bytes | Mapping], storage) -> None:
        """Restore from what old tasks' snapshots produced: portable snapshot bytes,
        incremental RocksDB descriptors (:mod:`epochal.backends.incremental`) and/or
        forked heap snapshot files (:mod:`epochal.backends.forked`).

        The default downloads each descriptor's files from ``storage``, reads that
        database key group by key group into the portable format and calls
        :meth:`restore` — so any backend restores any backend's snapshots.
        """
        self.restore([to_portable(item, storage, self.key_groups) for item in items])

    @abstractmethod
    def state_names(self) -> set[str]:
        """The names of every state holding entries (or ever written, for RocksDB)."""

    @abstractmethod
    def drop_state(self, state: str) -> None:
        """Remove every entry of ``state`` (value or map), in every key group; idempotent.
        Task thread, after restore: state of an operator the new dataflow no longer has,
        restored with ``allow_non_restored_state``, is not carried into later snapshots."""

    #: read-committed queries are served by a sidecar process reading the checkpoint
    #: directory of each pinned view (``view.checkpoint``, :mod:`epochal.query.sidecar`)
    #: rather than by the task's own threads
    serves_queries_from_checkpoints = False

    def pin_view(self, states, whole_maps: bool = False):
        """A read-only :class:`~epochal.backends.views.StateView` of ``states`` as of now,
        readable from any thread while the task writes on (read-committed queries,
        :mod:`epochal.query`). ``whole_maps``: the view must read a key's whole map
        (``map_items``), not only point lookups. Task thread; the caller releases it."""
        raise NotImplementedError(f"{type(self).__name__} cannot pin a view for queries")

    def reclaim(self, state: str, kg: int) -> None:
        """Many entries of ``state`` in key group ``kg`` were just deleted (the TTL sweep,
        :mod:`epochal.ttl.cleanup`): free their space now if the backend keeps deletions
        around (RocksDB: compact that key range). Task thread; default: no-op (the heap
        frees on delete)."""

    def notify_epoch_complete(self, epoch: int) -> None:
        """Epoch ``epoch`` completed (its ``_metadata`` is written). Task thread. Backends
        with incremental snapshots move their base to that epoch's files; default: no-op."""

    def notify_epoch_aborted(self, epoch: int) -> None:
        """Epoch ``epoch`` was aborted by the coordinator. Task thread; default: no-op."""

    def close(self) -> None:
        """Release the backend's resources; the backend is unusable afterwards."""
