"""The task side: code that runs in a task process (a Spark Python worker, or a process
forked by the local zygote), one per physical task.

* ``task`` — :class:`~epochal.runtime.task.task.Task`: its lifecycle and loop. The task
  thread alone touches operators, state and the source reader; helper threads only move
  bytes. ``steps`` (the loop's source and input steps) and ``barriers`` (snapshot and
  forward at a barrier) are the two halves of its loop, mixed into ``Task``;
* ``chain`` — records, watermarks, timers and side outputs through the task's operators;
* ``router`` — output batches to channels (forward, key groups, round-robin, broadcast);
* ``restore``, ``replay`` — the restored state of the task, and what it replays first;
* ``snapshots`` — the asynchronous part of a snapshot (the uploader) and the task state file;
* ``queries`` — the task's queryable state: committed versions pinned at barriers, its
  query server, live lookups through the mailbox (:mod:`epochal.query`);
* ``attempt`` — :class:`~epochal.runtime.task.attempt.AttemptSpec`, what the driver hands
  every task of an attempt (the only module of this package the driver imports).

May import: the layers below the runtime (``operators``, ``backends``, ``alignment``,
``loops``, ``time``, ...) and :mod:`epochal.runtime.transport`. Never ``driver`` or
``launch``, never pyspark.
"""
