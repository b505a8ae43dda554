"""Continuous eventual checkpoints (CEC, seed 003): a windowed operator checkpoints each open
window on its own schedule, as control records in its own persisted output queue — no
barrier, no pause, no copy-on-write, one storage for output and state.

The pieces (pure protocol, scripted calls in, records out — like :mod:`epochal.alignment`):

* :mod:`~epochal.eventual.records` — ``R``, ``Gopen``, ``Gcheck`` with ``t`` and ``N``; frames
  with a fingerprint (HMAC under the job's signing key) so torn writes are discarded
  ("Constructing an EC");
* :mod:`~epochal.eventual.log` — the output queue on fsspec: immutable segments in timestamp
  order, read backwards a segment (≈ 256 KiB) at a time, truncated behind the extent;
* :mod:`~epochal.eventual.operator_state` — the foreground path (open → Gopen, close → R) and
  the background path (Gchecks) over keyed tumbling, sliding and session windows (§III: τ1,
  τ2, the ordering by τ2);
* :mod:`~epochal.eventual.extent` — which windows to Gcheck: oldest footprint first, within a
  budget of time, and any window lagging by ``max_extent`` at once ("Controlling the extent");
* :mod:`~epochal.eventual.recovery` — the EC from the log (N footprints, closed windows skipped,
  ``T = min t_i``) and the per-window replay filter ("Extent of an EC");
* :mod:`~epochal.eventual.runner` — one attempt of the operator's task-thread loop (recover,
  replay after T, foreground, background, flush, truncate) over a
  :class:`~epochal.eventual.runner.ReplayableSource`: the protocol tests' driver.

In the engine (docs/eventual.md, "In a job"):

* :mod:`~epochal.eventual.pipeline` — ``ep.Eventual`` and the builder of
  ``keyed.window(...).aggregate(..., checkpoints=ep.Eventual(budget=0.05, max_extent="30s"))``,
  registered with ``streams.register_builder`` (the core never imports this package; only
  ``epochal.dataflow`` imports it to register it, and ``epochal`` exports ``Eventual``); it
  refuses at build time what cannot have eventual checkpoints, naming the operator (a source
  that cannot replay from an event-time position: naming the source; Arrow batches: naming the
  record path);
* :mod:`~epochal.eventual.source` — the operator and its seekable input as one *source* of the
  job: its epoch state is a position in its output queue under the job's checkpoint storage
  (``<storage>/<job>/eventual/<operator>/<split>/``), never window state; downstream regions
  read the durable results by position and commit per epoch, so the committed output is
  exactly-once.

* :mod:`~epochal.eventual.chain` — the ``map`` / ``filter`` / ``flat_map`` between the source
  and ``key_by``, taken into the operator and replayed with its input after T.

Rescaling: ``Eventual(splits=)`` fixes the logs (one per split), the parallelism is free; a
restore at another parallelism moves whole logs between subtasks (docs/eventual.md,
"Rescaling").

Not built yet: sources that seek by event time without reading from the start (Kafka by
offsets for a timestamp, the transactional log); changing the split count of existing logs;
count windows; out-of-order input; compaction of small segments.
"""
