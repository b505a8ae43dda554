"""How the coordinator ends an epoch, in the driver: aborted, or completed and committed.

A mixin of :class:`~epochal.runtime.driver.coordinator_server.CoordinatorServer` (the state
it reads and changes — the pure coordinator, the storage, the savepoint tracker, the epoch
history, the connections — is the server's own), called on the server's loop thread with
each :class:`~epochal.epochs.coordinator.Progress`:

* an aborted epoch is recorded, every task is told ``("abort", n)`` (alignment and loop
  logging released), its partial checkpoint is deleted; an aborted FINAL epoch is asked
  for again;
* a completed epoch is committed (seed 004 §4.1.3, the protocol's step 3 in
  :mod:`~epochal.runtime.driver.coordinator_server`): ``chk-n/_metadata`` is written after
  every state file — the checkpoint exists only once it does; a write that still fails
  after the storage's retries revokes the epoch instead — then every task is told
  ``("complete", n)`` (sinks publish), savepoints of ``n`` are copied and retention runs
  (it decides here and the deleter, :mod:`~epochal.runtime.driver.deleter`, deletes);
  the epoch's figures go to the history; a completed FINAL epoch decides how the attempt
  ends (another FINAL round while a loop is busy, the loop heads' release, or
  ``("finish",)``).

Never called for an epoch twice; retention (:meth:`EpochOutcomes._retain`) is idempotent.
"""
from __future__ import annotations

import collections
import time

from epochal.backends import retention
from epochal.epochs.coordinator import Progress
from epochal.epochs.pending import TriggerReason
from epochal.errors import CheckpointStorageError
from epochal.loops.termination import in_flight_at_cut

#: pause between FINAL epochs while a loop is still busy (at most the checkpoint interval)
FINAL_ROUND_PAUSE = 0.2


class EpochOutcomes:
    """Aborts and completions of epochs (see the module docstring)."""

    def _apply(self, progress) -> None:
        for aborted in progress.aborted:
            self.history.add_aborted({"epoch": aborted.epoch, "reason": aborted.reason.value, "detail": aborted.detail})
            self.log(f"epoch {aborted.epoch} aborted ({aborted.reason.value}): {aborted.detail}")
            self._broadcast(("abort", aborted.epoch))
            try:  # checked here (never a completed checkpoint), deleted by the deleter
                if self.storage.load_metadata(aborted.epoch) is None:
                    self.deleter.submit(retention.Deletions(((aborted.epoch, False),)))
                else:
                    self.log(f"refusing to delete aborted epoch {aborted.epoch}: it is a completed checkpoint")
            except Exception as exc:
                self.log(f"could not delete aborted checkpoint {aborted.epoch}: {exc}")
            final = aborted.trigger_reason is TriggerReason.FINAL
            if self.savepoints.on_abort(aborted.epoch, aborted.detail, final):  # a drain's: the sources stopped
                self._finish_attempt(False, f"stop-with-savepoint (drain): epoch {aborted.epoch} was aborted after "
                                            f"the sources ended event time ({aborted.detail}); the job restarts from "
                                            "its latest checkpoint")
                return
            if final:
                self.coordinator.request_final(time.monotonic())
        for completed in progress.completed:
            self._complete(completed)

    def _complete(self, completed) -> None:
        """Step 3 of the epoch commit: metadata last, then notify (seed 004 §4.1.3)."""
        tasks = {}
        for task_id, payload in completed.acks.items():
            spec = self.plan.task(task_id)
            tasks[task_id] = {"handle": dict(payload["handle"]), "chain": list(spec.chain),
                              "subtask": spec.subtask, "parallelism": spec.parallelism}
            if payload.get("shared"):  # incremental snapshot: files retention must keep
                tasks[task_id]["shared"] = [dict(h) for h in payload["shared"]]
        meta = {
            "epoch": completed.epoch,
            "job": self.plan.job,
            "generation": self.generation,
            "lineage": self.lineage.id if self.lineage is not None else "",
            "sink_mode": self.sink_mode,
            "reason": completed.reason.value,
            "plan": self.plan.fingerprint(),
            "max_parallelism": self.plan.max_parallelism,
            "tasks": tasks,
            "wall_time": time.time(),
        }
        # Step 1: the metadata makes the checkpoint complete — written after all state files.
        # A storage fault is retried (CheckpointConfig.storage_retry); if it still fails, the
        # epoch is declined after all and the job runs on (tolerable_failures decides).
        t_meta = time.monotonic()
        try:
            self.storage.write_metadata(completed.epoch, meta)
        except CheckpointStorageError as exc:
            self._apply(Progress(aborted=(self.coordinator.revoke(
                completed, f"the coordinator could not write the checkpoint's _metadata: {exc}", time.monotonic()),)))
            return
        metadata_s = time.monotonic() - t_meta
        self.latest_restore = {"epoch": completed.epoch, "tasks": meta["tasks"]}  # what a failover region restores
        # Step 2: commit phase — tasks (sinks) publish everything up to this epoch (and confirm
        # it when the job stops with a savepoint of this epoch).
        self._broadcast(("complete", completed.epoch, True) if completed.epoch == self.savepoints.stop_epoch
                        else ("complete", completed.epoch))
        # Step 3: savepoints of this epoch are copied (it stays pinned meanwhile), then retention.
        self.savepoints.on_complete(completed.epoch, meta)
        self._retain(f"epoch {completed.epoch}")
        metrics = [dict(p.get("metrics", {})) for p in completed.acks.values()]
        self.history.add_completed({
            "epoch": completed.epoch,
            "reason": completed.reason.value,
            "duration_s": completed.duration,
            "wall_time": meta["wall_time"],  # time.time() at completion: trigger ≈ wall_time - duration_s
            "bytes": sum(m.get("bytes", 0) for m in metrics),  # uploaded for this epoch
            "state_bytes": sum(m.get("state_bytes", m.get("bytes", 0)) for m in metrics),
            "max_alignment_s": max((m.get("alignment_s", 0.0) for m in metrics), default=0.0),
            "max_sync_s": max((m.get("sync_s", 0.0) for m in metrics), default=0.0),
            "max_upload_s": max((m.get("upload_s", 0.0) for m in metrics), default=0.0),
            "max_durable_s": max((m.get("durable_s", 0.0) for m in metrics), default=0.0),  # within upload_s
            "loop_logged": sum(m.get("loop_logged", 0) for m in metrics),
            # unaligned checkpoints: how the tasks snapshotted, what was in flight
            "snapshot_kinds": dict(collections.Counter(m.get("snapshot_kind", "aligned") for m in metrics)),
            "channel_state_records": sum(m.get("channel_state_records", 0) for m in metrics),
            "channel_state_watermarks": sum(m.get("channel_state_watermarks", 0) for m in metrics),
            "channel_state_bytes": sum(m.get("channel_state_bytes", 0) for m in metrics),
            "metadata_s": metadata_s,  # writing _metadata after the last ack (not in duration_s)
            "tasks": {task_id: _task_sample(payload, completed.trigger_time)
                      for task_id, payload in completed.acks.items()},
        })
        if completed.is_final:
            in_flight = in_flight_at_cut(completed.acks)
            if in_flight:  # a loop was still busy at the cut: go round again (epochal.loops.termination)
                self.coordinator.continue_final(time.monotonic(), FINAL_ROUND_PAUSE if self.config.interval is None
                                                else min(self.config.interval, FINAL_ROUND_PAUSE))
                self.final_rounds += 1
            elif self.loop_heads and self._releasing is None:
                self._releasing = set(self.loop_heads)
                for task in self.loop_heads:
                    self._send(task, ("release_end",))
            elif self.savepoints.busy:
                self._finish_held = True  # finish once the savepoints in progress are written
            else:
                self._broadcast(("finish",))

    def _retain(self, after: str) -> None:
        """Retention: keep the newest ``retained`` completed checkpoints, the epochs a
        savepoint is being copied from, and the shared files acknowledged to epochs still
        in flight. Runs after every completion and when a savepoint copy ends (its epoch is
        unpinned: without this pass, a checkpoint pinned while the job's last epoch completed
        would outlive the job). Decides here, on the loop thread (consistent with the
        acknowledgements: :func:`epochal.backends.retention.plan`), and hands the deletes to
        the background deleter (:mod:`epochal.runtime.driver.deleter`): the loop never waits
        for them. Idempotent; a failure is logged, and the next pass collects what this one
        left (nothing is lost)."""
        in_flight_files = {h["path"] for p in self.coordinator.pending for a in p.acks.values() if a
                           for h in a.get("shared", ())}
        try:
            deletions = retention.plan(self.storage, self.config.retained, protect=in_flight_files,
                                       pinned=self.savepoints.pinned, busy=self.deleter.busy_epochs)
        except CheckpointStorageError as exc:
            self.log(f"retention after {after} failed, retried at the next checkpoint: {exc}")
            return
        self.deleter.submit(deletions)


def _task_sample(payload, trigger_time: float) -> dict:
    """One task's share of a completed epoch (seconds): ``barrier_s`` trigger → the task's
    snapshot start (the barrier's travel through upstream tasks, including alignment; wall
    clocks of driver and task), ``alignment_s`` first → last barrier on the task's inputs,
    ``sync_s`` the synchronous snapshot part (sink pre-commits included), ``upload_wait_s``
    sync part done → upload started, ``upload_s`` the asynchronous part (serialise, write,
    fsync), of which ``durable_s`` the sinks' durability steps (their flush and fsync),
    ``ack_s`` trigger → its acknowledgement reached the coordinator; ``bytes`` uploaded for
    this epoch and ``state_bytes`` its whole snapshot (as the task reported them)."""
    m = payload.get("metrics", {})
    sample = {k: m.get(k) for k in ("barrier_s", "alignment_s", "sync_s", "upload_wait_s", "upload_s", "durable_s",
                                    "snapshot_kind", "channel_state_records", "bytes")}
    sample["state_bytes"] = m.get("state_bytes", m.get("bytes"))
    sample["ack_s"] = payload["acked_at"] - trigger_time if "acked_at" in payload else None
    return sample
