"""A spare zygote, imported before the next local job asks for it (opt-in).

Every :class:`~epochal.runtime.launch.launcher.LocalLauncher` needs a zygote
(:mod:`epochal.runtime.launch.zygote`): a fresh interpreter that imports the task runtime
— epochal, pyarrow, numpy, fsspec — before it can fork the first task. That import costs
0.8 CPU-s on this project's 2-core machine, serially at the start of every local job. A
driver that runs several local jobs one after another (a benchmark, a notebook) can have
it paid ahead of time, as a Spark session already up pays its JVM's start-up before a
query starts:

    from epochal.runtime.launch.warm import prewarm
    prewarm()            # a spare zygote now (waits until it has imported), and after each local job

Contract:

* :func:`prewarm` starts a spare zygote and, with ``wait=True``, returns once it has
  imported the runtime (it says ``("ready",)`` on its pipe). From then on every local job
  of this process that finishes leaves a new spare behind (:func:`after_close`).
* :func:`take` hands the spare to the next :class:`LocalLauncher` only if it was started
  from the same interpreter, working directory and environment as the job now sees
  (a changed ``os.environ`` — a test's fault-injection variable — must reach the tasks);
  otherwise the spare is closed and the launcher starts its own zygote, as without
  :func:`prewarm`. A spare that died is never handed out.
* :func:`disable` stops making spares and kills the one kept (it never forked a task); it
  runs at the driver's exit too. A spare whose driver dies sees its pipe close and exits
  (the zygote's own rule): nothing outlives the driver.

Not thread-safe across concurrent local jobs started from several threads: each takes the
spare or starts its own, both are correct; only the saving is lost.
"""
from __future__ import annotations

import atexit
import os
import select
import subprocess
import sys
import threading

__all__ = ["after_close", "disable", "prewarm", "spawn", "take"]

_lock = threading.Lock()
_enabled = False
_spare: "Spare | None" = None


class Spare:
    """A started zygote process and the interpreter, directory and environment it saw."""

    def __init__(self):
        self.fingerprint = _fingerprint()
        self.proc = spawn()
        self._ready = False

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the zygote's ``("ready",)``; True once it said so."""
        if self._ready:
            return True
        from epochal.runtime.launch import zygote

        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return False
        message = zygote.read_message(fd)
        self._ready = message == ("ready",)
        return self._ready

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Stop it at once: a spare never forked a task, so nothing is left behind."""
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            pipe.close()


def spawn() -> subprocess.Popen:
    """A new zygote process (it imports the task runtime, then says ``("ready",)``)."""
    return subprocess.Popen([sys.executable, "-m", "epochal.runtime.launch.zygote"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _fingerprint() -> tuple:
    return sys.executable, os.getcwd(), tuple(sorted(os.environ.items()))


def prewarm(wait: bool = True, timeout: float = 60.0) -> None:
    """Keep a spare zygote for the next local job of this process, now and after each
    local job; with ``wait``, return once the spare has imported the runtime (at most
    ``timeout`` s). Idempotent: a usable spare is kept, not replaced."""
    global _enabled, _spare
    with _lock:
        if not _enabled:
            atexit.register(disable)  # the spare goes with the driver, without a word
        _enabled = True
        if _spare is not None and (not _spare.alive() or _spare.fingerprint != _fingerprint()):
            _spare.close()
            _spare = None
        if _spare is None:
            _spare = Spare()
        spare = _spare
    if wait:
        spare.wait_ready(timeout)


def take() -> subprocess.Popen | None:
    """The spare zygote for a launcher starting now, or None (not enabled, none kept, or
    it was started under another interpreter, directory or environment, or it died)."""
    global _spare
    with _lock:
        spare, _spare = _spare, None
    if spare is None:
        return None
    if not spare.alive() or spare.fingerprint != _fingerprint():
        spare.close()
        return None
    spare.wait_ready(0)  # consume its "ready" if already there (the launcher skips it otherwise)
    return spare.proc


def after_close() -> None:
    """A local job closed its launcher: start the next spare if :func:`prewarm` was called."""
    global _spare
    with _lock:
        if _enabled and _spare is None:
            _spare = Spare()


def disable() -> None:
    """Stop keeping spares; close the one kept."""
    global _enabled, _spare
    with _lock:
        _enabled = False
        spare, _spare = _spare, None
    if spare is not None:
        spare.close()

