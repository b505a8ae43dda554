"""Task process entry point, shared by every launcher."""
from __future__ import annotations

import pickle
import sys


def run_task(attempt_bytes: bytes, index: int) -> dict:
    """Run task ``index`` of the pickled :class:`~epochal.runtime.attempt.AttemptSpec`.

    Returns the task's metrics when the job finished cleanly; raises when it failed.
    """
    from epochal.runtime import wire
    from epochal.runtime.task import Task

    attempt = pickle.loads(attempt_bytes)
    try:
        plan = pickle.loads(attempt.plan_blob)
    except Exception as exc:
        cause = (f"task #{index} cannot load the dataflow: {type(exc).__name__}: {exc} — functions and "
                 "classes used by the pipeline must be importable on the workers or defined in the "
                 "driver's __main__ script")
        try:
            conn = wire.connect(attempt.coordinator, attempt.key, {"task_index": index})
            conn.send(("setup_failed", index, cause))
            conn.close()
        finally:
            raise RuntimeError(cause) from exc
    return Task(attempt, plan, index).run()


def main() -> None:
    index = int(sys.argv[1])
    attempt_bytes = sys.stdin.buffer.read()
    try:
        run_task(attempt_bytes, index)
    except BaseException as exc:  # the coordinator already got the cause; exit non-zero
        from epochal.runtime.task import TaskCancelled

        if not isinstance(exc, TaskCancelled):
            print(f"epochal task {index} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
