"""Faults from outside the campaign's process (issue 46; the histories are ``tests/campaign.py``).

* :class:`DriverProcess` — a job's driver in a process of its own, so that it can be
  SIGKILLed like a machine that lost power: the dataflow is shipped pickled, the child
  starts it on the local runtime and prints each completed epoch and its task processes'
  ids; :meth:`DriverProcess.kill` SIGKILLs the driver alone (its tasks are orphaned and
  must notice on their own) and waits until every task process it had is gone.
* :class:`SmallDisk` — checkpoint storage on a small tmpfs (root only) that
  :meth:`SmallDisk.fill` fills up and :meth:`SmallDisk.free` frees again: checkpoint storage
  unavailable for a while (``ENOSPC`` on every write; reads still work).
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import cloudpickle

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_CHILD = r"""
import os, sys, time, cloudpickle, epochal as ep
flow, options = cloudpickle.loads(open(sys.argv[1], "rb").read())
handle = flow.start(runtime="local", **options)
seen = -1
while handle.running:
    # a job of regions: the epochs every region completed (each region's resume needs one)
    n = min(len(h.completed_epochs) for h in handle.regions.values()) if hasattr(handle, "regions") \
        else len(handle.completed_epochs)
    if n != seen:
        m = handle.metrics()  # a job of regions: each region's tasks
        tasks = {(r, n): t for r, rm in (m.get("regions") or {None: m}).items() for n, t in (rm.get("tasks") or {}).items()}
        pids = sorted({t.get("pid") for t in tasks.values() if t.get("pid") and t.get("pid") != os.getpid()})
        print("EPOCHS", n, *pids, flush=True)
        seen = n
    time.sleep(0.02)
handle.wait(1)
print("ENDED", flush=True)
"""


class DriverProcess:
    """A driver in its own process (see the module docstring)."""

    def __init__(self, flow, workdir: str, **options):
        blob = os.path.join(workdir, f"driver-{time.monotonic_ns()}.pkl")
        with open(blob, "wb") as f:
            f.write(cloudpickle.dumps((flow, options)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, blob], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.epochs, self.pids, self.ended = 0, set(), False
        self._lines = threading.Thread(target=self._read, daemon=True)
        self._lines.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = line.split()
            if parts and parts[0] == "EPOCHS":
                self.epochs = int(parts[1])
                self.pids.update(int(p) for p in parts[2:])
            elif parts and parts[0] == "ENDED":
                self.ended = True

    @property
    def running(self) -> bool:
        return self.proc.poll() is None and not self.ended

    def wait_epochs(self, n: int, timeout: float) -> bool:
        """Wait until the child's job completed ``n`` epochs; False if it ended first."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            if self.epochs >= n:
                return True
            time.sleep(0.02)
        return False

    def kill(self, timeout: float = 60.0) -> None:
        """SIGKILL the driver alone; wait until its orphaned task processes are gone too
        (AssertionError naming them if they outlive ``timeout``)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = [p for p in self.pids if _alive(p)]
            if not alive:
                return
            time.sleep(0.05)
        raise AssertionError(f"task processes {alive} outlived their SIGKILLed driver by {timeout:.0f} s")

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None else ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not reaped by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class SmallDisk:
    """A tmpfs of ``size`` on a fresh directory (see the module docstring)."""

    def __init__(self, size: str = "64m"):
        self.path = tempfile.mkdtemp(prefix="campaign-disk-")
        if os.geteuid() != 0 or shutil.which("mount") is None:
            raise RuntimeError("a storage outage needs root, to mount a small tmpfs")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", self.path],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            os.rmdir(self.path)
            raise RuntimeError(f"cannot mount a tmpfs: {proc.stderr.strip()}")
        self.filler = os.path.join(self.path, "filler")

    def fill(self) -> None:
        """Take every free byte: each write to the storage fails with ENOSPC from now on."""
        with open(self.filler, "ab", buffering=0) as f:
            for chunk in (1 << 20, 1 << 16, 4096, 1):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise

    def free(self) -> None:
        if os.path.exists(self.filler):
            os.unlink(self.filler)

    def close(self) -> None:
        """Unmount and remove; never raises (a write racing the unmount lands underneath)."""
        try:
            self.free()
        finally:
            subprocess.run(["umount", "-l", self.path], check=False, capture_output=True)
            shutil.rmtree(self.path, ignore_errors=True)
