"""Running a job of several regions (:mod:`epochal.regions`): one :class:`~epochal.runtime.driver.attempts.JobDriver`
per region (seed 000 §3.1, §4: each region has its own controller).

Each region is started like a job of its own — the same checks, its own epoch sequence and
coordinator, its guarantee, checkpoint settings, restart strategy and attempt count, its own
lease and lineage — over the operators of the region, in one process and (on Spark) one
session. A failed task therefore restarts only its region's tasks from that region's latest
completed epoch; the other regions' drivers never notice. Regions share no stream
(:mod:`epochal.regions.layout`), so no record crosses a region boundary and each region's
output is exactly (or at least) once on its own.

Storage: region ``r`` of job ``j`` keeps its checkpoints under ``<storage>/<j>/regions/<r>/``
(unless the region's ``CheckpointConfig`` names a storage of its own). A savepoint of the job
is one savepoint per region, ``<url>/<r>/``, listed in ``<url>/_regions``.

When a region fails for good (its restart strategy spent), the job fails: the other regions
are cancelled and :meth:`RegionsHandle.wait` raises, naming the region.

The caller gets a :class:`RegionsHandle` (what :class:`~epochal.runtime.driver.handle.JobHandle`
is for a job of one region) and, at the end, the job's combined
:class:`~epochal.runtime.driver.result.JobResult`.
"""
from __future__ import annotations

import dataclasses
import logging
import tempfile
import threading
import time
import uuid

from epochal.backends.storage import CheckpointStorage
from epochal.errors import ConfigError, EpochalError, JobFailedError, SavepointError
from epochal.query.protocol import QueryError
from epochal.regions.layout import REGIONS_DIR, RegionPart, describe, region_storage_url
from epochal.runtime.driver.region_savepoints import REGIONS_DOCUMENT, restore_points, savepoint_of_end
from epochal.runtime.driver.result import JobResult

log = logging.getLogger("epochal")

#: how often the supervisor looks for a region that failed for good
SUPERVISE_EVERY = 0.2


def sub_flow(flow, part: RegionPart, relay=None):
    """The dataflow of one region: the same job name and limits, the region's operators.

    An autonomous channel (:mod:`epochal.regions.relay`) leaving the region ends in a
    relay sink ``"<channel>.out"``; one entering it starts at a relay source
    ``"<channel>.in"`` with the producer's parallelism, routed to its consumer as the
    channel was (``<channel>`` is ``"<producer>-<consumer>"``); ``relay``: the job's hub.
    """
    from epochal.graph import FORWARD, Input, Node, NodeKind
    from epochal.regions.api import Autonomous
    from epochal.regions.relay import RelaySink, RelaySource

    sub = type(flow)(flow.name, parallelism=flow.parallelism, max_parallelism=flow.max_parallelism)
    inside = set(part.nodes)
    nodes: dict = {}
    for name in part.nodes:
        node = flow._nodes[name]
        inputs = []
        for inp in node.inputs:
            if not (inp.autonomous and inp.node not in inside):
                inputs.append(inp)
                continue
            producer = flow._nodes[inp.node]
            channel = channel_name(inp, name)
            nodes[f"{channel}.in"] = Node(f"{channel}.in", NodeKind.SOURCE, (), producer.parallelism,
                                         RelaySource(relay.endpoint(channel, "consumer", part.name), producer.parallelism,
                                                     ack_on_take=isinstance(part.region, Autonomous)),
                                         columnar=node.columnar)
            inputs.append(dataclasses.replace(inp, node=f"{channel}.in", port="main", autonomous=False))
        nodes[name] = dataclasses.replace(node, inputs=tuple(inputs)) if inputs != list(node.inputs) else node
    for consumer in flow._nodes.values():
        if consumer.name in inside:
            continue
        for inp in consumer.inputs:
            if inp.autonomous and inp.node in inside:
                producer, channel = flow._nodes[inp.node], channel_name(inp, consumer.name)
                nodes[f"{channel}.out"] = Node(f"{channel}.out", NodeKind.SINK, (Input(inp.node, FORWARD, port=inp.port),),
                                              producer.parallelism,
                                              RelaySink(relay.endpoint(channel, "producer", part.name)),
                                              columnar=consumer.columnar)
    sub._nodes = nodes
    return sub


def channel_name(inp, consumer: str) -> str:
    """The name of the autonomous channel ``inp`` into ``consumer``."""
    return f"{inp.node}-{consumer}" + ("" if inp.port == "main" else f".{inp.port}")


def region_channels(flow, parts: list[RegionPart]) -> list[tuple[str, str]]:
    """``(producing region, reading region)`` of every autonomous channel between ``parts``."""
    where = {node: part.name for part in parts for node in part.nodes}
    return sorted({(where[inp.node], where[n.name]) for n in flow._nodes.values() for inp in n.inputs
                   if inp.autonomous and n.name in where and inp.node in where and where[inp.node] != where[n.name]})


def cut_order(parts: list[RegionPart], channels) -> list[str]:
    """The regions' names, each reader of an autonomous channel before its producers (the
    layout order otherwise; a cycle of channels keeps the layout order where it closes):
    a reader's cut then holds no record its producer's later cut has not handed over."""
    names = [p.name for p in parts]
    readers = {name: {c for p, c in channels if p == name} for name in names}
    order: list[str] = []

    def place(name: str, seen: frozenset) -> None:
        if name in order or name in seen:
            return
        for reader in sorted(readers[name], key=names.index):
            place(reader, seen | {name})
        order.append(name)

    for name in names:
        place(name, frozenset())
    return order


def crosses(flow, part: RegionPart) -> bool:
    """Whether an autonomous channel enters or leaves ``part``."""
    inside = set(part.nodes)
    return any(inp.autonomous and ((n.name in inside) != (inp.node in inside))
               for n in flow._nodes.values() for inp in n.inputs)


def start_regions(flow, parts: list[RegionPart], start_one, *, guarantee, checkpoint, restart, channels, runtime, spark, resume,
                  faults, backend, cluster, allow_non_restored_state, metrics, restore_from) -> RegionsHandle:
    """Start every region of ``flow`` (see the module docstring) with ``start_one`` (the
    driver's :func:`~epochal.runtime.driver.job.start_job` for a job of one region); all or none.

    Everything checkable is checked for every region before the first one starts: its
    settings, its plan, the storage layout, the restore point.

    Raises:
        ConfigError / PipelineDefinitionError: naming the region.
    """
    from epochal.config import CheckpointConfig, MetricsConfig

    checkpoint = checkpoint or CheckpointConfig()
    if not isinstance(checkpoint, CheckpointConfig):
        raise ConfigError(f"checkpoint: expected CheckpointConfig, got {type(checkpoint).__name__}")
    metrics = metrics or MetricsConfig()
    for key in ("prometheus_port", "ui_port"):
        if getattr(metrics, key, None):
            raise ConfigError(f"metrics.{key}={getattr(metrics, key)}: job {flow.name!r} has {len(parts)} regions, "
                              "each with its own driver and endpoint; use 0 (any free port) and read each region's "
                              "address from handle.regions[<name>]")
    base = checkpoint.storage or "file://" + tempfile.mkdtemp(prefix=f"epochal-{flow.name}-")
    whole = CheckpointStorage(base, flow.name)
    if whole.has_checkpoints():
        raise ConfigError(
            f"checkpoint.storage: {base}/{flow.name} holds checkpoints of this job written without regions, and it "
            f"now has {len(parts)} ({', '.join(p.name for p in parts)}), whose checkpoints live under "
            f"{base}/{flow.name}/{REGIONS_DIR}/<region>/: take a savepoint of the old job and start each region from "
            "it, or use another storage location")
    plans = {}
    for part in parts:
        try:
            plans[part.name] = sub_flow(flow, part, _UNBOUND).plan()
        except EpochalError as exc:
            raise _in_region(exc, f"region {part.name!r}") from exc
    log.info("job %s: %s", flow.name, describe(parts, guarantee, checkpoint))
    host, advertised, is_cluster = "127.0.0.1", None, False
    if runtime == "spark":
        from epochal.runtime.launch.spark import SparkLauncher, session_for

        total = sum(len(p.tasks) for p in plans.values())
        spark = session_for(spark, total)  # one session for every region, with slots for all
        # every region runs at once, one barrier stage each: the session (a cluster: its
        # executors, within cluster.executor_wait) must offer a slot to every task of the job
        launcher = SparkLauncher(spark, total, cluster)
        launcher.prepare(total)
        host, advertised, is_cluster = launcher.bind_host, getattr(launcher, "advertised_host", None), launcher.is_cluster
    relay = None
    if any(crosses(flow, part) for part in parts):
        relay = _relay_hub(flow.name, host, advertised, is_cluster, channels)
    try:
        return _start_all(flow, parts, start_one, relay, guarantee=guarantee, checkpoint=checkpoint, base=base,
                          restart=restart, channels=channels, runtime=runtime, spark=spark, resume=resume,
                          faults=faults, backend=backend, cluster=cluster,
                          allow_non_restored_state=allow_non_restored_state, metrics=metrics,
                          restore_from=restore_from)
    except BaseException:
        if relay is not None:
            relay.close()
        raise


class _Unbound:
    """The hub of autonomous channels while plans are only checked (nothing is shipped)."""

    @staticmethod
    def endpoint(channel: str, role=None, region=None):
        from epochal.regions.relay import RelayEndpoint

        return RelayEndpoint(("127.0.0.1", 0), channel)


_UNBOUND = _Unbound()


def _relay_hub(job: str, host: str, advertised: str | None, is_cluster: bool, channels):
    """The job's :class:`~epochal.regions.relay.RelayHub`: bound where the coordinators
    bind, in TLS pinned to its own certificate when the job is encrypted (on a cluster, by
    default), as every other channel of the job."""
    from epochal.regions.relay import RelayHub

    tls = None
    if is_cluster if channels is None or channels.encryption is None else channels.encryption:
        from epochal.runtime.transport.tls import TLSMaterial

        tls = TLSMaterial.generate(f"{job} autonomous channels")
    return RelayHub(host, advertised, tls)


def _start_all(flow, parts, start_one, relay, *, guarantee, checkpoint, base, restart, channels, runtime, spark, resume,
               faults, backend, cluster, allow_non_restored_state, metrics, restore_from) -> RegionsHandle:
    """Start every region (all or none), each with its channels bound to ``relay``."""
    points = restore_points(restore_from, flow.name, parts, allow_non_restored_state)
    handles: dict = {}
    try:
        for part in parts:
            region = part.region
            config = dataclasses.replace(region.checkpoint or checkpoint,
                                         storage=region_storage_url(base, flow.name, part, len(parts)))
            try:
                handles[part.name] = start_one(
                    sub_flow(flow, part, relay), guarantee=region.guarantee or guarantee, checkpoint=config,
                    restart=region.restart or restart, channels=channels, runtime=runtime, spark=spark, resume=resume,
                    faults=faults, backend=backend, cluster=cluster,
                    allow_non_restored_state=allow_non_restored_state, metrics=metrics,
                    restore_from=points.get(part.name))
            except EpochalError as exc:
                raise _in_region(exc, f"region {part.name!r} of job {flow.name!r}") from exc
            handles[part.name]._driver.region = part.name
            if relay is not None:  # the region's relay connections prove its current attempt's key
                relay.admit(part.name, _current_key(handles[part.name]._driver))
    except BaseException:
        for handle in handles.values():
            handle.cancel()
        for handle in handles.values():
            try:
                handle.wait(60)
            except Exception:
                pass
        raise
    return RegionsHandle(flow.name, parts, handles, base, relay, region_channels(flow, parts))


def _current_key(driver):
    """The current attempt key of ``driver``'s region (``None`` before its first attempt)."""
    return lambda: getattr(driver.server, "key", None)


def _in_region(exc: EpochalError, where: str) -> EpochalError:
    """``exc`` with ``where`` (the region) in front of its message, when its type allows."""
    try:
        return type(exc)(f"{where}: {exc}")
    except TypeError:
        return exc


class RegionsHandle:
    """A running job of several regions: ``regions[name]`` is each region's
    :class:`~epochal.runtime.driver.handle.JobHandle`; the methods act on every region.

    A region that fails for good (its restart strategy spent) fails the job: a supervisor
    thread cancels the other regions at once, and :meth:`wait` raises naming the region.
    """

    def __init__(self, job: str, parts, handles: dict, base_url: str, relay=None, channels=()):
        self.job = job
        #: ``(producing region, reading region)`` of every autonomous channel
        self._channels = tuple(channels)
        #: the job's hub of autonomous channels (:class:`~epochal.regions.relay.RelayHub`), or None
        self.relay = relay
        self.parts = list(parts)
        self.regions = dict(handles)
        self._base = base_url
        self.failed_region: str | None = None
        for handle in self.regions.values():  # each region's dashboard lists (and links) every region
            handle._driver.siblings = self.dashboard_regions
        self._supervisor = threading.Thread(target=self._supervise, name=f"epochal-regions-{job}", daemon=True)
        self._supervisor.start()

    def _supervise(self) -> None:
        while True:
            running = [(n, h) for n, h in self.regions.items() if h.running]
            for name, handle in self.regions.items():
                if not handle.running and handle._driver.error is not None and self.failed_region is None:
                    self.failed_region = name
                    log.error("job %s: region %r failed for good; cancelling the other regions", self.job, name)
                    for other, h in self.regions.items():
                        if other != name:
                            h.cancel()
            if not running:
                if self.relay is not None:
                    self.relay.close()
                return
            running[0][1]._driver.thread.join(SUPERVISE_EVERY)

    def dashboard_regions(self) -> list[dict]:
        """One line per region, side by side on every region's dashboard: its name, state,
        attempt, completed epochs, latest completed epoch and dashboard URL (with its token)."""
        lines = []
        for name, handle in self.regions.items():
            driver, done = handle._driver, handle.completed_epochs
            lines.append({"name": name, "state": driver.state, "attempt": driver.attempt_index,
                          "restarts": len(driver.restarts), "completed_epochs": len(done),
                          "last_epoch": done[-1]["epoch"] if done else None, "url": handle.ui_url})
        return lines

    # ------------------------------------------------------------------ like JobHandle
    @property
    def running(self) -> bool:
        return self._supervisor.is_alive()

    def region_of(self, operator: str) -> str:
        """The region operator ``operator`` runs in."""
        for part in self.parts:
            if operator in part.nodes:
                return part.name
        raise QueryError(f"job {self.job!r} has no operator {operator!r}")

    def trigger_epoch(self) -> None:
        """Ask every region for an epoch now (each region's epochs are its own)."""
        for handle in self.regions.values():
            handle.trigger_epoch()

    def cancel(self) -> None:
        if self.relay is not None:
            self.relay.stopping()
        for handle in self.regions.values():
            handle.cancel()

    def metrics(self) -> dict:
        """``{"job", "regions": {name: progress event}}``: each region's live metrics."""
        return {"job": self.job, "regions": {name: h.metrics() for name, h in self.regions.items()}}

    @property
    def ui_url(self) -> str | None:
        """``None``: each region serves its own dashboard (:attr:`ui_urls`)."""
        return None

    @property
    def ui_urls(self) -> dict:
        return {name: h.ui_url for name, h in self.regions.items() if h.ui_url is not None}

    @property
    def prometheus_address(self):
        return None

    @property
    def completed_epochs(self) -> list[dict]:
        return [dict(e, region=name) for name, h in self.regions.items() for e in h.completed_epochs]

    def query(self, operator: str, state: str, keys, **options):
        """Queryable state of ``operator``, asked of its region (:meth:`JobHandle.query`)."""
        return self.regions[self.region_of(operator)].query(operator, state, keys, **options)

    def savepoint(self, url: str | None = None, timeout: float | None = None) -> str:
        """A savepoint of every region: ``<url>/<region>/`` each, listed in ``<url>/_regions``.

        Regions share no stream, so each region's savepoint is a consistent cut of that
        region and together they restore the job (``restore_from=url``); they are taken one
        after the other, not at one instant across regions."""
        return self._savepoints(url, timeout, stop=False)

    def stop_with_savepoint(self, url: str | None = None, timeout: float | None = None, *,
                            drain: bool = False) -> str:
        """Stop every region with a savepoint (as :meth:`savepoint`; ``drain``: each region
        ends event time first, :meth:`JobHandle.stop_with_savepoint`); returns its URL.

        A region whose input ended before or while its stop was taken has finished instead
        of stopping: its end (its latest completed checkpoint) is its savepoint
        (:func:`~epochal.runtime.driver.region_savepoints.savepoint_of_end`), so the regions
        already stopped run on from the job's savepoint (the campaign's regions seeds 1002,
        1003: the call raised with ``main`` stopped, and main's input after it was lost)."""
        return self._savepoints(url, timeout, stop=True, drain=drain)

    def _savepoints(self, url: str | None, timeout: float | None, stop: bool, drain: bool = False) -> str:
        """Each region's savepoint, readers of autonomous channels before their producers
        (:func:`cut_order`), the relay's acks held meanwhile: a producer's cut then holds
        every record its consumers' cuts do not (:mod:`epochal.regions.relay`)."""
        url = (url or f"{self._base.rstrip('/')}/{self.job}/savepoints/sp-{uuid.uuid4().hex[:12]}").rstrip("/")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.relay is not None:
            self.relay.hold_acks()
            if stop:  # a producer whose reader stopped first must not wait for room in a lane
                self.relay.stopping()
        try:
            for name in cut_order(self.parts, self._channels):
                handle = self.regions[name]
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    if stop:
                        handle.stop_with_savepoint(f"{url}/{name}", left, drain=drain)
                    else:
                        handle.savepoint(f"{url}/{name}", left)
                except SavepointError:
                    # a region whose input ended meanwhile finished instead (the regions
                    # before it in the cut may have stopped already): its end is its cut
                    if not savepoint_of_end(handle, f"{url}/{name}", left):
                        raise
        except BaseException:
            if self.relay is not None and stop:
                self.relay.stopping(False)
            raise
        finally:
            if self.relay is not None:
                self.relay.hold_acks(False)
        CheckpointStorage.at_root(url).write_document(REGIONS_DOCUMENT,
                                                      {"job": self.job, "regions": list(self.regions)})
        return url

    def wait(self, timeout: float | None = None, status: bool = False) -> JobResult:
        """Block until every region ended; the job's result (``regions``: each region's).

        Raises:
            JobFailedError: a region failed for good (the others were cancelled), naming it.
            TimeoutError: still running after ``timeout``.
        """
        if status:  # one line: each region's status side by side
            from epochal.metrics.progress import status_line
            from epochal.metrics.reporter import StatusLine

            line = StatusLine()
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                while self._supervisor.is_alive() and (deadline is None or time.monotonic() < deadline):
                    self._supervisor.join(0.5)
                    line.show_text(" || ".join(status_line(h.metrics()) for h in self.regions.values()))
            finally:
                line.end()
        self._supervisor.join(timeout)
        if self._supervisor.is_alive():
            raise TimeoutError(f"job {self.job!r} still running after {timeout} s")
        if self.failed_region is not None:
            error = self.regions[self.failed_region]._driver.error
            causes = list(getattr(error, "causes", []))
            raise JobFailedError(f"job {self.job!r}: region {self.failed_region!r} failed: {error}", causes) from error
        return combined_result(self.job, {name: h._driver.result for name, h in self.regions.items()})


def combined_result(job: str, results: dict[str, JobResult]) -> JobResult:
    """The result of a job of several regions: ``regions`` holds each region's; ``attempts``
    is the most any region needed, ``failures`` every region's (prefixed with its name),
    epochs and metrics are every region's (epochs tagged with their ``region``)."""
    first = next(iter(results.values()))
    guarantees = {r.guarantee for r in results.values()}
    return JobResult(
        job=job, guarantee=guarantees.pop() if len(guarantees) == 1 else "mixed", runtime=first.runtime,
        attempts=max(r.attempts for r in results.values()),
        failures=[f"region {n!r}: {f}" for n, r in results.items() for f in r.failures],
        completed_epochs=[dict(e, region=n) for n, r in results.items() for e in r.completed_epochs],
        aborted_epochs=[dict(e, region=n) for n, r in results.items() for e in r.aborted_epochs],
        task_metrics={t: m for r in results.values() for t, m in r.task_metrics.items()},
        duration_s=max(r.duration_s for r in results.values()),
        checkpoint_root=first.checkpoint_root.rsplit("/", 4)[0] + f"/{job}",
        encrypted=all(r.encrypted for r in results.values()),
        savepoints=[dict(s, region=n) for n, r in results.items() for s in r.savepoints],
        stopped_with_savepoint=_common(r.stopped_with_savepoint for r in results.values()),
        regions=dict(results),
    )


def _common(urls) -> str | None:
    """The job's savepoint URL when every region stopped with one (``<url>/<region>``)."""
    parents = {None if u is None else u.rstrip("/").rsplit("/", 1)[0] for u in urls}
    return parents.pop() if len(parents) == 1 else None
