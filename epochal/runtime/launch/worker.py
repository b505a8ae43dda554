"""Task process entry point, shared by every launcher."""
from __future__ import annotations

import os
import pickle
import sys

#: environment overrides for a task's addresses (e.g. ``spark.executorEnv.EPOCHAL_TASK_HOST``):
#: the address peers and the coordinator reach this host at, and the address to bind
TASK_HOST_ENV = "EPOCHAL_TASK_HOST"
TASK_BIND_HOST_ENV = "EPOCHAL_TASK_BIND_HOST"


def task_addresses(attempt, host: str | None) -> tuple[str, str]:
    """``(advertised, bind)`` addresses of a task's data server.

    ``host`` is the launcher's view of where the task runs (on Spark: the executor's
    address as Spark knows it, which the driver and the other executors reach);
    ``EPOCHAL_TASK_HOST`` overrides it (a multi-homed host), ``EPOCHAL_TASK_BIND_HOST``
    sets the address to bind (default: the advertised one). Without either, a task binds
    the attempt's default (loopback for local runs).
    """
    advertised = os.environ.get(TASK_HOST_ENV) or host or attempt.bind_host
    return advertised, os.environ.get(TASK_BIND_HOST_ENV) or advertised


def run_task(attempt_bytes: bytes, index: int, host: str | None = None) -> dict:
    """Run task ``index`` of the pickled :class:`~epochal.runtime.task.attempt.AttemptSpec` on
    ``host`` (see :func:`task_addresses`).

    Returns the task's metrics when the job finished cleanly; raises when it failed —
    :class:`~epochal.errors.TaskStartError` if it could not even reach the coordinator.
    """
    from epochal.errors import TaskStartError
    from epochal.runtime.transport import wire
    from epochal.runtime.task.task import Task

    attempt = pickle.loads(attempt_bytes)
    advertised, bind = task_addresses(attempt, host)
    try:
        plan = pickle.loads(attempt.plan_blob)
    except Exception as exc:
        cause = (f"task #{index} on host {advertised} cannot load the dataflow: {type(exc).__name__}: {exc} — "
                 "functions and classes used by the pipeline must be importable on the workers or defined in "
                 "the driver's __main__ script")
        try:
            conn = wire.connect(attempt.coordinator, attempt.key, {"task_index": index}, tls=attempt.tls,
                                codec=wire.CONTROL)
            conn.send(("setup_failed", index, cause))
            conn.close()
        except Exception:
            raise TaskStartError(cause) from exc
        raise RuntimeError(cause) from exc
    with _process_name(f"ep {plan.tasks[index].id}"):
        return Task(attempt, plan, index, advertised, bind, node=host).run()


class _process_name:
    """Show the task in ``ps``/``top`` (``/proc/self/comm``, 15 bytes) while it runs; the
    previous name comes back afterwards (Spark reuses its Python workers)."""

    def __init__(self, name: str):
        self.name = name.encode()[:15]
        self.old = None

    def __enter__(self):
        try:
            with open("/proc/self/comm", "rb") as f:
                self.old = f.read().strip()
            with open("/proc/self/comm", "wb") as f:
                f.write(self.name)
        except OSError:
            self.old = None

    def __exit__(self, *exc):
        if self.old is not None:
            try:
                with open("/proc/self/comm", "wb") as f:
                    f.write(self.old)
            except OSError:
                pass


def main() -> None:
    index = int(sys.argv[1])
    attempt_bytes = sys.stdin.buffer.read()
    try:
        run_task(attempt_bytes, index)
    except BaseException as exc:  # the coordinator already got the cause; exit non-zero
        from epochal.runtime.task.task import TaskCancelled

        if not isinstance(exc, TaskCancelled):
            print(f"epochal task {index} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
