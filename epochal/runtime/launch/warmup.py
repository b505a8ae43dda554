"""``epochal.warm_up``: start-up paid before a clock starts (the embedded Spark session and its
worker daemon, or a spare zygote). Its own module: the zygote spares (:mod:`.warm`) are used by
the launcher, which the Spark session's module imports."""
from __future__ import annotations

from epochal.runtime.launch import warm


def warm_up(runtime: str = "spark", *, timeout: float = 120.0) -> None:
    """Start now what a process's first job would start inside its own run: the embedded
    Spark session and its pre-importing Python worker daemon (``runtime="spark"``), or a
    spare zygote (``runtime="local"``, :func:`~epochal.runtime.launch.warm.prewarm`). For benchmarks and services that
    start their clock, or their first deadline, after start-up. Returns once it is up
    (at most ``timeout`` s); a session already active is used as it is. Idempotent.

    Raises whatever starting Spark raises (no Java: see ``docs/cluster.md#java``)."""
    if runtime == "local":
        warm.prewarm(True, timeout)
        return
    if runtime != "spark":
        from epochal.errors import ConfigError

        raise ConfigError(f"warm_up: runtime must be 'spark' or 'local', got {runtime!r}")
    from epochal.runtime.launch import spark

    thread = spark.start_local_session()
    if thread is not None:
        thread.join(timeout)
    session = spark._session(None, spark.LOCAL_SLOTS)
    # one tiny Python task: Spark forks its worker daemon, which imports epochal for the tasks
    session.sparkContext.parallelize([0], 1).map(lambda x: x).count()
