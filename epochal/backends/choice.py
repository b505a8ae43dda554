"""Choosing the keyed state backend of a job: ``flow.run(backend="heap" | "rocksdb" | spec)``.

The choice is validated on the driver (a bad value fails before any task starts, naming
the ``backend`` option) and shipped to the tasks as a small picklable
:class:`BackendSpec`; each task builds its own backend for its key groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from epochal.backends.base import KeyedStateBackend
from epochal.errors import ConfigError

KINDS = ("heap", "rocksdb")


@dataclass(frozen=True)
class BackendSpec:
    """Which backend a task builds, with its options.

    Attributes:
        kind: ``"heap"`` (in memory) or ``"rocksdb"`` (local RocksDB per task).
        options: keyword options of the backend's constructor, e.g. ``{"path": "/mnt/ssd"}``
            for RocksDB's working directory, ``{"incremental": True}`` for incremental
            RocksDB checkpoints, ``{"query_sidecar": False}`` to serve read-committed queries
            in the task process, not a sidecar process (docs/queryable-state.md), or
            ``{"snapshot_mode": "fork" | "thread" | "blocking"}`` to
            force one way of heap snapshots instead of ``"auto"`` (see
            :mod:`epochal.backends.heap`).
    """

    kind: str = "heap"
    options: dict = field(default_factory=dict)

    def create(self, key_groups: range) -> KeyedStateBackend:
        """Called once per task (inside the task process) before restore."""
        if self.kind == "rocksdb":
            from epochal.backends.rocksdb import RocksDBStateBackend

            return RocksDBStateBackend(key_groups, **self.options)
        from epochal.backends.heap import HeapStateBackend

        return HeapStateBackend(key_groups, **self.options)


def backend_spec(value) -> BackendSpec:
    """Normalise the ``backend`` run option.

    Raises:
        ConfigError: naming ``backend`` for an unknown kind, or when rocksdict is missing.
    """
    spec = value if isinstance(value, BackendSpec) else BackendSpec(value) if isinstance(value, str) else None
    if spec is None or spec.kind not in KINDS:
        raise ConfigError(f"backend: expected one of {KINDS} or a BackendSpec, got {value!r}")
    if spec.kind == "rocksdb":
        try:
            import rocksdict  # noqa: F401
        except ImportError:
            raise ConfigError("backend: 'rocksdb' needs the rocksdict package (pip install rocksdict)") from None
    return spec
