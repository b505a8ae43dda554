"""Simulated tasks for ``benchmarks/scale.py``: thousands of them, in a few processes,
speaking the real wire protocol to the real driver.

Driver side, :class:`SimLauncher` is an :class:`~epochal.runtime.launch.launcher.Launcher`
(``start_job(..., runtime="local", launcher=SimLauncher(...))``, the seam in
:mod:`epochal.runtime.driver.job`): the real ``JobDriver`` — attempts, launch units and their
failover restarts, the coordinator server, ``_metadata``, retention, savepoints, query
directory, dashboard — hands it the pickled ``AttemptSpec`` as it hands it to Spark; the
launcher forwards it to ``P`` simulator processes (``python scale_sim.py``, a pickled
message pipe on stdin/stdout), each running its share of the tasks, one thread each.

A simulated task does what :class:`~epochal.runtime.task.task.Task` does on the control
connection, with the same code: :func:`epochal.runtime.transport.wire.connect` (pinned TLS
1.3 when the attempt is encrypted, as on a cluster, and the HMAC handshake), ``hello`` →
``start`` → ``running``; on every ``trigger`` it waits its delay (the snapshot it does not
take; ``delay * (1 + jitter * u)``, ``u`` uniform from a seeded generator), writes its state
file through :class:`~epochal.backends.storage.CheckpointStorage` (``state="file"``; or an
inline handle) and acknowledges with that handle and the metrics a task sends; once it acked
epoch ``first_epoch + epochs - 1`` it reports ``exhausted``; ``finish`` → ``finished``. A task named in the
fail schedule sends ``failed`` when epoch ``first_epoch + k`` triggers (first incarnation
only) and ends, so its failover region restarts.

Every task notes (``time.monotonic``, one clock for all processes of this machine) when each
epoch's trigger and completion reached it and when it sent its ack; each process reports the
per-epoch minima and maxima when it quits (:meth:`SimLauncher.collect`).
"""
from __future__ import annotations

import heapq
import os
import pickle
import queue
import random
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from epochal.runtime.launch.launcher import Launcher

_LEN = struct.Struct("!I")
HERE = Path(__file__).resolve().parent


def write_msg(f, msg) -> None:
    data = pickle.dumps(msg)
    f.write(_LEN.pack(len(data)) + data)
    f.flush()


def read_msg(f):
    head = f.read(4)
    if len(head) < 4:
        return None
    (n,) = _LEN.unpack(head)
    return pickle.loads(f.read(n))


# ---------------------------------------------------------------------- driver side
class SimLauncher(Launcher):
    """Runs the attempt's tasks in ``processes`` simulator processes (module docstring).

    ``settings``: ``delay`` (s), ``jitter``, ``epochs`` (acked before ``exhausted``),
    ``state`` (``"file"`` or ``"inline"``), ``state_bytes``, ``fail`` (``{task index: k}``),
    ``seed``, ``connect_parallel`` (handshakes in flight per process), ``first_epoch`` (the
    job's first: 1 on empty storage).
    """

    is_cluster = True  # encrypted and signed as on a cluster (secure_defaults)
    startup_timeout = 600.0

    def __init__(self, processes: int, settings: dict):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH"))
                                                          if p))
        self.procs = [subprocess.Popen([sys.executable, str(HERE / "scale_sim.py")], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env) for _ in range(processes)]
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._units: dict[int, dict] = {}
        self._next_unit = 0
        self._stats: list = []
        self._stats_done = threading.Event()
        self._quit = 0
        for k, proc in enumerate(self.procs):
            write_msg(proc.stdin, ("settings", dict(settings, process=k)))
            threading.Thread(target=self._read, args=(proc,), name=f"scale-sim-{k}", daemon=True).start()

    def _send(self, k: int, msg) -> None:
        with self._write_lock:
            write_msg(self.procs[k].stdin, msg)

    def _read(self, proc) -> None:
        while True:
            msg = read_msg(proc.stdout)
            if msg is None:
                return
            if msg[0] == "stats":
                with self._lock:
                    self._stats.append(msg[1])
                    if len(self._stats) == len(self.procs):
                        self._stats_done.set()
                continue
            _, unit_id, index, ok, cause = msg  # ("exit", ...): one task of a unit ended
            report = None
            with self._lock:
                unit = self._units.get(unit_id)
                if unit is None:
                    continue
                unit["left"] -= 1
                if not ok and not unit["failed"]:
                    unit["failed"] = True
                    report = (False, cause, True)
                elif unit["left"] == 0 and not unit["failed"]:
                    report = (True, "")
                if unit["left"] == 0:
                    unit["gone"].set()
                    self._units.pop(unit_id, None)
            if report:
                unit["on_exit"](*report)

    def launch(self, attempt: bytes, tasks: list[int], on_exit) -> object:
        with self._lock:
            unit_id = self._next_unit
            self._next_unit += 1
            self._units[unit_id] = {"left": len(tasks), "failed": False, "on_exit": on_exit,
                                    "gone": threading.Event()}
            gone = self._units[unit_id]["gone"]
        share: dict[int, list[int]] = {}
        for index in tasks:
            share.setdefault(index % len(self.procs), []).append(index)
        for k, indexes in share.items():
            self._send(k, ("launch", unit_id, attempt, indexes))
        return (unit_id, gone)

    def cancel(self, unit: object = None) -> None:
        with self._lock:
            units = [(u, e["gone"]) for u, e in self._units.items()] if unit is None else [unit]
        for unit_id, gone in units:
            for k in range(len(self.procs)):
                self._send(k, ("cancel", unit_id))
        for _unit_id, gone in units:
            gone.wait(30)

    def collect(self, timeout: float = 60.0) -> list[dict]:
        """Quit the simulator processes; their per-epoch figures, one dict per process."""
        for k in range(len(self.procs)):
            self._send(k, ("quit",))
        self._stats_done.wait(timeout)
        return list(self._stats)

    def close(self) -> None:
        """Kept running until :meth:`collect` (the driver closes its launcher when the job ends)."""

    def stop(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


# ---------------------------------------------------------------------- simulator process
class Figures:
    """Per-epoch minima/maxima of this process's tasks (monotonic seconds)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.epochs: dict[int, dict] = {}
        self.counts = {"acks": 0, "failed": 0, "connect_s_max": 0.0, "connect_errors": 0}

    def note(self, epoch: int, what: str, t: float) -> None:
        with self.lock:
            e = self.epochs.setdefault(epoch, {})
            lo, hi = e.get(what, (t, t))
            e[what] = (min(lo, t), max(hi, t))
            e[what + "_n"] = e.get(what + "_n", 0) + 1


class Scheduler:
    """Runs every due acknowledgement of this process (a heap of deadlines): one thread
    waits for the next deadline and hands it to ``workers`` threads, which write the state
    files (each an fsync) and send the acks in parallel, as tasks on their own hosts would."""

    def __init__(self, workers: int = 32):
        self._heap: list = []
        self._cond = threading.Condition()
        self._seq = 0
        self._due: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="acks", daemon=True).start()
        for k in range(workers):
            threading.Thread(target=self._work, name=f"ack-worker-{k}", daemon=True).start()

    def _work(self) -> None:
        while True:
            fn = self._due.get()
            try:
                fn()
            except Exception:
                pass  # the task's connection went; its reader notices

    def at(self, t: float, fn) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, fn))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic()))
                _, _, fn = heapq.heappop(self._heap)
            self._due.put(fn)


class SimTask:
    """One simulated task of one launch (module docstring)."""

    def __init__(self, sim, unit_id: int, index: int, attempt, plan, storage):
        self.sim, self.unit_id, self.index = sim, unit_id, index
        self.attempt, self.plan, self.storage = attempt, plan, storage
        self.spec = plan.tasks[index]
        self.conn = None
        self.cancelled = False
        self.exhausted_sent = False
        s = sim.settings
        self.rng = random.Random(s["seed"] * 1_000_003 + index)
        blob = self.rng.randbytes(s["state_bytes"])
        self.blob = blob
        self.fail_at = s["fail"].get(index) if attempt.generation == sim.first_generation else None

    def run(self) -> None:
        from epochal.runtime.transport import wire

        ok, cause = True, ""
        try:
            with self.sim.connecting:
                t0 = time.monotonic()
                self.conn = wire.connect(self.attempt.coordinator, self.attempt.key,
                                         {"task": self.spec.id, "generation": self.attempt.generation},
                                         tls=self.attempt.tls, codec=wire.CONTROL)
                with self.sim.figures.lock:
                    c = self.sim.figures.counts
                    c["connect_s_max"] = max(c["connect_s_max"], time.monotonic() - t0)
            if self.cancelled:
                raise ConnectionError("cancelled")
            self.conn.send(("hello", self.spec.id, None))
            start = self.conn.recv()
            if start[0] != "start":
                raise RuntimeError(f"task {self.spec.id}: coordinator sent {start[0]!r} instead of start")
            self.conn.send(("running", self.spec.id, {"setup_s": 0.0, "restore_s": 0.0}))
            ok, cause = self._control()
        except Exception as exc:
            if not self.cancelled:
                ok, cause = False, f"task {self.spec.id}: {type(exc).__name__}: {exc}"
                with self.sim.figures.lock:
                    self.sim.figures.counts["connect_errors"] += 1
        finally:
            if self.conn is not None:
                self.conn.close()
        self.sim.exited(self, ok and not self.cancelled, cause or "cancelled")

    def _control(self) -> tuple[bool, str]:
        figures = self.sim.figures
        while True:
            msg = self.conn.recv()
            now = time.monotonic()
            kind = msg[0]
            if kind == "trigger":
                epoch = msg[1]
                figures.note(epoch, "trigger", now)
                if self.fail_at is not None and epoch >= self.sim.first_epoch + self.fail_at:
                    self.conn.send(("failed", self.spec.id, f"task {self.spec.id}: scheduled failure at epoch {epoch}",
                                    {}))
                    with figures.lock:
                        figures.counts["failed"] += 1
                    return False, f"task {self.spec.id}: scheduled failure at epoch {epoch}"
                s = self.sim.settings
                delay = s["delay"] * (1.0 + s["jitter"] * self.rng.random())
                self.sim.scheduler.at(now + delay, lambda e=epoch, t=now: self._ack(e, t))
            elif kind == "complete":
                figures.note(msg[1], "complete", now)
                if len(msg) > 2 and msg[2]:  # a stop's epoch: confirm the commit
                    self.conn.send(("committed", self.spec.id, msg[1]))
            elif kind == "finish":
                self.conn.send(("finished", self.spec.id, {"records_in": 0}))
                return True, ""
            elif kind == "cancel":
                return False, f"task {self.spec.id} cancelled by the coordinator: {msg[1][:200]}"
            # "abort": nothing to release; others ("start" again after a rejoin) ignored

    def _ack(self, epoch: int, triggered: float) -> None:
        t0 = time.monotonic()
        if self.sim.settings["state"] == "file":
            handle = self.storage.write_state(epoch, self.spec.id.replace("[", "-").replace("]", "") + ".state",
                                              self.blob)
        else:
            handle = self.storage.inline_state(self.blob)
        now = time.monotonic()
        metrics = {"barrier_s": 0.0, "alignment_s": 0.0, "sync_s": 0.0, "upload_wait_s": t0 - triggered,
                   "upload_s": now - t0, "durable_s": now - t0, "bytes": handle.size, "state_bytes": handle.size,
                   "snapshot_kind": "aligned"}
        self.conn.send(("ack", epoch, {"task": self.spec.id, "handle": handle.to_dict(), "metrics": metrics,
                                       "shared": []}))
        sent = time.monotonic()
        self.sim.figures.note(epoch, "ack", sent)
        self.sim.figures.note(epoch, "work", sent - triggered)
        with self.sim.figures.lock:
            self.sim.figures.counts["acks"] += 1
        if epoch >= self.sim.first_epoch + self.sim.settings["epochs"] - 1 and not self.exhausted_sent:
            self.exhausted_sent = True
            self.conn.send(("exhausted", self.spec.id))


class Simulator:
    """The main loop of one simulator process: launches and cancels from the pipe."""

    def __init__(self, settings: dict, out):
        self.settings = settings
        self.out = out
        self.out_lock = threading.Lock()
        self.figures = Figures()
        self.scheduler = Scheduler(settings.get("ack_workers", 32))
        self.connecting = threading.BoundedSemaphore(settings["connect_parallel"])
        self.tasks: dict[int, list[SimTask]] = {}
        self.first_generation = None
        self.first_epoch = None
        self.lock = threading.Lock()

    def launch(self, unit_id: int, attempt_bytes: bytes, indexes: list[int]) -> None:
        from epochal.backends.storage import CheckpointStorage

        attempt = pickle.loads(attempt_bytes)
        plan = pickle.loads(attempt.plan_blob)
        if self.first_generation is None:
            self.first_generation = attempt.generation
            self.first_epoch = self.settings["first_epoch"]
        storage = CheckpointStorage(attempt.storage_url, plan.job)
        tasks = [SimTask(self, unit_id, i, attempt, plan, storage) for i in indexes]
        with self.lock:
            self.tasks.setdefault(unit_id, []).extend(tasks)
        for task in tasks:
            threading.Thread(target=task.run, name=task.spec.id, daemon=True).start()

    def cancel(self, unit_id: int) -> None:
        with self.lock:
            tasks = list(self.tasks.get(unit_id, ()))
        for task in tasks:
            task.cancelled = True
            if task.conn is not None:
                task.conn.close()

    def exited(self, task: SimTask, ok: bool, cause: str) -> None:
        with self.lock:
            self.tasks.get(task.unit_id, []).remove(task)
        with self.out_lock:
            write_msg(self.out, ("exit", task.unit_id, task.index, ok, cause))

    def stats(self) -> dict:
        with self.figures.lock:
            return {"process": self.settings["process"], "epochs": dict(self.figures.epochs),
                    "counts": dict(self.figures.counts), "cpu_s": sum(os.times()[:2])}


def main() -> None:
    threading.stack_size(256 * 1024)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the pipe
    settings = read_msg(inp)[1]
    sim = Simulator(settings, out)
    while True:
        msg = read_msg(inp)
        if msg is None:
            return
        if msg[0] == "launch":
            sim.launch(msg[1], msg[2], msg[3])
        elif msg[0] == "cancel":
            sim.cancel(msg[1])
        elif msg[0] == "quit":
            with sim.out_lock:
                write_msg(out, ("stats", sim.stats()))


if __name__ == "__main__":
    main()
