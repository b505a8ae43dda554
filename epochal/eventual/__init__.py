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
* :mod:`~epochal.eventual.runner` — internal: one attempt of the operator's task-thread loop
  (recover, replay after T, foreground, background, flush, truncate) over a
  :class:`~epochal.eventual.runner.ReplayableSource`; the seam for the engine integration.

How it will plug into the engine (not built yet):

* an option of windowed aggregations,
  ``keyed.window(...).aggregate(..., checkpoints=ep.Eventual(budget=0.05, max_extent="30s"))``,
  built into a record-path operator that owns an :class:`~epochal.eventual.log.OutputLog` under
  the job's checkpoint storage (``<checkpoint root>/<job>/eventual/<operator>/<subtask>/``,
  fingerprinted with ``CheckpointConfig.signing_key``) and runs this module's loop on the task
  thread; columnar aggregations refuse it at build time, naming the record-path equivalent;
* the operator registers itself with ``streams.register_builder`` (the core never imports
  this package), and it takes no part in epoch snapshots: its epoch state is empty, and on
  restore it rebuilds from its log instead;
* replayable sources that can seek to an event-time position (files, Kafka by offsets for a
  timestamp, the transactional log); a source that cannot is refused at build time, naming
  why. Positions are ``(timestamp, sequence number)``: the source must replay the same tuples
  with the same sequence numbers (e.g. partition offsets), or ties of timestamps would be
  ambiguous;
* downstream operators and sinks read the persisted queue with
  :meth:`~epochal.eventual.log.OutputLog.results` (control records skipped), remember how far
  they read, and bound :meth:`~epochal.eventual.log.OutputLog.truncate_behind` by it; a sink
  commits what it read by position, so a replay after its own crash re-reads from there;
* metrics: the extent (records, T's lag), footprints per second, overdrafts; the dashboard and
  ``benchmarks/eventual.py`` (CEC against aligned and unaligned epoch snapshots).

Not built yet: all of the above integration (nothing of the engine imports this package, and
it is not exported from ``epochal``); count windows; out-of-order input (sessions merging,
windows fired by watermarks rather than by the tuples themselves); compaction of
small segments (one per flush — a low output rate means many small segments, the seed's
"degree of grouping"); S3 (fsspec-ready, untested).
"""
