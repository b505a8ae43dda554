"""The driver side: code that runs in the process that called ``Dataflow.run`` / ``start``
(the Spark driver on Spark).

* ``job`` — :func:`~epochal.runtime.driver.job.start_job`: every check that can run before
  a task starts, then a driver thread;
* ``attempts`` — :class:`~epochal.runtime.driver.attempts.JobDriver`, the restart loop
  (attempt after attempt, each a new generation), and the caller's
  :class:`~epochal.runtime.driver.handle.JobHandle`; ``result`` — the finished job's
  :class:`~epochal.runtime.driver.result.JobResult`;
* ``coordinator_server`` — the epoch coordinator's network side (one per attempt);
* ``savepoints``, ``requests`` — savepoints asked for by the handle or by another process;
* ``compatibility`` — a restore point checked against the dataflow before anything starts;
* ``regions`` — a job of several consistent regions (:mod:`epochal.regions`): one driver per
  region and the caller's :class:`~epochal.runtime.driver.regions.RegionsHandle`.

May import: the layers below the runtime (``epochs``, ``backends``, ``metrics``,
``state``, ...), :mod:`epochal.runtime.transport`, :mod:`epochal.runtime.task.attempt`
(the spec it ships to tasks; nothing else of ``task``) and :mod:`epochal.runtime.launch`
(only where ``start_job`` picks the launcher). Never pyspark directly.
"""
