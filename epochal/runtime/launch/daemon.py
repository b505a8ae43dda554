"""Spark's Python worker daemon with the task runtime imported once (``spark.python.daemon.module``).

Spark starts one daemon per executor (``python -m <daemon module> pyspark.worker``) and
``fork()``s every Python worker from it. PySpark's own daemon imports nothing, so each
worker of a cold session imports ``pyspark.worker`` and then — unpickling the barrier
stage's function — epochal, pyarrow and numpy: about a second of CPU per task, serialised
on a small machine (issue 24: 7 s of the 19 s to the first committed record on 2 busy
cores). This daemon imports them once before serving, like the local launcher's zygote
(:mod:`epochal.runtime.launch.zygote`), so a worker starts in a few milliseconds.

The embedded local session sets it (:func:`epochal.runtime.launch.spark._local_session`);
on a cluster, set ``spark.python.daemon.module=epochal.runtime.launch.daemon`` yourself
(the executors' Python must have epochal installed, as for any epochal job).

Forking after these imports is what the zygote has always done: numpy's and pyarrow's
helper threads do not survive a ``fork()``, and both libraries re-create them in the child.
An import that fails here is not fatal: the daemon serves anyway and the worker reports
the failure when it unpickles the task (with the cause named, see
:func:`epochal.runtime.launch.spark.summarize_failure`).
"""
from __future__ import annotations

import sys

#: imported before the first fork: what every epochal task process needs
PRELOAD = ("pyspark.worker", "epochal.runtime.task.task", "epochal.runtime.launch.worker",
           "epochal.runtime.launch.spark", "cloudpickle")


def preload() -> list[str]:
    """Import :data:`PRELOAD`; return the modules that failed (the workers retry them)."""
    import importlib

    failed = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # reported again, with context, by the worker that needs it
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    return failed


def main() -> None:
    failed = preload()
    if failed:
        print("epochal daemon: could not preload " + "; ".join(failed), file=sys.stderr, flush=True)
    from epochal.runtime.launch.zygote import freeze_imports

    freeze_imports()  # as the local zygote does: no full collection in a worker walks these
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
