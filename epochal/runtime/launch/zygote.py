"""A pre-imported process that forks task processes for the local launcher.

Starting a fresh interpreter per task costs ~0.25 s (interpreter + imports), serialised
on a small machine. The zygote imports the task runtime once and ``fork()``s a child
per task (a few ms). It is single-threaded (``select`` loop) so forking is safe.

Protocol with its parent (the driver) over stdin/stdout pipes — a private channel
between a parent and the child it spawned, not a network peer: length-prefixed pickles
``("run", index, attempt_bytes)`` / ``("kill", pid)`` in, ``("ready",)`` (once, after the
imports: :mod:`epochal.runtime.launch.warm`), ``("pid", index, pid)`` / ``("exit", pid, code)`` out.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import sys

_LEN = struct.Struct("!I")


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def write_message(fd: int, message) -> None:
    payload = pickle.dumps(message, protocol=5)
    data = _LEN.pack(len(payload)) + payload
    while data:
        k = os.write(fd, data)
        data = data[k:]


def read_message(fd: int):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, _LEN.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def freeze_imports() -> None:
    """Move every object the imports made into the collector's permanent generation
    (``gc.freeze``), before the first fork: a full collection in a task then walks only the
    task's own objects — 0 ms instead of 31 ms for the runtime's ~47k objects, a pause that
    landed on whichever record or barrier was being handled — and the collector no longer
    writes to the shared pages, so they stay shared between the forked tasks. Idempotent."""
    import gc

    gc.collect()  # what is garbage now need not live for ever
    gc.freeze()


def main() -> None:
    import epochal.runtime.task.task  # noqa: F401  (the point: import once, fork many)
    import numpy.ma  # noqa: F401  (pa.array(ndarray) looks it up: numpy imports it lazily, 0.1 CPU-s in a task)
    from epochal.runtime.launch.worker import run_task

    freeze_imports()
    inp = sys.stdin.fileno()
    out = os.dup(sys.stdout.fileno())  # the protocol pipe; fd 1 becomes stderr so prints
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # of user code never corrupt it
    try:
        write_message(out, ("ready",))  # imported: a spare zygote (launch.warm) may be handed out
    except BrokenPipeError:  # the parent went away while we imported
        return
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([inp], [], [], 0.05)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            write_message(out, ("exit", pid, os.waitstatus_to_exitcode(status)))
        if not ready:
            continue
        msg = read_message(inp)
        if msg is None:  # parent went away: take the children down with us
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        if msg[0] == "run":
            _, index, attempt = msg
            pid = os.fork()
            if pid == 0:
                os.close(inp)
                os.close(out)
                code = 0
                try:
                    run_task(attempt, index)
                except BaseException as exc:
                    from epochal.runtime.task.task import TaskCancelled

                    if not isinstance(exc, TaskCancelled):
                        print(f"epochal task {index} failed: {type(exc).__name__}: {exc}", file=sys.stderr,
                              flush=True)
                    code = 1
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
            children.add(pid)
            write_message(out, ("pid", index, pid))
        elif msg[0] == "kill" and msg[1] in children:  # a child not reaped yet: its pid is still its own
            try:
                os.kill(msg[1], signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    main()
