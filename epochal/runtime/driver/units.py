"""Launch units of one attempt: the whole attempt, or one unit per failover region
(:mod:`epochal.runtime.driver.failover`), each relaunched alone when it fails.

:class:`LaunchUnits` is the driver thread's side of an attempt once the coordinator runs:
it launches every unit, waits on the coordinator's ``events`` and, for each failover
region the coordinator took down, stops what is left of its launch, spends one restart of
the budget, and launches it again as a new generation — or, with the budget spent, fails
the attempt. A launch's ``on_exit`` reports only while it is its region's current
incarnation: the reports of a launch stopped for a restart are stale.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time

import cloudpickle

log = logging.getLogger("epochal")


class LaunchUnits:
    """The units of one attempt (see the module docstring).

    Args:
        driver: the :class:`~epochal.runtime.driver.attempts.JobDriver` (its launcher,
            storage, restart strategy and budget ``_restarts_left``, ``restarts`` and
            ``generation`` for the metrics).
        server: the attempt's :class:`~epochal.runtime.driver.coordinator_server.CoordinatorServer`.
        attempt: the attempt's :class:`~epochal.runtime.task.attempt.AttemptSpec`.
    """

    def __init__(self, driver, server, attempt):
        self.driver, self.server, self.attempt = driver, server, attempt
        self.index = {t.id: i for i, t in enumerate(driver.plan.tasks)}
        self.groups = server.groups or [tuple(self.index)]
        #: set once every unit's tasks returned normally (or exited in any way after the
        #: attempt had ended well: nothing is left to wait for)
        self.exited = threading.Event()
        self._ended: set[int] = set()
        self._current = [0] * len(self.groups)  # each unit's running incarnation
        self._units: list = []

    def run(self, payload: bytes) -> None:
        """Launch every unit, then restart failover regions until the attempt ends."""
        launcher = self.driver.launcher
        self._units = [launcher.launch(payload, self._indexes(i), self._on_exit(i, 0)) for i in range(len(self.groups))]
        while True:
            event = self.server.events.get()
            if event[0] == "outcome":
                return
            _, group, incarnation, cause = event
            self._current[group] = incarnation  # from now on the stopped launch's reports are stale
            launcher.cancel(self._units[group])
            self._relaunch(group, incarnation, cause)

    def _relaunch(self, group: int, incarnation: int, cause: str) -> None:
        driver, server = self.driver, self.server
        if driver._restarts_left <= 0:
            server.fail(f"failover region {group} failed and restart.max_attempts={driver.restart.max_attempts} "
                        f"restarts are spent: {cause}")
            return
        driver._restarts_left -= 1
        time.sleep(driver.restart.delay)
        generation = driver.storage.next_generation()
        driver.generation = generation
        driver.restarts.append({"generation": generation, "cause": (cause or "").splitlines()[0][:500],
                                "tasks": list(self.groups[group])})
        log.warning("job %s: failover region %d (%s) restarts alone as generation %d", driver.plan.job, group,
                    ", ".join(self.groups[group]), generation)
        server.relaunched(group, incarnation, generation)
        query_key = server.query_key or self.attempt.query_key  # a revoked query token stays revoked
        payload = cloudpickle.dumps(dataclasses.replace(self.attempt, generation=generation, query_key=query_key))
        self._units[group] = driver.launcher.launch(payload, self._indexes(group), self._on_exit(group, incarnation))

    def _indexes(self, group: int) -> list[int]:
        return [self.index[t] for t in self.groups[group]]

    def _on_exit(self, group: int, incarnation: int):
        server = self.server

        def on_exit(ok: bool, cause: str, primary: bool = False, fatal: bool = False) -> None:
            if incarnation != self._current[group]:
                return  # a failover region's earlier launch, stopped when it restarted
            if not ok and not (server.outcome is not None and server.outcome.ok):
                if server.groups is not None and not fatal:
                    server.fail_group(group, incarnation, cause, secondary=not primary)
                else:
                    server.fail(cause, secondary=not (primary or fatal), fatal=fatal)
                return
            self._ended.add(group)
            if len(self._ended) < len(self.groups):
                return
            self.exited.set()
            if server.outcome is None:
                # all tasks returned: give the coordinator a moment to read their goodbyes
                if server.wait(5.0) is None:
                    server.fail("all tasks exited but the coordinator did not see the job finish")
        return on_exit
