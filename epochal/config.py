"""Run-time configuration: the guarantee, checkpointing and restarts.

These objects are passed to ``Dataflow.run``; they are never part of the graph. Every
validation error names the offending config key.
"""
from __future__ import annotations

import datetime
import enum
import math
import re
from dataclasses import dataclass, field

from epochal.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$")
_UNIT = {None: 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
#: the largest frame a receiver accepts (epochal.runtime.transport.wire.MAX_FRAME)
MAX_FRAME_BYTES = 1 << 30


def parse_duration(value, key: str, *, optional: bool = False) -> float | None:
    """Seconds from ``1.5``, ``"200ms"``, ``"1s"``, ``"2min"``, a ``timedelta``; ``None`` only if ``optional``.

    Raises:
        ConfigError: naming ``key`` when the value is missing, negative, not finite or
            unparseable.
    """
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: a duration is required, got None")
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration, got {value!r}")
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ConfigError(f"{key}: cannot parse duration {value!r} (use e.g. 0.5, '200ms', '1s', '2min', '1h', '30d')")
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{key}: duration must be finite and >= 0, got {value!r}")
    return seconds


class Guarantee(enum.Enum):
    """Processing guarantee of a run. Read in exactly one place:
    :func:`epochal.alignment.factory.components_for`."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"

    @classmethod
    def parse(cls, value) -> "Guarantee":
        if isinstance(value, Guarantee):
            return value
        for g in cls:
            if str(value).lower().replace("_", "-") == g.value:
                return g
        raise ConfigError(f"guarantee: expected 'exactly-once' or 'at-least-once', got {value!r}")


@dataclass(frozen=True)
class CheckpointConfig:
    """How epochs are triggered and where their snapshots go.

    Attributes:
        interval: seconds (or a duration string) between periodic epoch triggers;
            ``None`` disables periodic epochs (manual and source-requested triggers, and
            the final epoch at end of input, still happen).
        storage: fsspec URL of the checkpoint root (``file:///...``, ``memory://...``,
            ``s3://...``); each job writes under ``<storage>/<job name>/``. ``None`` uses a
            fresh temporary directory.
        timeout: an epoch not complete after this many seconds is aborted.
        max_concurrent: at most this many epochs pending at once.
        min_pause: minimum seconds between the completion of one epoch and the next trigger.
        tolerable_failures: consecutive failed (aborted/declined) epochs tolerated before the
            job fails and restarts.
        retained: completed checkpoints kept; older ones are deleted.
        unaligned: exactly-once snapshots taken when an epoch's first barrier *arrives* at a
            task, not once it arrived on every input: the records in flight become part of
            the checkpoint (channel state) and barriers overtake queued data, so checkpoints
            stay fast under back-pressure (:mod:`epochal.alignment.unaligned`).
        aligned_timeout: start every epoch aligned and switch it to unaligned once its first
            barrier arrived this long ago at a task still aligning (a duration; ``None``:
            never switch). ``unaligned=True`` is ``aligned_timeout=0``.
        requests_poll: how often the driver looks in ``storage`` for savepoints requested
            from another process (``epochal savepoint trigger``,
            :mod:`epochal.runtime.driver.requests`): one listing of ``<job>/_requests`` per poll.
            ``None`` disables it.
        history: completed (and aborted) epochs the driver keeps in detail
            (``JobResult.completed_epochs``, ``JobHandle.completed_epochs``); older ones
            are only counted and summarised (durations and sizes, p50 / p99 within 1 %), so
            the driver's memory does not grow with the number of epochs.
        storage_retry: how long a storage call (a write, rename, read, listing, delete)
            keeps retrying a transient error — throttling (S3 ``503 SlowDown``), a timeout,
            a broken connection, the storage being down — with exponential backoff, at most
            ``timeout``; a permanent one (a missing file, denied access, a full disk) is not
            retried. A checkpoint whose files or ``_metadata`` still cannot be written is
            declined and the job runs on: ``tolerable_failures`` decides when it fails.
        signing_key: a secret (bytes or str, at least 16 bytes) the driver signs every
            checkpoint's ``_metadata`` with (HMAC-SHA256; ``_metadata`` holds the SHA-256 of
            every file of the checkpoint) and verifies before restoring one: a checkpoint
            someone planted or changed in the storage is refused. Keep it outside the
            storage (an environment variable, a secret manager). ``None``: unsigned on local
            runs; on a cluster (a non-``local`` master) the driver signs with a key it
            generates once and keeps beside the job, in ``~/.epochal/signing.key`` (0600;
            ``$EPOCHAL_HOME`` moves it), unless ``allow_unsigned`` (:mod:`epochal.runtime.driver.secure_defaults`).
        allow_unsigned: on a cluster with no ``signing_key``, write unsigned checkpoints
            (anyone who can write the storage then runs code in every executor at the next
            restore) instead of generating a key. Ignored by local runs.
        savepoint_targets: locations (URL prefixes) a savepoint requested through the
            storage (``epochal savepoint trigger``) may be written to, besides the job's own
            ``<storage>/<job>/savepoints/``; any other location is refused, so whoever can
            write the storage cannot make the driver write elsewhere.
        inline_state: a task's state of at most this many bytes is not written to a file
            of its own but sent with its acknowledgement and stored inside the epoch's
            ``_metadata`` (Flink's ``state.storage.fs.memory-threshold``): small and
            unchanged state then costs no file write, fsync and rename per task and epoch
            — what makes checkpoint intervals of a few milliseconds affordable (issue 24).
            ``0`` writes every state to a file.
    """

    interval: float | str | None = 1.0
    storage: str | None = None
    timeout: float | str = 60.0
    max_concurrent: int = 1
    min_pause: float | str = 0.0
    tolerable_failures: int = 0
    retained: int = 2
    unaligned: bool = False
    aligned_timeout: float | str | None = None
    requests_poll: float | str | None = 2.0
    history: int = 1000
    storage_retry: float | str = 30.0
    signing_key: bytes | str | None = field(default=None, repr=False)
    savepoint_targets: tuple = ()
    inline_state: int = 16 * 1024
    allow_unsigned: bool = False

    def __post_init__(self):
        object.__setattr__(self, "storage_retry", parse_duration(self.storage_retry, "checkpoint.storage_retry"))
        if self.signing_key is not None:
            from epochal.backends.signing import key_bytes

            try:
                object.__setattr__(self, "signing_key", key_bytes(self.signing_key))
            except ValueError as exc:
                raise ConfigError(f"checkpoint.signing_key: {exc}") from None
        if not isinstance(self.allow_unsigned, bool):
            raise ConfigError(f"checkpoint.allow_unsigned: expected True or False, got {self.allow_unsigned!r}")
        targets = self.savepoint_targets
        if isinstance(targets, str):
            targets = (targets,)
        if not isinstance(targets, (tuple, list)) or not all(isinstance(t, str) and t for t in targets):
            raise ConfigError(f"checkpoint.savepoint_targets: expected a list of URL prefixes or paths (e.g. "
                              f"['s3://backups/'] ), got {self.savepoint_targets!r}")
        object.__setattr__(self, "savepoint_targets", tuple(targets))
        object.__setattr__(self, "requests_poll",
                           parse_duration(self.requests_poll, "checkpoint.requests_poll", optional=True))
        if self.requests_poll is not None and self.requests_poll <= 0:
            raise ConfigError("checkpoint.requests_poll: must be > 0 (or None to ignore requests)")
        if not isinstance(self.unaligned, bool):
            raise ConfigError(f"checkpoint.unaligned: expected True or False, got {self.unaligned!r}")
        object.__setattr__(self, "aligned_timeout",
                           parse_duration(self.aligned_timeout, "checkpoint.aligned_timeout", optional=True))
        object.__setattr__(self, "interval", parse_duration(self.interval, "checkpoint.interval", optional=True))
        if self.interval is not None and self.interval <= 0:
            raise ConfigError("checkpoint.interval: must be > 0 (or None to disable periodic epochs)")
        object.__setattr__(self, "timeout", parse_duration(self.timeout, "checkpoint.timeout"))
        if self.timeout <= 0:
            raise ConfigError("checkpoint.timeout: must be > 0")
        object.__setattr__(self, "min_pause", parse_duration(self.min_pause, "checkpoint.min_pause"))
        for key in ("max_concurrent", "retained", "history"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"checkpoint.{key}: must be an integer >= 1, got {v!r}")
        for key in ("tolerable_failures", "inline_state"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"checkpoint.{key}: must be an integer >= 0, got {v!r}")
        if self.storage is not None and not isinstance(self.storage, str):
            raise ConfigError(f"checkpoint.storage: expected an fsspec URL string, got {self.storage!r}")


@dataclass(frozen=True)
class RestartStrategy:
    """Fixed-delay restart: after a failure, wait ``delay`` seconds and restart from the
    latest completed epoch; give up after ``max_attempts`` restarts.

    ``failover``: what restarts. ``"region"`` (the default, as Flink's region failover):
    only the failed task's *failover region* — the tasks channels connect it to — when the
    dataflow has several (parallel pipelines sharing no edge, e.g. forward-only chains) and
    every sink recovers one subtask alone; the other tasks keep running
    (:mod:`epochal.runtime.driver.failover`). ``"full"``: every task of the region. Each
    restart, of a failover region or of every task, counts against ``max_attempts``."""

    max_attempts: int = 3
    delay: float | str = 0.0
    failover: str = "region"

    def __post_init__(self):
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 0:
            raise ConfigError(f"restart.max_attempts: must be an integer >= 0, got {self.max_attempts!r}")
        object.__setattr__(self, "delay", parse_duration(self.delay, "restart.delay"))
        if self.failover not in ("region", "full"):
            raise ConfigError(f"restart.failover: expected 'region' or 'full', got {self.failover!r}")


@dataclass(frozen=True)
class ChannelConfig:
    """Data-plane tuning.

    Attributes:
        batch_size: records per batch before it is cut and sent.
        linger: seconds a partially filled batch may wait before it is sent.
        credits: batches a receiver buffers per channel; a sender with no credit blocks
            (credit-based flow control → back-pressure).
        encryption: TLS 1.3 on every connection (task↔task, task↔coordinator), mutually
            authenticated with a per-attempt certificate the driver creates and the tasks
            pin (:mod:`epochal.runtime.transport.tls`). ``None`` (default): on when the job runs on
            a Spark cluster (a non-``local`` master), off on embedded local Spark and the
            local runtime, whose connections stay on loopback (and on whenever the driver binds
            a non-loopback address). ``True`` / ``False`` force it — but ``False`` where
            connections leave loopback (a cluster, a non-loopback bind address) is refused
            unless ``allow_plaintext``: frames are authenticated only at connect, so an
            on-path peer could inject pickles into an established connection.
        allow_plaintext: accept ``encryption=False`` between hosts (a network only you use).
        in_flight: bound the data in flight per channel by *time* (Flink's buffer
            debloating): a consumer grants only the batches it consumes in this many seconds
            at its measured rate (between 2 and ``credits``), so queues in front of a slow
            task stay short and a barrier behind them waits about this long at most.
            ``None`` (default): ``credits`` batches per channel.
        batch_bytes: a batch is also cut when it would encode to about this many bytes (the
            sender learns each channel's bytes per record), so ``credits`` bounds what a
            receiver buffers in bytes too, not only in batches.
        max_frame_bytes: no frame is larger: a batch that encodes to more is split before
            it is sent (an Arrow batch by rows), and a single record over it fails the job
            naming the operator that produced it (at most 1 GiB, the receivers' limit).
        feedback_memory_bytes: what waits in memory on a loop's feedback channel (which
            has no credit: the loop must never block) — beyond it, frames wait in a local
            temporary file until the loop head reaches them.
        log_memory_bytes: what a loop head's in-transit log or an unaligned checkpoint's
            channel-state log holds in memory per epoch; beyond it the log spills to a local
            temporary file (it is uploaded with the checkpoint either way).
    """

    batch_size: int = 512
    linger: float | str = 0.005
    credits: int = 8
    encryption: bool | None = None
    in_flight: float | str | None = None
    batch_bytes: int = 4 << 20
    max_frame_bytes: int = 64 << 20
    feedback_memory_bytes: int = 64 << 20
    log_memory_bytes: int = 64 << 20
    allow_plaintext: bool = False

    def __post_init__(self):
        object.__setattr__(self, "linger", parse_duration(self.linger, "channels.linger"))
        object.__setattr__(self, "in_flight", parse_duration(self.in_flight, "channels.in_flight", optional=True))
        if self.in_flight is not None and self.in_flight <= 0:
            raise ConfigError("channels.in_flight: must be > 0 (or None for a fixed number of credits)")
        if self.encryption is not None and not isinstance(self.encryption, bool):
            raise ConfigError(f"channels.encryption: expected True, False or None (automatic), "
                              f"got {self.encryption!r}")
        if not isinstance(self.allow_plaintext, bool):
            raise ConfigError(f"channels.allow_plaintext: expected True or False, got {self.allow_plaintext!r}")
        for key in ("batch_size", "credits", "batch_bytes", "max_frame_bytes", "feedback_memory_bytes",
                    "log_memory_bytes"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"channels.{key}: must be an integer >= 1, got {v!r}")
        if self.max_frame_bytes > MAX_FRAME_BYTES:
            raise ConfigError(f"channels.max_frame_bytes: at most {MAX_FRAME_BYTES} (1 GiB, what a receiver accepts), "
                              f"got {self.max_frame_bytes}")


@dataclass(frozen=True)
class ClusterConfig:
    """Running on a Spark cluster (a non-``local`` master); ignored by local runs.

    Attributes:
        executor_wait: how long the driver waits, before each attempt, for Spark to offer
            as many concurrent task slots as the job has tasks (executors still
            registering at start-up, or replacing a lost host); a progress line is logged
            every few seconds. Past it the attempt fails with the slot counts (the restart
            strategy then decides).
        startup_timeout: how long every task of an attempt may take, once launched, to
            connect to the coordinator before the attempt fails.
        shared_paths: local paths (or ``file://`` URLs) that every host of the cluster
            sees with the same content, e.g. an NFS mount. On a cluster a local
            checkpoint storage, file sink or file source must lie under one of them;
            otherwise each host would read and write its own disk and the job is
            refused at start (use ``s3://`` or another shared file system instead).
        peer_timeout: a host that stops acknowledging an epochal connection (a task's,
            or the driver's coordinator) for this long is lost: the connection breaks
            and the attempt fails naming the host, instead of hanging until the
            checkpoint timeout. This catches the silent losses — a pulled cable, a
            partition, a frozen host — that close no connection (a crashed process or a
            killed host is seen at once). Implemented with TCP keepalive and
            ``TCP_USER_TIMEOUT`` on every connection (Linux; elsewhere keepalive only), so
            it is kernel-level: a busy or back-pressured task never trips it, since its
            connections keep reading. Spark then needs its own heartbeat timeout
            (``spark.network.timeout``) to release the lost host's executors; see README
            "Running on a cluster".
        allow_insecure_spark_rpc: a job on a cluster is refused when Spark's own RPC is
            neither authenticated (``spark.authenticate``) nor encrypted
            (``spark.network.crypto.enabled`` / ``spark.ssl.rpc.enabled``): the per-attempt
            TLS key and the job secret reach the executors in Spark's task closure, over that
            RPC, so whoever can read or join it could impersonate tasks and send them pickles.
            ``True`` runs anyway (with a WARNING each start), for a network only you use.
    """

    executor_wait: float | str = 120.0
    startup_timeout: float | str = 300.0
    shared_paths: tuple = ()
    peer_timeout: float | str = 30.0
    allow_insecure_spark_rpc: bool = False

    def __post_init__(self):
        object.__setattr__(self, "executor_wait", parse_duration(self.executor_wait, "cluster.executor_wait"))
        object.__setattr__(self, "startup_timeout", parse_duration(self.startup_timeout, "cluster.startup_timeout"))
        if self.startup_timeout <= 0:
            raise ConfigError("cluster.startup_timeout: must be > 0")
        object.__setattr__(self, "peer_timeout", parse_duration(self.peer_timeout, "cluster.peer_timeout"))
        if self.peer_timeout < 1:
            raise ConfigError(f"cluster.peer_timeout: must be >= 1 s (TCP keepalive counts whole seconds), "
                              f"got {self.peer_timeout!r}")
        if not isinstance(self.allow_insecure_spark_rpc, bool):
            raise ConfigError(f"cluster.allow_insecure_spark_rpc: expected True or False, "
                              f"got {self.allow_insecure_spark_rpc!r}")
        paths = self.shared_paths
        if isinstance(paths, str):
            paths = (paths,)
        if not isinstance(paths, (tuple, list)) or not all(isinstance(p, str) and p for p in paths):
            raise ConfigError(f"cluster.shared_paths: expected a list of paths, got {self.shared_paths!r}")
        object.__setattr__(self, "shared_paths", tuple(paths))


@dataclass(frozen=True)
class MetricsConfig:
    """Live metrics of a running job (:mod:`epochal.metrics`).

    Attributes:
        interval: how often tasks report their counters to the driver and the driver
            publishes one progress event (a dict, like Spark's ``StreamingQueryProgress``).
        listener: called with each progress event on the driver's reporter thread; keep it
            quick (it delays the next event, never the job).
        log: log each progress event as one JSON line on the ``epochal.progress`` logger
            (INFO) — the progress lines of a job that runs without a terminal.
        prometheus_port: serve the metrics at ``http://<prometheus_host>:<port>/metrics`` for
            Prometheus (needs ``pip install 'epochal[metrics]'``); ``None``: off.
        prometheus_host: the address the endpoint binds: the loopback interface by default,
            so only processes of the driver's host can read the job's metrics (task hosts,
            throughput, errors); ``"0.0.0.0"`` (or one of the host's addresses) exposes them
            to the network, for a Prometheus server on another host.
        status: a live one-line status on the terminal while :meth:`Dataflow.run` blocks:
            ``None`` = when standard error is a terminal.
        ui: serve the web dashboard (:mod:`epochal.ui`: job graph, checkpoint history,
            live charts, savepoint actions) from the driver; its address with the token is
            logged and is ``JobHandle.ui_url``.
        ui_port: the dashboard's TCP port; ``0``: any free port.
        ui_host: the address the dashboard binds: loopback by default (as
            ``prometheus_host``); ``"0.0.0.0"`` exposes it to the network — the token still
            guards it, but travels in plain HTTP.
        ui_token: the secret the dashboard's data and actions need; ``None``: a random one
            per job.
    """

    interval: float | str = 1.0
    listener: object = None
    log: bool = True
    prometheus_port: int | None = None
    status: bool | None = None
    prometheus_host: str = "127.0.0.1"
    ui: bool = False
    ui_port: int = 0
    ui_host: str = "127.0.0.1"
    ui_token: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "interval", parse_duration(self.interval, "metrics.interval"))
        if self.interval <= 0:
            raise ConfigError("metrics.interval: must be > 0")
        if self.listener is not None and not callable(self.listener):
            raise ConfigError(f"metrics.listener: expected a function of one progress dict, got {self.listener!r}")
        port = self.prometheus_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536):
            raise ConfigError(f"metrics.prometheus_port: expected a TCP port number, got {port!r}")
        if not isinstance(self.prometheus_host, str) or not self.prometheus_host:
            raise ConfigError(f"metrics.prometheus_host: expected an address to bind (e.g. '127.0.0.1' or "
                              f"'0.0.0.0'), got {self.prometheus_host!r}")
        if self.status not in (None, True, False):
            raise ConfigError(f"metrics.status: expected None, True or False, got {self.status!r}")
        if self.ui not in (True, False):
            raise ConfigError(f"metrics.ui: expected True or False, got {self.ui!r}")
        port = self.ui_port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ConfigError(f"metrics.ui_port: expected a TCP port number (0: any free port), got {port!r}")
        if not isinstance(self.ui_host, str) or not self.ui_host:
            raise ConfigError(f"metrics.ui_host: expected an address to bind (e.g. '127.0.0.1'), got {self.ui_host!r}")
        if self.ui_token is not None and (not isinstance(self.ui_token, str) or len(self.ui_token) < 16):
            raise ConfigError("metrics.ui_token: expected a secret of at least 16 characters (or None: a random one)")
