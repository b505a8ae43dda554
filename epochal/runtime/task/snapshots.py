"""The asynchronous part of a task snapshot (seed 004 §4.5.1, seed 001).

At the barrier the task thread takes the *synchronous* part only — operator and source
state (small), sinks sealing their transactions, and the keyed backend's copy-on-write
freeze — and hands a :class:`PendingUpload` to this uploader. The uploader, while the task
thread keeps processing records:

1. runs the operators' ``before_ack`` jobs (:class:`~epochal.operators.base.SnapshotResult`:
   a two-phase-commit sink flushes, fsyncs and closes the sealed transaction's files);
2. serialises the keyed state and writes the task's state file to checkpoint storage — or,
   when it is at most ``inline_state`` bytes (``CheckpointConfig.inline_state``), hands it
   over inline with the ack, for the coordinator to put into the epoch's ``_metadata``
   (:meth:`~epochal.backends.storage.CheckpointStorage.inline_state`): the file's write,
   fsync, rename and directory fsync leave every epoch's critical path;
3. only then acknowledges the epoch to the coordinator.

A failure in step 1 or 2 declines the epoch (the task keeps running); a process crash
leaves the epoch unacknowledged. Either way the epoch never completes.
"""
from __future__ import annotations

import pickle
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from epochal import serde

STATE_FORMAT = 1


@dataclass
class PendingUpload:
    epoch: int
    operators: dict
    source: Any
    keyed_job: Any  # backend SnapshotJob or None
    metrics: dict = field(default_factory=dict)
    loop_log: Any = None  # loop heads: the epoch's InTransitLog (epochal.loops.log)
    channel_state: dict = field(default_factory=dict)  # unaligned: input channel id -> InTransitLog
    created: float = field(default_factory=time.monotonic)  # for the ack's "upload_wait_s"
    before_ack: list = field(default_factory=list)  # [(operator, job)]: SnapshotResult.before_ack


def state_file_name(task_id: str) -> str:
    """``"count[1]"`` → ``"count-1.state"`` (storage names avoid brackets)."""
    return task_id.replace("[", "-").replace("]", "") + ".state"


def encode_task_state(operators: dict, source, keyed: bytes | None, loop: dict | None = None,
                      channels: list | None = None) -> bytes:
    """The task state file: operator states, source offsets, keyed state (or its
    descriptor), a loop head's in-transit log and the channel state of an unaligned
    snapshot (``[{"channel": id, **log descriptor}]``)."""
    return serde.dumps({"format": STATE_FORMAT, "operators": operators, "source": source, "keyed": keyed,
                        "loop": loop, "channels": channels or []})


def decode_task_state(blob: bytes, where: str) -> dict:
    state = pickle.loads(blob)
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"{where}: not an epochal task state (format {state.get('format') if isinstance(state, dict) else '?'})")
    return state


class Uploader:
    """One background thread per task; uploads in submission (= epoch) order, so the
    task's acknowledgements reach the coordinator in epoch order, and the ``before_ack``
    jobs of one operator run one at a time, in epoch order.

    :meth:`close` ends the thread after the upload in progress: queued uploads belong to an
    attempt that is over (a clean finish leaves none) and are dropped, so a reused worker
    process does not touch the files of a finished attempt after the next one started.
    """

    def __init__(self, task_id: str, storage, send: Callable[[tuple], None], faults, inline_state: int = 0):
        self.task_id = task_id
        self.inline_state = inline_state
        self.storage = storage
        self.send = send
        self.faults = faults
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"epochal-upload-{task_id}", daemon=True)
        self._thread.start()
        self.failed: BaseException | None = None
        self._closed = False

    def submit(self, upload: PendingUpload) -> None:
        self._queue.put(upload)

    def close(self) -> None:
        self._closed = True
        self.storage.stop_retrying()  # an upload waiting out a storage fault gives up: the attempt is over
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            upload = self._queue.get()
            if upload is None:
                return
            if self._closed:
                self._release(upload)
                continue
            t0 = time.monotonic()
            stage = "snapshot upload"
            try:
                durable_s = 0.0
                for operator, job in upload.before_ack:  # Step 1
                    stage = f"asynchronous snapshot part of operator {operator!r}"
                    self.faults.on_before_ack(operator, upload.epoch)
                    job()
                durable_s = time.monotonic() - t0
                stage = "snapshot upload"
                keyed = None
                if upload.keyed_job is not None:  # an incremental job uploads its files here
                    keyed = upload.keyed_job.run(self.storage, state_file_name(self.task_id)[:-len(".state")])
                loop = None
                base = state_file_name(self.task_id)
                if upload.loop_log is not None:
                    loop = upload.loop_log.persist(self.storage, upload.epoch, base)
                channels = [dict(log.persist(self.storage, upload.epoch, f"{base}.ch{k}"), channel=cid)
                            for k, (cid, log) in enumerate(sorted(upload.channel_state.items()))]
                blob = encode_task_state(upload.operators, upload.source, keyed, loop, channels)
                self.faults.on_upload(upload.epoch)
                if len(blob) <= self.inline_state:
                    handle = self.storage.inline_state(blob)
                else:
                    handle = self.storage.write_state(upload.epoch, state_file_name(self.task_id), blob)
            except Exception as exc:  # storage errors decline the epoch; the task keeps running
                self._release(upload)
                reason = f"{type(exc).__name__}: {exc}"
                try:
                    self.send(("decline", upload.epoch, self.task_id, f"task {self.task_id}: {stage} failed: {reason}"))
                except Exception:
                    self.failed = exc
                    return
                continue
            self._close_logs(upload)
            # bytes: uploaded for this epoch; state_bytes: everything the checkpoint references
            shared, uploaded, total = [], handle.size, handle.size
            if isinstance(keyed, dict):
                shared = [h for _name, h in keyed["files"]]
                uploaded += keyed["uploaded_bytes"]
                total += keyed["state_bytes"]
            # upload_wait_s: snapshot taken → upload started (earlier uploads, a loop head's
            # wait for its barrier to come round, the GIL); upload_s: the upload itself
            metrics = dict(upload.metrics, upload_s=time.monotonic() - t0, upload_wait_s=t0 - upload.created,
                           durable_s=durable_s, bytes=uploaded, state_bytes=total,
                           channel_state_bytes=sum(c.get("bytes", 0) for c in channels))
            try:
                self.send(("ack", upload.epoch, {"task": self.task_id, "handle": handle.to_dict(), "metrics": metrics,
                                                 "shared": shared}))
            except Exception as exc:
                self.failed = exc
                return

    @staticmethod
    def _close_logs(upload: PendingUpload) -> None:
        if upload.loop_log is not None:
            upload.loop_log.close()
        for log in upload.channel_state.values():
            log.close()

    @classmethod
    def _release(cls, upload: PendingUpload) -> None:
        if upload.keyed_job is not None:
            upload.keyed_job.release()
        cls._close_logs(upload)
