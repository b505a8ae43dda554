"""Checkpointed feedback loops (seed 004 §3.4.4.4, Alg. 7, §4.1.3.1).

* :mod:`~epochal.loops.api` — ``Stream.iterate``: the loop head node plus feedback inputs
  (the only legal back-edges of a graph);
* :mod:`~epochal.loops.backedges` — cycle and back-edge detection on the physical graph
  (loop expansion: the feedback channels are the phantom channels from Loop Tail to Loop
  Head; without them the task graph must be a DAG);
* :mod:`~epochal.loops.log` — the in-transit log, bounded in memory, spilling to disk;
* :mod:`~epochal.loops.head` — the Loop Head protocol (Alg. 7) as pure bookkeeping used
  by the task loop, and the head's pass-through operator;
* :mod:`~epochal.loops.termination` — a FINAL epoch proves quiescence only if every
  head's log for it is empty.

The Loop Tail is the producer side of the feedback channels: the tail task's router
broadcasts every barrier on them, so each barrier it receives goes back to every head
subtask, and the head grants feedback channels unbounded credit so the tail never blocks
(a bounded cycle of credits would deadlock: head blocked sending into the loop while the
tail is blocked sending back).
"""
