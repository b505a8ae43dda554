"""Launchers start the tasks of one attempt somewhere: local processes or Spark.

Both run the same task code (:func:`epochal.runtime.launch.worker.run_task`); a launcher only
decides where the processes live and how to stop them.
"""
from __future__ import annotations

import collections
import subprocess
import threading
from abc import ABC, abstractmethod
from typing import Callable

#: ``on_exit(ok, cause, primary=False, fatal=False)``: ``primary`` when ``cause`` is the
#: failure itself (e.g. a task that could not reach the coordinator), not the echo of
#: another task's one; ``fatal`` when no restart can help (the executors cannot import epochal)
OnExit = Callable[..., None]


class Launcher(ABC):
    """Starts and stops the tasks of one attempt at a time."""

    #: the address the coordinator binds; also where tasks bind unless their launcher says
    #: where they run (local runs: loopback)
    bind_host: str = "127.0.0.1"
    #: the address tasks reach the coordinator at (None: ``bind_host``)
    advertised_host: str | None = None
    #: seconds for every task of an attempt to start and connect to the coordinator
    startup_timeout: float = 60.0
    #: tasks run on several hosts (a Spark cluster): storage must be shared, channels
    #: are encrypted by default
    is_cluster: bool = False

    def prepare(self, num_tasks: int) -> None:
        """Before each attempt, on the driver thread: block until ``num_tasks`` tasks can run
        at once. Raises :class:`~epochal.errors.EpochalError` (the attempt fails) when they
        cannot. Default: nothing to wait for."""

    def hosts_lost(self, hosts: set[str]) -> None:
        """After a failed attempt: these hosts stopped answering (``ClusterConfig.peer_timeout``);
        the next :meth:`prepare` must not start tasks on them while they stay silent.
        Default: nothing (one host)."""

    @abstractmethod
    def launch(self, attempt: bytes, tasks: list[int], on_exit: OnExit) -> object:
        """Start the tasks of indexes ``tasks`` (a *unit*: the whole attempt, or one failover
        region, :mod:`epochal.runtime.driver.failover`) without blocking; call ``on_exit(ok,
        cause[, primary])`` once when they all ended (ok) or one of them failed. Returns the
        unit, for :meth:`cancel`. Several units may run at once."""

    @abstractmethod
    def cancel(self, unit: object = None) -> None:
        """Stop every task of ``unit`` (``None``: of every unit); returns once they are gone."""

    def close(self) -> None:
        """Release launcher resources at the end of the job."""


class LocalLauncher(Launcher):
    """Runs each task as a local process forked from a pre-imported zygote
    (:mod:`epochal.runtime.launch.zygote`): same task code as on Spark, fast start.

    Used by most tests; the product path is :class:`~epochal.runtime.launch.spark.SparkLauncher`.
    """

    def __init__(self):
        from epochal.runtime.launch import warm, zygote

        self._zygote_mod = zygote
        # a spare zygote already imported (warm.prewarm, opt-in), else a new one
        self._proc = warm.take() or warm.spawn()
        self._lock = threading.Lock()
        self._write = threading.Lock()  # one message at a time on the zygote's stdin
        self._running: dict[int, tuple[_Unit, int]] = {}  # pid -> (unit, task index)
        # task index -> the units that launched it, oldest first, until their pids are known
        # (the zygote answers "run" messages in order; a region relaunched before its
        # cancelled unit's pid came back has two)
        self._starting: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._units: list[_Unit] = []
        threading.Thread(target=self._read, name="epochal-zygote-reader", daemon=True).start()

    def _read(self) -> None:
        fd = self._proc.stdout.fileno()
        while True:
            msg = self._zygote_mod.read_message(fd)
            if msg is None:
                return
            if msg[0] == "ready":  # the zygote has imported the runtime
                continue
            if msg[0] == "pid":
                if self._started(msg[1], msg[2]):
                    # a task of a unit cancelled while it was starting: it dies now; its exit
                    # is counted as any other's
                    self._send(("kill", msg[2]))
                continue
            report, unit = self._exited(msg[1], msg[2])
            if report:
                unit.on_exit(*report)

    def _started(self, index: int, pid: int) -> bool:
        """Task ``index`` runs as ``pid``; True when its unit was cancelled meanwhile."""
        with self._lock:
            unit = self._starting[index].popleft()
            if not self._starting[index]:
                del self._starting[index]
            self._running[pid] = (unit, index)
            return unit.cancelled

    def _exited(self, pid: int, code: int) -> tuple:
        """``(report for on_exit or None, unit)`` of task process ``pid``'s exit."""
        with self._lock:
            unit, index = self._running.pop(pid, (None, None))
            if unit is None:
                return None, None
            unit.expected -= 1
            report = None
            if code != 0 and not unit.failed:
                unit.failed = True
                report = (False, f"task process {index} exited with code {code}")
            elif unit.expected == 0 and not unit.failed:
                report = (True, "")
            if unit.expected == 0:
                unit.gone.set()
                self._units.remove(unit)
            return report, unit

    def launch(self, attempt: bytes, tasks: list[int], on_exit: OnExit) -> object:
        unit = _Unit(len(tasks), on_exit)
        with self._lock:
            self._units.append(unit)
            for index in tasks:
                self._starting[index].append(unit)
        for index in tasks:
            self._send(("run", index, attempt))
        return unit

    def _send(self, message) -> None:
        with self._write:
            self._zygote_mod.write_message(self._proc.stdin.fileno(), message)

    def cancel(self, unit: object = None) -> None:
        """Kill every task process of ``unit`` (``None``: of every unit): those running, and
        those still starting — a task whose pid the zygote reports after this began is
        killed as soon as it is known (the unit is marked cancelled first). Returns once
        they are all gone (or after 10 s a unit)."""
        with self._lock:
            units = list(self._units) if unit is None else [unit]
            for u in units:
                u.cancelled = True
            pids = [pid for pid, (u, _) in self._running.items() if u in units]
        for pid in pids:
            self._send(("kill", pid))
        for u in units:
            u.gone.wait(10)

    def close(self) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        from epochal.runtime.launch import warm

        warm.after_close()


class _Unit:
    """The tasks of one :meth:`LocalLauncher.launch`: how many still run, whether one failed."""

    def __init__(self, expected: int, on_exit: OnExit):
        self.expected, self.on_exit, self.failed = expected, on_exit, False
        self.cancelled = False  # LocalLauncher.cancel ran: a task that starts from now on is killed
        self.gone = threading.Event()
        if expected == 0:
            self.gone.set()
