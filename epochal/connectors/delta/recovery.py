"""The Delta sink's commit and recovery decisions, as pure functions (no table, no clock).

Delta tells a writer which epochs it already holds through **application transactions**:
every epoch commit of sink subtask ``s`` carries ``Transaction(app_id, version=epoch)`` with
:func:`app_id`, atomically with the epoch's files, and ``DeltaTable.transaction_version(app_id)``
reads the highest one back (seed 004 §4.1.3.1: recovery asks the external system, it never
trusts local memory). delta-rs neither refuses a repeated version nor a lower one (a lower
one even moves the version back), so every commit first asks :func:`decide`; two writers
racing on one app id are caught by delta-rs's conflict checker (``CommitFailedError``), and
the loser asks again.

The decisions:

* :func:`decide` — commit an epoch, or skip it because Delta holds it (idempotent commit).
* :func:`recovery_plan` — which restored pre-committed epochs to commit and which to skip.
* :func:`ahead_of_restore` — app ids whose committed version is beyond the restored epoch:
  the table holds epochs the restored checkpoint never completed (another run with the
  same app id, or a restore from an older savepoint). Committing would drop the restored
  lineage's epochs as "already committed", so the writer refuses instead.
* :func:`orphans` — staged files of rolled-back epochs to delete after a restore.

**Why orphans are decided by name.** A staged file's name carries its epoch (see
:func:`staged_name`). Epoch ``e`` is committed only after checkpoint ``e`` completed, and a
restore resumes from the latest completed checkpoint ``m``; so, with every app id at or
below ``m`` (:func:`ahead_of_restore` empty), no file of an epoch ``> m`` is referenced by
any version of the table. Files of epochs ``<= m`` are never deleted: one of them may be
committed and later removed by a compaction, still referenced by older versions (time
travel). The rare leftovers of that kind (a zombie's late file) are unreferenced, so
``DeltaTable.vacuum()`` removes them after the retention period.
"""
from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass


class Decision(enum.Enum):
    """What :meth:`~epochal.connectors.delta.sink.DeltaSinkWriter.commit` does with an epoch."""

    COMMIT = "commit"
    ALREADY_COMMITTED = "already committed"  # Delta holds this epoch (or a later one) of the app id


def app_id(prefix: str, subtask: int) -> str:
    """The Delta application id of sink subtask ``subtask``; its version is the epoch."""
    return f"{prefix}-{subtask}"


def name_tag(prefix: str) -> str:
    """8 hex digits naming the staged files of one app id prefix (one sink of one run)."""
    return hashlib.sha256(prefix.encode()).hexdigest()[:8]


def staged_name(tag: str, subtask: int, epoch: int | None, generation: int, token: str, seq: int) -> str:
    """A data file's name: ``part-{tag}-s{subtask}-e{epoch}-g{generation}-{token}-{seq}.parquet``.

    ``epoch`` None (at-least-once: files are committed at barriers, so the epoch rule of
    :func:`orphans` does not apply) writes ``-d-`` in its place. ``token`` is random per
    writer: a file name is never reused, whatever runs wrote the table before.
    """
    middle = "d" if epoch is None else f"e{epoch:010d}"
    return f"part-{tag}-s{subtask:04d}-{middle}-g{generation:06d}-{token}-{seq:05d}.parquet"


_NAME = re.compile(r"^part-(?P<tag>[0-9a-f]{8})-s(?P<subtask>\d{4,})-(?:e(?P<epoch>\d{10,})|d)-g\d{6,}-"
                   r"[0-9a-z]+-\d{5,}\.parquet$")


@dataclass(frozen=True)
class StagedName:
    tag: str
    subtask: int
    epoch: int | None


def parse_name(name: str) -> StagedName | None:
    """The parts of a :func:`staged_name`, None for any other file name."""
    m = _NAME.match(name)
    if m is None:
        return None
    epoch = m.group("epoch")
    return StagedName(m.group("tag"), int(m.group("subtask")), None if epoch is None else int(epoch))


def decide(epoch: int, committed: int | None) -> Decision:
    """Commit ``epoch`` unless the app id's committed version ``committed`` (None: none) is
    at or above it: versions grow with epochs, so a version ``>= epoch`` means Delta holds it."""
    return Decision.COMMIT if committed is None or epoch > committed else Decision.ALREADY_COMMITTED


def recovery_plan(pending: Sequence[tuple[int, str]], versions: Mapping[str, int | None]
                  ) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """Split restored pre-committed epochs ``(epoch, app id)`` into (to commit, to skip),
    each in epoch order. ``versions``: app id → ``transaction_version`` (absent or None: none)."""
    commit, skip = [], []
    for epoch, app in sorted(pending):
        (commit if decide(epoch, versions.get(app)) is Decision.COMMIT else skip).append((epoch, app))
    return commit, skip


def ahead_of_restore(versions: Mapping[str, int | None], restored_epoch: int) -> dict[str, int]:
    """App ids whose committed version exceeds ``restored_epoch`` (see the module docstring)."""
    return {app: v for app, v in versions.items() if v is not None and v > restored_epoch}


def owns(subtask: int, parallelism: int, writer: int) -> bool:
    """Whether writer subtask ``writer`` cleans up after subtask ``subtask``: its own files,
    and after a rescale those of old subtasks ``j >= parallelism`` with ``j % parallelism ==
    writer`` (whose pending transactions it took over)."""
    return subtask == writer or (subtask >= parallelism and subtask % parallelism == writer)


def orphans(paths: Iterable[str], tag: str, writer: int, parallelism: int, restored_epoch: int,
            keep: Callable[[str], bool] = lambda path: False) -> list[str]:
    """The staged files among ``paths`` (relative paths) to delete after restoring epoch
    ``restored_epoch``: this tag's files of an epoch after it, of a subtask ``writer`` owns,
    that ``keep`` does not protect (files of restored pending transactions, files the
    table references). Callers must have checked :func:`ahead_of_restore` first."""
    out = []
    for path in paths:
        name = parse_name(path.rsplit("/", 1)[-1])
        if (name is not None and name.tag == tag and name.epoch is not None and name.epoch > restored_epoch
                and owns(name.subtask, parallelism, writer) and not keep(path)):
            out.append(path)
    return out
