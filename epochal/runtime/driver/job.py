"""Starting a job: everything that can be checked before a task starts is checked here
(configuration, the plan and what it ships, output ownership, a restore point against the
dataflow), then a :class:`~epochal.runtime.driver.attempts.JobDriver` runs it on a thread
and the caller gets its :class:`~epochal.runtime.driver.handle.JobHandle`.
"""
from __future__ import annotations

import dataclasses
import logging
import tempfile
import time

import cloudpickle

from epochal.alignment.factory import components_for
from epochal.backends.choice import backend_spec
from epochal.backends.retry import RetryPolicy
from epochal.backends.storage import CheckpointStorage
from epochal.config import ChannelConfig, CheckpointConfig, ClusterConfig, MetricsConfig, RestartStrategy
from epochal.errors import ConfigError, EpochalError
from epochal.graph import NodeKind
from epochal.regions.layout import layout_of
from epochal.runtime.driver import compatibility, secure_defaults
from epochal.runtime.driver.attempts import JobDriver
from epochal.runtime.driver.handle import JobHandle
from epochal.runtime.driver.lease import JobLease
from epochal.runtime.driver.result import JobResult

__all__ = ["JobHandle", "JobResult", "start_job"]

log = logging.getLogger("epochal")


def start_job(flow, *, guarantee="exactly-once", checkpoint: CheckpointConfig | None = None,
              restart: RestartStrategy | None = None, channels: ChannelConfig | None = None,
              runtime: str = "spark", spark=None, resume: bool = False, faults=(),
              backend="heap", cluster: ClusterConfig | None = None,
              allow_non_restored_state: bool = False, metrics: MetricsConfig | None = None,
              restore_from: str | None = None, launcher=None) -> JobHandle:
    """Validate everything that can be validated before any task starts, then start.

    ``restore_from``: a savepoint, a ``chk-<epoch>`` directory or a job's checkpoint
    directory (its newest checkpoint). It is checked against the dataflow like any restore
    (:mod:`epochal.runtime.driver.compatibility`), then copied into this job's checkpoint storage
    — which must hold no completed checkpoint — as its first checkpoint, and the job
    starts from it (:func:`epochal.state.savepoint.import_checkpoint`).

    ``launcher``: a :class:`~epochal.runtime.launch.launcher.Launcher` that runs the tasks
    instead of the runtime's own (with ``runtime="local"`` only; the driver is unchanged):
    the seam through which ``benchmarks/scale`` drives the real driver with simulated tasks.
    Its ``is_cluster`` decides the secure defaults as on a cluster (encryption, signing).

    Raises:
        ConfigError: ``launcher`` with another runtime than ``"local"``, or not a Launcher."""
    if launcher is not None:
        _check_launcher(launcher, runtime)
    if runtime == "spark" and spark is None:  # the JVM boots while the job is planned and checked
        from epochal.runtime.launch.spark import start_local_session

        start_local_session()
    parts = layout_of(flow)
    if len(parts) > 1 and launcher is not None:
        raise ConfigError("launcher: a job of several regions runs one driver per region; a launcher of your own "
                          "runs a job of one region only")
    if len(parts) > 1:  # one driver per region (seed 000 §3.1)
        from epochal.runtime.driver.regions import start_regions

        return start_regions(flow, parts, start_job, guarantee=guarantee, checkpoint=checkpoint, restart=restart,
                             channels=channels, runtime=runtime, spark=spark, resume=resume, faults=faults,
                             backend=backend, cluster=cluster, allow_non_restored_state=allow_non_restored_state,
                             metrics=metrics, restore_from=restore_from)
    if parts:  # (an empty graph has none: flow.plan() below names the problem)
        guarantee, checkpoint, restart = _region_settings(parts[0].region, guarantee, checkpoint, restart)
    checkpoint = checkpoint or CheckpointConfig()
    if not isinstance(checkpoint, CheckpointConfig):
        raise ConfigError(f"checkpoint: expected CheckpointConfig, got {type(checkpoint).__name__}")
    components = components_for(guarantee, checkpoint)
    backend = backend_spec(backend)
    restart = restart or RestartStrategy()
    channels = channels or ChannelConfig()
    cluster = cluster or ClusterConfig()
    metrics = metrics or MetricsConfig()
    for name, value, cls in (("checkpoint", checkpoint, CheckpointConfig), ("restart", restart, RestartStrategy),
                             ("channels", channels, ChannelConfig), ("cluster", cluster, ClusterConfig),
                             ("metrics", metrics, MetricsConfig)):
        if not isinstance(value, cls):
            raise ConfigError(f"{name}: expected {cls.__name__}, got {type(value).__name__}")
    plan = flow.plan()
    plan_blob = _ship(plan)
    if runtime not in ("spark", "local"):
        raise ConfigError(f"runtime: expected 'spark' or 'local', got {runtime!r}")
    if runtime == "spark":
        from epochal.runtime.launch.spark import SparkLauncher

        launcher = SparkLauncher(spark, len(plan.tasks), cluster)
    if runtime == "spark" and launcher.is_cluster:
        from epochal.runtime.launch.cluster import check_storage_visible_from_every_host

        check_storage_visible_from_every_host(plan, checkpoint.storage, cluster.shared_paths, launcher.master)
    from epochal.runtime.launch.launcher import LocalLauncher

    is_cluster = launcher is not None and launcher.is_cluster
    secure_defaults.encryption(is_cluster, (launcher or LocalLauncher).bind_host, channels.encryption,
                               channels.allow_plaintext)  # refused here, before anything runs
    signing_key = checkpoint.signing_key
    if secure_defaults.signing(is_cluster, signing_key, checkpoint.allow_unsigned) == secure_defaults.GENERATE:
        signing_key, key_path = secure_defaults.job_key()
        log.info("job %s: checkpoints signed with the generated key at %s", flow.name, key_path)
    url = checkpoint.storage or "file://" + tempfile.mkdtemp(prefix=f"epochal-{flow.name}-")
    storage = CheckpointStorage(url, flow.name, retry_policy=RetryPolicy(deadline=storage_retry(checkpoint)),
                                signing_key=signing_key)
    _refuse_region_checkpoints(storage, url)
    point = None if restore_from is None else _check_restore_point(restore_from, storage, plan, resume,
                                                                    allow_non_restored_state)
    holds = [JobLease.acquire(storage, flow.name)]  # one driver per job and storage, before any other write
    try:
        for node in plan.nodes.values():  # one writer per sink target, before any claim touches it
            if node.kind is NodeKind.SINK:
                held = node.payload.hold(job=flow.name, sink=node.name)
                if held is not None:
                    holds.append(held)
        return _start(flow, plan, plan_blob, components, checkpoint, restart, channels, launcher, storage, url,
                      runtime, resume, faults, backend, cluster, allow_non_restored_state, metrics, restore_from, point,
                      holds)
    except BaseException:
        _release(holds)
        raise


def _check_launcher(launcher, runtime: str) -> None:
    """A launcher passed in (:func:`start_job`) runs the tasks of a local runtime only."""
    from epochal.runtime.launch.launcher import Launcher

    if runtime != "local":
        raise ConfigError(f"launcher: a launcher of your own needs runtime='local', got runtime={runtime!r}")
    if not isinstance(launcher, Launcher):
        raise ConfigError(f"launcher: expected an epochal.runtime.launch.launcher.Launcher, "
                          f"got {type(launcher).__name__}")


def _region_settings(region, guarantee, checkpoint, restart):
    """A job of one region: the region's settings override the job's (its checkpoint
    settings keep the job's storage unless they name one)."""
    if region.checkpoint is not None:
        storage = getattr(checkpoint, "storage", None)
        checkpoint = region.checkpoint if region.checkpoint.storage is not None or storage is None \
            else dataclasses.replace(region.checkpoint, storage=storage)
    return region.guarantee or guarantee, checkpoint, region.restart or restart


def _refuse_region_checkpoints(storage: CheckpointStorage, url: str) -> None:
    """A job of one region must not silently start fresh beside checkpoints of its regions."""
    from epochal.regions.layout import regions_with_checkpoints

    held = regions_with_checkpoints(storage)
    if held:
        raise ConfigError(
            f"checkpoint.storage: {url}/{storage.job} holds checkpoints of regions {held} of this job, which now "
            "has one region: restore each from a savepoint, or use another storage location")


def _release(holds) -> None:
    for held in reversed(holds):
        try:
            held.release()
        except Exception as exc:
            log.warning("releasing %r failed: %s", held, exc)


def _start(flow, plan, plan_blob, components, checkpoint, restart, channels, launcher, storage, url, runtime, resume,
           faults, backend, cluster, allow_non_restored_state, metrics, restore_from, point, holds) -> JobHandle:
    """The rest of :func:`start_job`, while the job's lease and its sinks' holds are held."""
    if not isinstance(allow_non_restored_state, bool):
        raise ConfigError(f"allow_non_restored_state: expected True or False, got {allow_non_restored_state!r}")
    if point is not None:
        from epochal.state.savepoint import import_checkpoint

        t0 = time.monotonic()
        copied = import_checkpoint(point, storage)
        committed = point.storage.read_document(compatibility.SINKS_COMMITTED)
        if committed is not None and committed.get("epoch") == point.epoch:  # stopped with it: keep saying so
            storage.write_document(compatibility.SINKS_COMMITTED, committed)
        log.info("job %s: %s %s (epoch %d, %d bytes) copied into %s in %.2f s", plan.job, point.kind, restore_from,
                 point.epoch, copied, storage.root_url, time.monotonic() - t0)
        resume = True
    latest = storage.latest_completed() if storage.has_checkpoints() else None
    if storage.has_checkpoints() and not resume:
        raise ConfigError(
            f"checkpoint.storage: {url}/{flow.name} already holds checkpoints"
            + (f" (latest completed epoch {latest[0]})" if latest else "")
            + "; pass resume=True to continue from it, or use another storage location"
        )
    if latest is not None:  # checked now, before anything starts (every restore is checked again later)
        compatibility.enforce(plan, latest[1], allow_non_restored_state, log)
        compatibility.check_sink_mode(latest[1], latest[0], components.sink_mode.value,
                                      storage.read_document(compatibility.SINKS_COMMITTED))
    for node in plan.nodes.values():  # output ownership, before anything writes
        if node.kind is NodeKind.SINK:
            node.payload.claim(job=flow.name, sink=node.name, resume=latest is not None)
            node.payload.check_run(node.name, checkpoint, components.sink_mode)
    if launcher is None:
        from epochal.runtime.launch.launcher import LocalLauncher

        launcher = LocalLauncher()
    encrypted = secure_defaults.encryption(launcher.is_cluster, launcher.bind_host, channels.encryption,
                                           channels.allow_plaintext)
    driver = JobDriver(plan, plan_blob, components, checkpoint, restart, channels, launcher, storage, url, runtime,
                     tuple(faults), backend, encrypted, allow_non_restored_state, metrics,
                     peer_timeout=cluster.peer_timeout if launcher.is_cluster else None)
    driver.restored_from_url = restore_from
    driver.holds = holds
    holds[0].on_lost = driver.abort
    holds[0].start()
    driver.thread.start()
    return JobHandle(driver)


def _check_restore_point(restore_from: str, storage: CheckpointStorage, plan, resume: bool,
                         allow_non_restored_state: bool):
    """``restore_from``: open the checkpoint and check it against ``plan`` and ``storage``,
    writing nothing; the caller copies it into ``storage`` once it holds the job's lease."""
    from epochal.state.location import UntrustedCheckpoint, open_checkpoint

    if resume:
        raise ConfigError("restore_from and resume=True exclude each other: restore_from starts the job's history "
                          "from a savepoint or checkpoint, resume continues the one in checkpoint.storage")
    if not isinstance(restore_from, str):
        raise ConfigError(f"restore_from: expected a URL, got {type(restore_from).__name__}")
    latest = storage.latest_completed()
    if latest is not None:
        raise ConfigError(
            f"restore_from: checkpoint.storage {storage.root_url} already holds checkpoints of job {plan.job!r} "
            f"(latest completed epoch {latest[0]}); a restore starts the job's history from {restore_from}: use "
            "another checkpoint.storage (or job name), or resume=True to continue from the latest checkpoint there")
    try:  # importing re-signs it: with a key, only a checkpoint signed with it (verified on the one read used)
        point = open_checkpoint(restore_from, signing_key=storage.signing_key)
    except UntrustedCheckpoint as exc:
        raise ConfigError(
            f"restore_from {restore_from}: its _metadata is not trusted: {exc.why} — this job signs its checkpoints "
            "(checkpoint.signing_key, or on a cluster the generated ~/.epochal/signing.key), so only checkpoints and "
            "savepoints signed with the same key are restored: pass the key it was signed with "
            "(checkpoint.signing_key), or copy it signed with `epochal savepoint create --signing-key-file`") from None
    compatibility.enforce(plan, point.meta, allow_non_restored_state, log)  # before anything is copied
    return point


def storage_retry(checkpoint: CheckpointConfig) -> float:
    """How long a storage call retries transient errors: ``checkpoint.storage_retry``, but
    never longer than an epoch may take (``checkpoint.timeout``)."""
    return min(checkpoint.storage_retry, checkpoint.timeout)


def _ship(plan) -> bytes:
    """Pickle the plan for the tasks; name the operator whose code cannot be shipped."""
    try:
        return cloudpickle.dumps(plan)
    except Exception:
        for node in plan.nodes.values():
            for part, obj in (("function or object", node.payload), ("key function", node.key_fn)):
                try:
                    cloudpickle.dumps(obj)
                except Exception as exc:
                    raise EpochalError(
                        f"job {plan.job!r}: the {part} of operator {node.name!r} cannot be shipped to the "
                        f"tasks (not picklable): {type(exc).__name__}: {exc}"
                    ) from exc
        raise
