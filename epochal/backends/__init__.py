"""Keyed state backends, key groups and checkpoint storage (seed 004 §4.1.4, §4.2, §4.5).

* :mod:`~epochal.backends.keygroups` — stable key hashing, key groups, ranges per subtask;
* :class:`KeyedStateBackend` / :class:`SnapshotJob` — the backend contract: a short
  synchronous snapshot at the barrier, serialization later, off the task thread;
* :class:`HeapStateBackend` — in-memory state; snapshots serialized by a forked child
  (:mod:`~epochal.backends.forked`) or, copy-on-write, on a thread;
* :class:`CheckpointStorage` — ``chk-<epoch>/`` directories on fsspec, ``_metadata`` last.
"""
from epochal.backends.base import KeyedStateBackend, SnapshotJob, SnapshotJobState
from epochal.backends.heap import HeapStateBackend
from epochal.backends.keygroups import (
    DEFAULT_MAX_PARALLELISM,
    key_group_for,
    key_group_range,
    stable_hash,
    subtask_for_key_group,
)
from epochal.backends.storage import CheckpointStorage, StateHandle

__all__ = [
    "DEFAULT_MAX_PARALLELISM",
    "CheckpointStorage",
    "HeapStateBackend",
    "KeyedStateBackend",
    "SnapshotJob",
    "SnapshotJobState",
    "StateHandle",
    "key_group_for",
    "key_group_range",
    "stable_hash",
    "subtask_for_key_group",
]

__all__.append("RocksDBStateBackend")


def __getattr__(name: str):
    """``RocksDBStateBackend`` is imported on first use: it needs rocksdict, which a
    heap-only deployment need not install."""
    if name == "RocksDBStateBackend":
        from epochal.backends.rocksdb import RocksDBStateBackend

        return RocksDBStateBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
