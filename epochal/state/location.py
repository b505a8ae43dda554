"""Open a completed checkpoint or a savepoint by URL, without running its job.

One URL names one checkpoint:

* a **savepoint** directory (it holds ``_savepoint``, see :mod:`epochal.state.savepoint`);
* a **checkpoint** directory ``<checkpoint.storage>/<job>/chk-<epoch>`` (it holds ``_metadata``);
* a **job** directory ``<checkpoint.storage>/<job>``: its newest completed checkpoint.

Every path inside a checkpoint is relative to the directory holding ``chk-<epoch>/`` (the
job root, or the savepoint itself), so the checkpoint is read through a
:class:`~epochal.backends.storage.CheckpointStorage` rooted there and every file is
verified (size and SHA-256) by the storage layer when read.

    >>> from epochal.backends.storage import CheckpointStorage
    >>> s = CheckpointStorage("memory://location-doc", "job")
    >>> s.write_metadata(3, {"epoch": 3, "tasks": {}, "plan": {}})
    >>> c = open_checkpoint("memory://location-doc/job")
    >>> c.kind, c.epoch
    ('checkpoint', 3)

Task state files are pickles; reading one unpickles it (records, sink transactions and
source offsets may be instances of your classes, which must be importable). Only read
checkpoints you trust, as you would only unpickle files you trust.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from epochal.backends import signing
from epochal.backends.storage import METADATA_FILE, CheckpointStorage, StateHandle, state_handles
from epochal.errors import CheckpointStorageError

__all__ = ["SAVEPOINT_FILE", "Checkpoint", "UntrustedCheckpoint", "open_checkpoint"]

SAVEPOINT_FILE = "_savepoint"
_CHK = re.compile(r"^chk-(\d+)$")


@dataclass
class Checkpoint:
    """A completed checkpoint (or savepoint), opened read-only.

    Attributes:
        url: the URL it was opened from.
        storage: the storage rooted where its paths are relative to.
        epoch: its epoch.
        meta: its ``_metadata`` (``tasks``, ``plan``, ``max_parallelism``, ``reason``, ...).
        savepoint: the ``_savepoint`` marker of a savepoint, else ``None``.
    """

    url: str
    storage: CheckpointStorage
    epoch: int
    meta: dict
    savepoint: dict | None = None
    _states: dict = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        """``"savepoint"`` or ``"checkpoint"``."""
        return "savepoint" if self.savepoint is not None else "checkpoint"

    @property
    def location(self) -> str:
        """URL of the directory holding ``_metadata``."""
        return self.storage.file_url(f"chk-{self.epoch:010d}")

    @property
    def tasks(self) -> dict:
        """``{task id: {"handle", "chain", "subtask", "parallelism", ["shared"]}}``."""
        return self.meta.get("tasks", {})

    @property
    def operators(self) -> dict:
        """``{operator: {"kind", "parallelism"}}`` of the job's plan when it was taken."""
        return self.meta.get("plan") or {}

    def tasks_of(self, operator: str) -> list[str]:
        """Ids of the tasks running ``operator``, by subtask."""
        return sorted((t for t, info in self.tasks.items() if operator in info["chain"]),
                      key=lambda t: self.tasks[t]["subtask"])

    def task_state(self, task: str) -> dict:
        """Task ``task``'s decoded state file (operators, source, keyed, loop, channels).

        Raises:
            CheckpointStorageError: the file is missing, corrupt (naming it), or holds
                objects of a class that cannot be imported here.
        """
        if task not in self._states:
            from epochal.runtime.task.snapshots import decode_task_state

            handle = StateHandle.from_dict(self.tasks[task]["handle"])
            blob = self.storage.read_state(handle)
            where = self.storage.file_url(handle.path)
            if handle.is_inline:
                chk = self.storage.file_url(f"chk-{self.epoch:010d}")
                where = f"inline state of task {task} in {chk}/{METADATA_FILE}"
            try:
                self._states[task] = decode_task_state(blob, f"state file {where}")
            except (ImportError, AttributeError) as exc:
                raise CheckpointStorageError(
                    f"state file {where} holds objects whose class cannot be loaded here ({type(exc).__name__}: "
                    f"{exc}); make the module that defines it importable (PYTHONPATH) to read it") from exc
            except Exception as exc:  # ValueError, UnpicklingError: not an epochal task state
                raise CheckpointStorageError(f"state file {where} is corrupt: {type(exc).__name__}: {exc}") from exc
        return self._states[task]

    def handles(self) -> list[StateHandle]:
        """Every file the checkpoint consists of: task state files, keyed-state files
        (incremental SST and forked snapshot files) and the segments of loop logs and
        channel state (named inside the task state files), sorted by path. A savepoint
        lists them in its marker; for a checkpoint the task state files are read."""
        if self.savepoint is not None:
            return sorted({StateHandle.from_dict(h) for h in self.savepoint["files"]}, key=lambda h: h.path)
        found = set(state_handles(self.meta))
        for task in self.tasks:
            st = self.task_state(task)
            nested = {"keyed": st.get("keyed") if isinstance(st.get("keyed"), dict) else None,
                      "loop": st.get("loop"), "channels": st.get("channels")}
            found.update(state_handles(nested))
        return sorted(found, key=lambda h: h.path)

    def verify(self, hash: bool = True) -> None:
        """Check every file of :meth:`handles` is present with its size (and, ``hash``,
        its SHA-256).

        Raises:
            CheckpointStorageError: naming the first missing or corrupt file's URL.
        """
        from epochal.backends.verification import check_file

        for h in self.handles():
            problem = check_file(self.storage, h, hash)
            if problem:
                raise CheckpointStorageError(f"{self.kind} {self.url}: file {self.storage.file_url(h.path)} is {problem}")


class UntrustedCheckpoint(CheckpointStorageError):
    """The ``_metadata`` read is not signed with the key the checkpoint was opened with
    (``why`` says how: not signed, another key, changed after signing)."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


def _metadata(storage: CheckpointStorage, epoch: int) -> dict:
    """``meta`` of epoch ``epoch``'s ``_metadata``, read once: with the storage's
    ``signing_key`` the very document read is verified before anything of it is used (no
    second read a swap could slip between)."""
    where = storage.file_url(f"chk-{epoch:010d}/{METADATA_FILE}")
    doc, why = storage.inspect_metadata(epoch)
    if doc is None:
        directory = storage.display(storage.epoch_dir(epoch))
        raise CheckpointStorageError(f"checkpoint {directory} is not complete: {directory}/{METADATA_FILE} is {why}")
    if storage.signing_key is not None:
        why = signing.verify(doc, storage.signing_key)
        if why:
            raise UntrustedCheckpoint(f"{where} is not trusted: {why} (checkpoint.signing_key)", why)
    meta = doc["meta"]
    if not isinstance(meta.get("tasks"), dict):
        raise CheckpointStorageError(f"{where} is corrupt: it lists no tasks")
    return meta


def open_checkpoint(url: str, storage_options=None, signing_key: bytes | None = None) -> Checkpoint:
    """Open the checkpoint or savepoint ``url`` names (see the module docstring). With
    ``signing_key`` its ``_metadata`` must be signed with it (:mod:`epochal.backends.signing`).

    Raises:
        UntrustedCheckpoint: ``signing_key`` is given and the ``_metadata`` is not signed
            with it.
        CheckpointStorageError: nothing restorable is there; the message names the file
            that is missing or not valid.
    """
    url = url.rstrip("/")
    root = CheckpointStorage.at_root(url, storage_options, signing_key=signing_key)
    marker = root.read_document(SAVEPOINT_FILE)
    if marker is not None:
        where = root.file_url(SAVEPOINT_FILE)
        if marker.get("format") != "epochal-savepoint" or not isinstance(marker.get("epoch"), int) \
                or not isinstance(marker.get("files"), list):
            raise CheckpointStorageError(f"{where} is corrupt: not an epochal savepoint marker")
        return Checkpoint(url, root, marker["epoch"], _metadata(root, marker["epoch"]), marker)
    m = _CHK.match(root.job)
    if m:
        parent = url.rsplit("/", 1)[0]
        storage = CheckpointStorage.at_root(parent, storage_options, signing_key=signing_key)
        return Checkpoint(url, storage, int(m.group(1)), _metadata(storage, int(m.group(1))))
    latest = root.latest_completed()
    if latest is None:
        raise CheckpointStorageError(
            f"no checkpoint at {root.root_url}: {root.file_url(SAVEPOINT_FILE)} is missing (not a savepoint), "
            f"and it holds no completed chk-*/{METADATA_FILE} (not a job's checkpoint directory)")
    return Checkpoint(url, root, latest[0], _metadata(root, latest[0]))
