"""Staged data files the table sinks' runs left behind, found and ended for
``epochal sinks lingering`` (issue 36; :mod:`epochal.sinks.lingering`).

A Delta or Iceberg sink writes each epoch's rows into parquet files in the table's location
before the epoch's checkpoint completes (pre-commit) and references them in a table commit
after it (commit). A run that ends between the two — cancelled, killed, abandoned without a
resume — leaves files that no table version references: no lock and no reader is held, but
the bytes stay until a resume's recovery (``cleanup_orphans``, for the run it restores) or a
vacuum removes them. This module finds them for every run of a job's sink that the job's
checkpoints or the table still name, without running the job.

A staged file's name says whose it is (:func:`~epochal.connectors.delta.recovery.staged_name`):
the tag of (app id prefix, lineage), the subtask and the epoch. Such a file is

* **lingering** when its app id (``<prefix>-<lineage>-<subtask>``) committed no epoch at or
  above the file's epoch — epochs are committed in order and only after their checkpoint
  completed, so no version of the table references it (the epoch rule of
  :func:`~epochal.connectors.delta.recovery.orphans`) — and the current version does not
  reference it either (checked all the same);
* **promised** when, in addition, the job's latest completed checkpoint holds a pending
  transaction of that app id and epoch (or names the file): a resume commits it, so it is
  listed but never deleted (seed 004 §4.1.3.1).

Files of at-least-once runs (no epoch in the name) and of epochs an app id committed are not
reported: a committed file may have been removed by a compaction and still be referenced by
an older version (time travel); ``DeltaTable.vacuum()`` or Iceberg's orphan-file removal
decides those by retention. Runs that neither completed a checkpoint still retained nor
committed anything to the table are named nowhere, so their files are not attributed to the
job (they are unreferenced: the same vacuum removes them).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from epochal.connectors.delta.recovery import name_tag, parse_app_id, parse_name
from epochal.sinks.lingering import Lingering


@dataclass(frozen=True)
class Promises:
    """What a completed checkpoint's pending handles promise, file by file: the staged
    ``paths`` they name and the ``(lineage, subtask, epoch)`` of each."""

    paths: frozenset[str]
    epochs: frozenset[tuple[str, int, int]]

    @classmethod
    def of(cls, prefix: str, handles: Iterable, paths: Callable[[object], Iterable[str]]) -> Promises:
        """From the pending transaction handles of a checkpoint (those with an app id of
        ``prefix``; at-least-once handles promise nothing). ``paths(handle)``: its files."""
        names, epochs = set(), set()
        for handle in handles:
            app = getattr(handle, "app_id", None)
            parsed = parse_app_id(prefix, app) if isinstance(app, str) else None
            if parsed is None:
                continue
            epochs.add((parsed[0], parsed[1], int(handle.epoch)))
            names.update(paths(handle))
        return cls(frozenset(names), frozenset(epochs))

    def holds(self, path: str, lineage: str, subtask: int, epoch: int) -> bool:
        return path in self.paths or (lineage, subtask, epoch) in self.epochs


def lineages_named(prefix: str, apps: Iterable[str]) -> set[str]:
    """The lineages in app ids of ``prefix`` (other app ids are ignored)."""
    out = set()
    for app in apps:
        parsed = parse_app_id(prefix, app)
        if parsed is not None:
            out.add(parsed[0])
    return out


def staged_by(prefix: str, lineages: Iterable[str]) -> dict[str, str]:
    """Name tag → lineage, for the staged files of ``prefix`` in each of ``lineages``."""
    return {name_tag(prefix, lineage): lineage for lineage in lineages}


def lingering(sink: str, system: str, listed: Iterable[str], tags: Mapping[str, str],
              committed: Callable[[str, set[int]], Mapping[int, int | None]], referenced: Callable[[str], bool],
              promises: Promises) -> list[Lingering]:
    """The staged files among ``listed`` (relative paths) that no table version references,
    each a :class:`~epochal.sinks.lingering.Lingering` (``what``: the path), marked promised
    by ``promises``. ``tags``: name tag → lineage of the runs to look at (other files are
    someone else's); ``committed(lineage, subtasks)``: subtask → the epoch its app id in
    ``lineage`` committed last (None: none); ``referenced(path)``: the current version
    references the file."""
    mine: dict[str, list[tuple[str, int, int]]] = {}
    for path in listed:
        name = parse_name(path.rsplit("/", 1)[-1])
        if name is None or name.epoch is None or name.tag not in tags:
            continue
        mine.setdefault(tags[name.tag], []).append((path, name.subtask, name.epoch))
    found = []
    for lineage, files in sorted(mine.items()):
        done = committed(lineage, {subtask for _, subtask, _ in files})
        for path, subtask, epoch in sorted(files, key=lambda f: (f[1], f[2], f[0])):
            if epoch <= (done.get(subtask) or 0) or referenced(path):
                continue
            promised = promises.holds(path, lineage, subtask, epoch)
            found.append(Lingering(sink, system, path, promised,
                                   f"staged data file of subtask {subtask} epoch {epoch} (lineage "
                                   f"{lineage or '(legacy)'}), never committed"))
    return found
