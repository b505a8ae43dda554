"""Runtime: where a dataflow runs, in four rooms named for where their code runs.

==============  ======================================================  ===================
package         what runs there                                         may import (runtime)
==============  ======================================================  ===================
``driver/``     the driver process: the restart loop and the job handle  ``transport``,
                (``attempts``), starting a job (``job``), the            ``task.attempt``,
                coordinator's network side, savepoints, requests from    ``launch`` (chosen
                other processes, restore compatibility checks            at start)
``task/``       a task process: the task loop (one thread owns           ``transport``
                operators and state), its input and barrier steps,
                the operator chain, the router, restore and replay,
                the snapshot uploader; ``attempt`` is what the driver
                hands every task
``transport/``  both sides: framed, authenticated connections (wire),    nothing
                TLS, credit-based data channels
``launch/``     how task processes start: the Spark launcher (the only   ``task``,
                code that imports pyspark), the local zygote launcher,   ``transport``
                the task process entry point (worker), cluster checks,
                Java
==============  ======================================================  ===================

The driver/task boundary is the system's most important one: only the driver side touches
Spark (through ``launch``), only task processes hold operator state. The driver hands a
task nothing but an :class:`~epochal.runtime.task.attempt.AttemptSpec` (and the pickled
plan in it); afterwards they talk over ``transport`` only. ``task`` never imports
``driver`` or ``launch``; ``driver`` imports ``launch`` inside ``start_job`` only, and of
``task`` only ``task.attempt``. ``tests/test_architecture.py`` checks the import graph.
"""
