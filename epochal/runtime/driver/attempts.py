"""The driver: runs a job attempt after attempt under the restart strategy.

Spark never retries a failed barrier ResultStage and exposes no attempt number to
Python (DESIGN.md "Facts"), so the driver owns the restart loop: every attempt gets a
*generation* (0, 1, ...), a fresh connection key derived from it (older generations
cannot talk to the new one) and restores from the latest completed checkpoint (seed 004
§4.1.3.1). After ``restart.max_attempts`` failed restarts the job fails with every cause.

:class:`JobDriver` runs that loop on its own thread; :class:`~epochal.runtime.driver.handle.JobHandle`
is the caller's view of it (wait, trigger, cancel, savepoints).
"""
from __future__ import annotations

import logging
import os
import secrets
import threading
import time

import cloudpickle

from epochal.backends.signing import derived_key
from epochal.backends.storage import CheckpointStorage, referenced_bytes
from epochal.config import MetricsConfig
from epochal.epochs.history import EpochHistory
from epochal.epochs.lineage import Lineage
from epochal.errors import ConfigError, EpochalError, JobFailedError
from epochal.runtime.driver import compatibility, failover
from epochal.query import QueryClient
from epochal.query.protocol import query_key
from epochal.runtime.driver.coordinator_server import AttemptOutcome, CoordinatorServer
from epochal.runtime.driver.handle import JobHandle, check_drain  # noqa: F401 (JobHandle: re-exported)
from epochal.runtime.driver.query_directory import QueryDirectory, routes_of
from epochal.runtime.driver.result import JobResult
from epochal.runtime.driver.deleter import CheckpointDeleter
from epochal.runtime.driver.savepoints import SavepointRequest, SavepointTracker
from epochal.runtime.driver.units import LaunchUnits
from epochal.runtime.task.attempt import AttemptSpec
from epochal.runtime.transport import wire

log = logging.getLogger("epochal")


class _NotStarted:
    """Stands in for the coordinator of an attempt that never launched (no slots)."""

    def __init__(self, first_epoch: int):
        self.highest_triggered = first_epoch - 1
        self.history = EpochHistory(1)
        self.completed: list = []
        self.aborted: list = []


class JobDriver:
    def __init__(self, plan, plan_blob, components, checkpoint, restart, channels, launcher, storage, url, runtime,
                 faults, backend, encrypted: bool = False, allow_non_restored_state: bool = False,
                 metrics: MetricsConfig | None = None, peer_timeout: float | None = None):
        from epochal.metrics.reporter import Reporter

        self.backend = backend
        self.region: str | None = None  # its region's name in a job of several (epochal.regions.run)
        #: in a job of several regions: returns every region's line for the dashboard
        #: (RegionsHandle.dashboard_regions), so each region's page links the others
        self.siblings = None
        self.peer_timeout = peer_timeout  # ClusterConfig.peer_timeout on a cluster, None on loopback
        self.allow_non_restored_state = allow_non_restored_state
        self.encrypted = encrypted
        self.plan, self.plan_blob, self.components, self.checkpoint = plan, plan_blob, components, checkpoint
        self.restart, self.channels, self.launcher = restart, channels, launcher
        self.storage, self.url, self.runtime, self.faults = storage, url, runtime, faults
        self.secret = os.urandom(32)
        self.query_token = secrets.token_hex(16)  # for the whole job: clients keep it across restarts
        self.query_tls = None  # an encrypted job's queries travel in TLS pinned to a per-job certificate
        if encrypted:
            from epochal.runtime.transport.tls import TLSMaterial

            self.query_tls = TLSMaterial.generate(f"{plan.job} queries")
        self.query_directory = QueryDirectory(query_key(self.query_token), launcher.bind_host, self._query_routes,
                                              advertised_host=launcher.advertised_host, tls=self.query_tls)
        self._query_client: QueryClient | None = None
        self.server: CoordinatorServer | None = None
        self._server_lock = threading.Lock()
        self._early_trigger = False  # trigger_epoch() before the first coordinator existed
        self.result: JobResult | None = None
        self.error: BaseException | None = None
        self._cancelled = False
        self.metrics_config = metrics or MetricsConfig()
        # live state for the metrics (epochal.metrics): read by the reporter thread
        self.state, self.attempt_index, self.generation, self.restarts = "starting", 0, None, []
        self.reporter = Reporter(plan, self.metrics_config, self._progress_source)
        self.restored_from_url: str | None = None
        self.savepoints = SavepointTracker(storage, lambda m: log.info("job %s: %s", plan.job, m))
        #: retention's deletes for every attempt, off the coordinator's loop (closed at the job's end)
        self.deleter = CheckpointDeleter(storage, lambda m: log.info("job %s: %s", plan.job, m))
        self.stopped_with_savepoint: str | None = None
        #: this run's lineage (epochal.epochs.lineage), drawn by the first attempt
        self.lineage: Lineage | None = None
        #: the job's lease and its sinks' holds (epochal.runtime.driver.lease): released when it ends
        self.holds: list = []
        self._abort_reason: str | None = None
        self.timeline: list[dict] = []  # JobResult.attempt_timeline, filled attempt by attempt
        self._t0 = time.monotonic()  # the run's start (reset by run): timeline times count from it
        self.dashboard = None
        if self.metrics_config.ui:  # the web dashboard (epochal.ui), closed with the reporter
            from epochal.ui.dashboard import Dashboard

            self.dashboard = Dashboard(plan, self.metrics_config, self._dashboard_source,
                                       lambda: self.reporter.latest, self._savepoint_for_page)
            self.reporter.subscribe(self.dashboard.model.on_progress)
        self.thread = threading.Thread(target=self._run_guarded, name=f"epochal-driver-{plan.job}", daemon=True)

    def _progress_source(self):
        server = self.server
        state = {"state": self.state, "attempt": self.attempt_index, "generation": self.generation,
                 "restarts": list(self.restarts)}
        if self.region is not None:  # progress events name the region (epochal.regions)
            state["region"] = self.region
        if server is None or isinstance(server, _NotStarted):
            return state, {}, None
        return state, dict(server.live), server.history

    def _dashboard_source(self) -> dict:
        """The driver's state now, for the dashboard (:class:`epochal.ui.model.DashboardModel`)."""
        server = self.server
        started = server is not None and not isinstance(server, _NotStarted)
        return {"state": self.state, "runtime": self.runtime, "guarantee": self.components.guarantee.value,
                "checkpoint_root": f"{self.url}/{self.plan.job}", "generation": self.generation,
                "history": server.history if started else None,
                "highest_triggered": server.highest_triggered if server is not None else None,
                "timeline": self._live_timeline(server if started else None), "restarts": list(self.restarts),
                "failovers": list(server.failover_log) if started else [],
                "savepoints": list(self.savepoints.written),
                "region": self.region, "regions": self.siblings() if self.siblings is not None else []}

    def _live_timeline(self, server) -> list[dict]:
        """The attempts so far; the running one with the times its server has seen already
        (``_attempt`` fills them into the entry only when the attempt ends)."""
        timeline = [dict(e) for e in self.timeline]
        if server is not None and timeline and "stopped_s" not in timeline[-1]:
            for name in ("connected", "running"):
                if name in server.times:
                    timeline[-1][f"{name}_s"] = server.times[name] - self._t0
        return timeline

    def _savepoint_for_page(self, stop: bool, timeout: float, drain: bool = False) -> str:
        """The dashboard's actions: a savepoint at the default location (then stop, drained)."""
        return self.request_savepoint(None, stop, drain).wait(timeout)

    def _query_routes(self) -> dict | str | None:
        """Routes of the running attempt; ``None`` between attempts, ``"ended"`` once the job ended."""
        if self.state in ("finished", "failed"):
            return "ended"
        server = self.server
        if server is None or isinstance(server, _NotStarted) or server.outcome is not None:
            return None
        return routes_of(self.plan, server.generation, dict(server.query_addresses))

    def revoke_query_token(self) -> str:
        """:meth:`JobHandle.revoke_query_token`: a new token, its key to the directory and
        the running attempt's tasks (later attempts start with it)."""
        with self._server_lock:
            self.query_token = secrets.token_hex(16)
            key = query_key(self.query_token)
            self.query_directory.rekey(key)
            server, client, self._query_client = self.server, self._query_client, None
        if server is not None and hasattr(server, "rekey_queries"):
            server.rekey_queries(key)
        if client is not None:
            client.close()
        return self.query_token

    def query_client(self) -> QueryClient:
        with self._server_lock:
            if self._query_client is None:
                self._query_client = QueryClient(self.query_directory.address, self.query_token, tls=self.query_tls)
            return self._query_client

    def trigger_epoch(self) -> None:
        with self._server_lock:
            server = self.server
            if server is None:
                self._early_trigger = True
                return
        server.trigger_epoch()

    def request_savepoint(self, url: str | None, stop: bool, drain: bool = False) -> SavepointRequest:
        if drain:
            check_drain(self.plan, self.checkpoint)
        if url is not None:
            _check_savepoint_target(url, self.storage)
        request = SavepointRequest(url, stop, drain)
        self.savepoints.add(request)
        return request

    def cancel(self) -> None:
        """Cancel the job: its running attempt fails and none follows. Any thread, at any
        time: a cancel before the attempt's coordinator exists (right after ``start``) fails
        that attempt as soon as it does (:meth:`_attempt`), it is not lost. Idempotent."""
        self._stop_job(None)

    def abort(self, reason: str) -> None:
        """Stop the job for ``reason`` (e.g. its lease was taken over): no restart."""
        self._stop_job(reason)

    def _stop_job(self, reason: str | None) -> None:
        with self._server_lock:  # against _attempt publishing its server: one of the two fails it
            if reason is not None:
                self._abort_reason = reason
            self._cancelled = True
            server = self.server
        if server is not None:
            server.fail(reason or "cancelled by the user")

    def _run_guarded(self) -> None:
        watcher = None
        if self.checkpoint.requests_poll is not None:  # savepoints requested by `epochal savepoint trigger`
            from epochal.runtime.driver.requests import RequestWatcher

            watcher = RequestWatcher(self.storage, self.request_savepoint, self.checkpoint.requests_poll,
                                     self.plan.job, self.checkpoint.savepoint_targets).start()
        try:
            self.result = self._run()
            self.state = "finished"
        except BaseException as exc:
            self.error = exc
            self.state = "failed"
        finally:
            # nothing of the job may write after its end: the savepoint copies in flight end
            # first (close joins them), then the request watcher, whose answers they resolve
            self.savepoints.close(f"job {self.plan.job!r} is not running")
            self.deleter.close()  # retention's deletes in flight end before the job does
            if watcher is not None:
                watcher.close()
            self.launcher.close()
            self.reporter.close()
            if self.dashboard is not None:
                self.dashboard.close()
            self.query_directory.close()
            if self._query_client is not None:
                self._query_client.close()
            for held in reversed(self.holds):  # the lease last: the job's tasks are gone now
                try:
                    held.release()
                except Exception as exc:
                    log.warning("job %s: releasing %r failed: %s", self.plan.job, held, exc)

    def _run(self) -> JobResult:
        t0 = self._t0 = time.monotonic()
        failures: list[str] = []
        restored_from: list = []
        timeline = self.timeline
        highest = max(self.storage.all_epochs(), default=0)  # includes incomplete epochs: never reuse an id
        poison = None  # (operator, record, error type) the previous attempt failed on
        self._restarts_left = self.restart.max_attempts  # whole-attempt restarts and failovers alike
        attempt = -1
        while True:
            attempt += 1
            started = time.monotonic() - t0
            generation = self.storage.next_generation()
            self.attempt_index, self.generation = attempt, generation
            # the newest checkpoint whose files all verify; a damaged one is skipped with a
            # WARNING (falling back past a committed epoch can repeat its sink output)
            latest = self.storage.latest_restorable()
            restore = None
            if latest is not None:
                epoch, meta = latest
                # every restore is checked (a fallback past a damaged checkpoint may reach one
                # of an older plan): a mismatch fails the job before any task starts
                compatibility.enforce(self.plan, meta, self.allow_non_restored_state, log)
                compatibility.check_sink_mode(meta, epoch, self.components.sink_mode.value,
                                              self.storage.read_document(compatibility.SINKS_COMMITTED))
                restore = {"epoch": epoch, "tasks": meta["tasks"]}
                highest = max(highest, epoch)
            if self.lineage is None:  # failure restarts keep the run's lineage
                self.lineage = Lineage.begin(latest[1], latest[0]) if latest is not None else Lineage.begin()
                log.info("job %s: this run is %s", self.plan.job, self.lineage.describe())
            restored_from.append(restore["epoch"] if restore else None)
            entry = {"generation": generation, "started_s": started,
                     "restored_epoch": restore["epoch"] if restore else None,
                     "restored_bytes": referenced_bytes(latest[1]) if latest is not None else 0}
            timeline.append(entry)
            outcome, server = self._attempt(generation, restore, highest + 1, entry, t0)
            highest = max(highest, server.highest_triggered)
            for alone in getattr(server, "failover_log", ()):  # failover regions restarted alone
                failures.append(alone["cause"])
                for failed in alone.get("failed_relaunches", ()):  # a relaunch that died before it joined:
                    restored_from.append(None)  # a restart that restored nothing, and its failure
                    failures.append(failed)
                restored_from.append(alone["restored_epoch"])
            self.stopped_with_savepoint = getattr(server, "stopped_with_savepoint", None)
            entry["cause"] = None if outcome.ok else outcome.cause
            if outcome.ok and self.stopped_with_savepoint:
                self._record_sinks_committed(self.stopped_with_savepoint)
            if outcome.ok:
                return JobResult(
                    job=self.plan.job, guarantee=self.components.guarantee.value, runtime=self.runtime,
                    attempts=len(restored_from), failures=failures, completed_epochs=server.completed,
                    aborted_epochs=server.aborted, task_metrics=outcome.task_metrics,
                    duration_s=time.monotonic() - t0, checkpoint_root=f"{self.url}/{self.plan.job}",
                    restored_from=restored_from, attempt_timeline=timeline, encrypted=self.encrypted,
                    savepoints=list(self.savepoints.written), stopped_with_savepoint=self.stopped_with_savepoint,
                    restored_from_url=self.restored_from_url, checkpoints=server.history.summary(),
                    lineage=self.lineage.id, failovers=list(getattr(server, "failover_log", ())),
                )
            failures.append(outcome.cause)
            self.state = "restarting"
            self.restarts.append({"generation": generation, "cause": (outcome.cause or "").splitlines()[0][:500]})
            log.warning("job %s attempt %d (generation %d) failed: %s", self.plan.job, attempt, generation,
                        outcome.cause.splitlines()[0] if outcome.cause else "")
            if self._cancelled:
                raise JobFailedError(f"job {self.plan.job!r} was "
                                     + (f"stopped: {self._abort_reason}" if self._abort_reason else "cancelled"), failures)
            if outcome.fatal:
                raise JobFailedError(f"job {self.plan.job!r} cannot run (not retried): {outcome.cause}", failures)
            repeated = outcome.poison is not None and (outcome.poison == poison or outcome.poison in getattr(
                server, "failover_poisons", ()))  # the same record failed before: in a failover region too
            if repeated and self._restarts_left > 0:
                op, record, error = outcome.poison
                raise JobFailedError(
                    f"job {self.plan.job!r} stopped retrying: operator {op!r} failed on the same record in two "
                    f"attempts in a row ({error}), so it fails deterministically: record {record}; last cause: "
                    f"{outcome.cause} — fix the function or filter the record out upstream", failures)
            poison = outcome.poison
            if self._restarts_left <= 0:
                raise JobFailedError(
                    f"job {self.plan.job!r} failed after {len(failures)} attempt(s) "
                    f"(restart.max_attempts={self.restart.max_attempts}); last cause: {failures[-1]}",
                    failures,
                )
            self._restarts_left -= 1
            time.sleep(self.restart.delay)

    def _record_sinks_committed(self, url: str) -> None:
        """The job stopped with the savepoint at ``url``: every sink transaction up to its
        epoch is committed. Say so in the job's storage and in the savepoint, so a run with
        another guarantee may start from it (compatibility.check_sink_mode)."""
        from epochal.state.location import open_checkpoint

        try:
            point = open_checkpoint(url)
            doc = {"epoch": point.epoch, "savepoint": url}
            self.storage.write_document(compatibility.SINKS_COMMITTED, doc)
            point.storage.write_document(compatibility.SINKS_COMMITTED, doc)
        except Exception as exc:  # the job stopped fine; only a later guarantee switch is refused
            log.warning("job %s: could not record that the sinks committed savepoint %s: %s", self.plan.job, url, exc)

    def _attempt(self, generation: int, restore: dict | None, first_epoch: int, entry: dict, t0: float):
        """Run one attempt to its end; fill ``entry`` (a JobResult.attempt_timeline item)."""
        key = wire.derive_key(self.secret, self.plan.job, generation)
        tls = None
        if self.encrypted:
            from epochal.runtime.transport.tls import TLSMaterial

            tls = TLSMaterial.generate(f"{self.plan.job} generation {generation}")
        bind = self.launcher.bind_host
        try:  # on a cluster: wait for a slot per task (executors registering, a lost host replaced)
            self.launcher.prepare(len(self.plan.tasks))
        except EpochalError as exc:
            entry.update(launched_s=None, stopped_s=time.monotonic() - t0, connected_s=None, running_s=None,
                         failed_s=time.monotonic() - t0, tasks={})
            return AttemptOutcome(False, str(exc)), _NotStarted(first_epoch)
        server = CoordinatorServer(self.plan, generation, key, self.storage, self.checkpoint, restore,
                                   first_epoch, bind, lambda m: log.info("job %s: %s", self.plan.job, m),
                                   startup_timeout=self.launcher.startup_timeout,
                                   advertised_host=self.launcher.advertised_host, tls=tls,
                                   savepoints=self.savepoints, peer_timeout=self.peer_timeout,
                                   lineage=self.lineage, sink_mode=self.components.sink_mode.value,
                                   groups=failover.restarts_alone(self.plan, self.restart), deleter=self.deleter)
        with self._server_lock:
            self.server = server
            early, self._early_trigger = self._early_trigger, False
            cancelled = self._cancelled
        if cancelled:  # cancelled before this attempt's coordinator existed: it fails at once
            server.fail(self._abort_reason or "cancelled by the user")
        if early:
            server.trigger_epoch()
        attempt = AttemptSpec(self.plan_blob, generation, key, server.address, self.components, self.channels,
                              self.url, self.faults, bind, self.backend, tls, self.metrics_config.interval,
                              self.peer_timeout, storage_retry=self.storage.retry.deadline,
                              inline_state=self.checkpoint.inline_state, lineage=self.lineage,
                              query_key=query_key(self.query_token), query_tls=self.query_tls,
                              log_key=derived_key(self.storage.signing_key, "task-logs"))
        payload = cloudpickle.dumps(attempt)
        units = LaunchUnits(self, server, attempt)  # one per failover region, relaunched alone
        entry["launched_s"] = time.monotonic() - t0
        self.state = "running"
        if not cancelled:  # a cancelled attempt launches no task (its server has failed it)
            units.run(payload)
        outcome: AttemptOutcome = server.wait()
        if outcome.ok:
            units.exited.wait(30.0)  # tasks said goodbye; let them exit on their own
        self.launcher.cancel()  # stops whatever still runs (every task, after a failure)
        server.close()
        if not outcome.ok and server.lost_hosts:
            self.launcher.hosts_lost(set(server.lost_hosts))
        entry["stopped_s"] = time.monotonic() - t0
        for name in ("connected", "running", "failed"):
            entry[f"{name}_s"] = server.times[name] - t0 if name in server.times else None
        entry["tasks"] = {t: dict(v) for t, v in server.task_setup.items()}
        return outcome, server


def _check_savepoint_target(url: str, storage: CheckpointStorage) -> None:
    """Refuse a savepoint location retention would delete, or one that is not empty."""
    target = CheckpointStorage.at_root(url, storage.storage_options)
    if type(target.fs) is type(storage.fs):
        rel = target.root[len(storage.root) + 1:] if target.root.startswith(storage.root + "/") else None
        if target.root == storage.root or rel is not None and rel.split("/")[0].startswith(("chk-", "shared")):
            raise ConfigError(f"savepoint location {url}: inside the job's checkpoint directory only a subdirectory "
                              "other than chk-* and shared/ is safe from retention (e.g. <root>/savepoints/...)")
    try:
        present = target.fs.ls(target.root, detail=False)
    except FileNotFoundError:
        present = []
    if present:
        raise ConfigError(f"savepoint location {url} is not empty; savepoints are never overwritten: choose a new one")
