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
  the parent lineage committed epochs after the checkpoint this run restored (a rollback
  to an older savepoint). Those epochs are produced again by the new lineage (as Flink
  does); the writer says so in its first log line.
* :func:`orphans` — staged files of rolled-back epochs to delete after a restore.

**Lineages** (:mod:`epochal.epochs.lineage`). Every app id names the run that commits
under it: ``<prefix>-<lineage>-<subtask>`` (:func:`app_id`; ``<prefix>-<subtask>`` for the
legacy lineage ""). A restored handle carries the app id of the run that wrote it, so
"does Delta hold epoch e?" is asked only of records of that run: a rerun from fresh
checkpoint storage starts new app ids and inherits no answer, and a branch restored from
an older savepoint commits its new epochs under its own app ids (the parent's later epochs
stay in the table; the writer logs which). Staged files are named by a tag of the app id
prefix *with* the lineage (:func:`name_tag`), so cleanup only ever touches files of this run
and of the run it restored.

**Why orphans are decided by name.** A staged file's name carries its epoch (see
:func:`staged_name`). Epoch ``e`` of an app id is committed only after checkpoint ``e``
completed and in epoch order, so no file of an epoch above ``max(m, committed)`` — ``m``
the restored epoch, ``committed`` the app id's ``transaction_version`` — is referenced by
any version of the table (:func:`orphans` takes ``committed`` per subtask). Files of
earlier epochs are never deleted: one of them may be committed and later removed by a
compaction, still referenced by older versions (time travel). The rare leftovers of that
kind (a zombie's late file) are unreferenced, so ``DeltaTable.vacuum()`` removes them after
the retention period.
"""
from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from epochal.epochs.lineage import LEGACY, LINEAGE_ID


class Decision(enum.Enum):
    """What :meth:`~epochal.connectors.delta.sink.DeltaSinkWriter.commit` does with an epoch."""

    COMMIT = "commit"
    ALREADY_COMMITTED = "already committed"  # Delta holds this epoch (or a later one) of the app id


def app_id(prefix: str, subtask: int, lineage: str = "") -> str:
    """The Delta application id of sink subtask ``subtask`` in ``lineage`` (""
    names the app ids of versions before lineages); its version is the epoch."""
    return f"{prefix}-{lineage}-{subtask}" if lineage else f"{prefix}-{subtask}"


def parse_app_id(prefix: str, app: str) -> tuple[str, int] | None:
    """``(lineage, subtask)`` of an :func:`app_id` of ``prefix`` (lineage "" for app ids of
    versions before lineages), None for an app id of another prefix."""
    if not app.startswith(prefix + "-"):
        return None
    rest = app[len(prefix) + 1:]
    if rest.isdigit():
        return LEGACY, int(rest)
    lineage, _, subtask = rest.partition("-")
    return (lineage, int(subtask)) if LINEAGE_ID.match(lineage) and subtask.isdigit() else None


def name_tag(prefix: str, lineage: str = "") -> str:
    """8 hex digits naming the staged files of one app id prefix in one lineage (one sink of
    one run)."""
    return hashlib.sha256((f"{prefix}-{lineage}" if lineage else prefix).encode()).hexdigest()[:8]


def staged_name(tag: str, subtask: int, epoch: int | None, generation: int, token: str, seq: int) -> str:
    """A data file's name: ``part-{tag}-s{subtask}-e{epoch}-g{generation}-{token}-{seq}.parquet``.

    ``epoch`` None (at-least-once: files are committed at barriers, so the epoch rule of
    :func:`orphans` does not apply) writes ``-d-`` in its place. ``token`` is random per
    writer: a file name is never reused, whatever runs wrote the table before.
    """
    middle = "d" if epoch is None else f"e{epoch:010d}"
    return f"part-{tag}-s{subtask:04d}-{middle}-g{generation:06d}-{token}-{seq:05d}.parquet"


_NAME = re.compile(r"^part-(?P<tag>[0-9a-f]{8})-s(?P<subtask>\d{4,})-(?:e(?P<epoch>\d{10,})|d)-g(?P<gen>\d{6,})-"
                   r"[0-9a-z]+-\d{5,}\.parquet$")


@dataclass(frozen=True)
class StagedName:
    tag: str
    subtask: int
    epoch: int | None
    generation: int = 0


def parse_name(name: str) -> StagedName | None:
    """The parts of a :func:`staged_name`, None for any other file name."""
    m = _NAME.match(name)
    if m is None:
        return None
    epoch = m.group("epoch")
    return StagedName(m.group("tag"), int(m.group("subtask")), None if epoch is None else int(epoch),
                      int(m.group("gen")))


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


def reproduced(parent_committed: int | None, restored_epoch: int) -> range:
    """The epochs a branch produces again: those after its fork point ``restored_epoch`` that
    the parent lineage committed up to ``parent_committed`` (empty: nothing is re-produced)."""
    return range(restored_epoch + 1, (parent_committed or 0) + 1)


def owns(subtask: int, parallelism: int, writer: int) -> bool:
    """Whether writer subtask ``writer`` cleans up after subtask ``subtask``: its own files,
    and after a rescale those of old subtasks ``j >= parallelism`` with ``j % parallelism ==
    writer`` (whose pending transactions it took over)."""
    return subtask == writer or (subtask >= parallelism and subtask % parallelism == writer)


def orphans(paths: Iterable[str], tag: str, writer: int, parallelism: int, restored_epoch: int,
            keep: Callable[[str], bool] = lambda path: False,
            committed: Mapping[int, int | None] | None = None) -> list[str]:
    """The staged files among ``paths`` (relative paths) to delete after restoring epoch
    ``restored_epoch``: this tag's files of an epoch after it, of a subtask ``writer`` owns
    (``writer`` None: of every subtask), that ``keep`` does not protect (files of restored
    pending transactions, files the table references). ``committed``: subtask → the epoch
    its app id of the tag's lineage committed last (absent or None: none); files of epochs
    up to it are kept (a rollback's parent committed them)."""
    committed = committed or {}
    out = []
    for path in paths:
        name = parse_name(path.rsplit("/", 1)[-1])
        if (name is not None and name.tag == tag and name.epoch is not None
                and name.epoch > max(restored_epoch, committed.get(name.subtask) or 0)
                and (writer is None or owns(name.subtask, parallelism, writer)) and not keep(path)):
            out.append(path)
    return out
