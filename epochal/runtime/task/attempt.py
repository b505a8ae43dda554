"""What every task of one job attempt receives (pickled once per attempt by the driver)."""
from __future__ import annotations

from dataclasses import dataclass, field

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

    ``key`` is the per-attempt connection key (:func:`epochal.runtime.transport.wire.derive_key`)
    and ``tls`` the attempt's pinned certificate and private key
    (:class:`~epochal.runtime.transport.tls.TLSMaterial`, ``None`` without encryption); both travel
    inside the task closure through the launcher (Spark's own task channel or a local
    process pipe), never over epochal's data connections, and never appear in a ``repr``.

    ``bind_host`` is where tasks bind when their launcher does not say where they run
    (local runs: loopback); ``coordinator`` the address the coordinator is reached at.
    """

    plan_blob: bytes = field(repr=False)  # cloudpickled PhysicalPlan: user code, loaded inside the task
    generation: int
    key: bytes = field(repr=False)
    coordinator: tuple[str, int]
    components: GuaranteeComponents
    channels: ChannelConfig
    storage_url: str
    faults: tuple = ()
    bind_host: str = "127.0.0.1"
    backend: BackendSpec = BackendSpec()
    tls: object = field(default=None, repr=False)  # TLSMaterial or None
    metrics_interval: float = 1.0  # seconds between a task's ("metrics", ...) reports
    #: seconds after which a peer host that stopped answering is lost (wire.PeerLost);
    #: ``None`` on loopback (local runs), ClusterConfig.peer_timeout on a cluster
    peer_timeout: float | None = None
    #: seconds a storage call retries transient errors (CheckpointConfig.storage_retry,
    #: at most its timeout; epochal.backends.retry)
    storage_retry: float = 30.0
    #: task state up to this many bytes travels inline with the ack (CheckpointConfig.inline_state)
    inline_state: int = 0
    #: the run's lineage (epochal.epochs.lineage.Lineage): sinks name their recovery records by it
    lineage: object = None
    #: wire key of the job's query connections (epochal.query.protocol.query_key); ``None``: no queries
    query_key: bytes | None = field(default=None, repr=False)
    query_tls: object = field(default=None, repr=False)  # TLSMaterial of the job's queries, or None
    #: signs what tasks write to checkpoint storage and later unpickle (the eventual-checkpoint
    #: logs): derived from CheckpointConfig.signing_key (epochal.backends.signing.derived_key),
    #: the same in every generation; ``None`` when the job's checkpoints are unsigned
    log_key: bytes | None = field(default=None, repr=False)
