"""Launching task processes: the only package that imports pyspark.

* ``launcher`` — the :class:`~epochal.runtime.launch.launcher.Launcher` interface and the
  local launcher (tasks forked from a pre-imported ``zygote`` process); ``warm`` — a spare
  zygote imported before the next local job asks for it (opt-in, ``warm.prewarm()``);
* ``spark`` — :class:`~epochal.runtime.launch.spark.SparkLauncher`: every task one
  long-running task of a Spark barrier stage; ``cluster`` — checks for a real cluster
  (storage every host sees); ``java`` — a Java for the embedded Spark;
* ``worker`` — the task process's entry point, shared by every launcher: unpickle the
  attempt and run its :class:`~epochal.runtime.task.task.Task`;
* ``state_spark`` — checkpointed state read into a Spark DataFrame (:func:`epochal.state.read_spark`).

The launchers run in the driver process; ``worker`` and ``zygote`` run in task processes.
May import: :mod:`epochal.runtime.task` and :mod:`epochal.runtime.transport` (the worker
runs a task), the layers below the runtime, and pyspark (only here). Never ``driver``.
"""
