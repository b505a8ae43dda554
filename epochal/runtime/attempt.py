"""What every task of one job attempt receives (pickled once per attempt by the driver)."""
from __future__ import annotations

from dataclasses import dataclass

from epochal.alignment.factory import GuaranteeComponents
from epochal.backends.choice import BackendSpec
from epochal.config import ChannelConfig


@dataclass(frozen=True)
class RestorePoint:
    """The completed checkpoint an attempt restores from: its epoch and its ``_metadata``."""

    epoch: int
    metadata: dict


@dataclass(frozen=True)
class AttemptSpec:
    """One attempt (generation) of a job, as shipped to every task.

    The spec itself holds only epochal and standard types; the user's code travels in
    ``plan_blob`` so a task that cannot load it (a module missing on the worker) can still
    reach the coordinator and report why.

    ``key`` is the per-attempt connection key (:func:`epochal.runtime.wire.derive_key`);
    it travels inside the task closure through the launcher (Spark's own task channel or
    a local process pipe), never over epochal's data connections.
    """

    plan_blob: bytes  # cloudpickled PhysicalPlan: user code, loaded inside the task
    generation: int
    key: bytes
    coordinator: tuple[str, int]
    components: GuaranteeComponents
    channels: ChannelConfig
    storage_url: str
    faults: tuple = ()
    bind_host: str = "127.0.0.1"
    backend: BackendSpec = BackendSpec()
