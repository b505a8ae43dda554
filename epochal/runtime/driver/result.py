"""What a finished job did (:class:`JobResult`): attempts, failures survived, epochs,
per-task metrics, savepoints. Driver side; a plain value.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class JobResult:
    """What a finished job did: attempts, failures survived, epochs, per-task metrics.

    ``completed_epochs`` (of the final attempt; the newest ``CheckpointConfig.history`` of
    them, ``checkpoints`` summarises all): per epoch ``duration_s`` (trigger → last
    acknowledgement), ``metadata_s`` (writing ``_metadata`` afterwards), ``bytes`` /
    ``state_bytes``, the maxima over tasks ``max_alignment_s`` / ``max_sync_s`` /
    ``max_upload_s``, and ``tasks``: each task's ``barrier_s``, ``alignment_s``, ``sync_s``,
    ``upload_wait_s``, ``upload_s`` and ``ack_s`` (see :func:`epochal.runtime.driver.completion._task_sample`).

    ``attempt_timeline``: one entry per attempt, times in seconds since the job started
    (driver clock): ``started_s`` (the driver began the attempt: restore point chosen and
    verified next), ``launched_s`` (tasks launched), ``connected_s`` (all tasks connected),
    ``running_s`` (all tasks restored their state and run), ``failed_s`` (the coordinator
    saw the failure; ``None`` for the successful attempt), ``stopped_s`` (every task of the
    attempt is gone), plus ``generation``, ``restored_epoch``, ``restored_bytes`` (state
    files the restore point references), ``cause`` and per task ``setup_s`` /
    ``restore_s``. The time from a failure to the next attempt running again is
    ``timeline[i + 1]["running_s"] - timeline[i]["failed_s"]``.
    """

    job: str
    guarantee: str
    runtime: str
    attempts: int
    failures: list[str]
    completed_epochs: list[dict]
    aborted_epochs: list[dict]
    task_metrics: dict
    duration_s: float
    checkpoint_root: str
    restored_from: list = field(default_factory=list)
    attempt_timeline: list = field(default_factory=list)
    #: connections were TLS-encrypted (ChannelConfig.encryption, resolved for the runtime)
    encrypted: bool = False
    #: every savepoint written while the job ran: ``epoch``, ``url``, ``bytes``, ``copy_s``,
    #: ``wall_time``, ``stop``
    savepoints: list = field(default_factory=list)
    #: the savepoint's URL when the job ended by :meth:`JobHandle.stop_with_savepoint`
    #: (every sink transaction up to its epoch committed, none after), else ``None``
    stopped_with_savepoint: str | None = None
    #: the checkpoint or savepoint the job started from (``restore_from``), else ``None``
    restored_from_url: str | None = None
    #: every epoch of the final attempt, including those beyond ``completed_epochs``' window:
    #: ``completed``, ``aborted`` (counts), ``duration_s`` and ``bytes`` (count, sum, mean,
    #: min, max, p50, p99 within 1 %; epochal.epochs.history)
    checkpoints: dict = field(default_factory=dict)
    #: the run's lineage id (epochal.epochs.lineage): new for every run, kept by its restarts
    lineage: str = ""
    #: a job of several regions (epochal.regions): each region's own result, by region name;
    #: empty for a job of one region
    regions: dict = field(default_factory=dict)
    #: failover regions of the last attempt that restarted alone while the other tasks ran
    #: on (:mod:`epochal.runtime.driver.failover`): ``region``, ``tasks``, ``generation``,
    #: ``cause``, ``restored_epoch``, ``down_s`` (failure → its tasks connected again and told
    #: what to restore), ``running_s`` (failure → every one of them restored and running),
    #: ``pending_epochs`` (triggered again for them)
    failovers: list = field(default_factory=list)

    @property
    def late_dropped(self) -> int:
        """Rows or records the final attempt's windows dropped as late (not sent to ``.late()``
        outputs), summed over its tasks."""
        return sum(m.get("late_dropped", 0) for m in self.task_metrics.values())

    @property
    def records_in(self) -> int:
        """Records read by the sources in the final (successful) attempt."""
        return sum(m["records_in"] for t, m in self.task_metrics.items() if m.get("source"))
