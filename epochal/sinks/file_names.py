"""FileSink part-file names, the runs (lineages) a sink directory has seen, and which
committed files a rollback abandons (issue 46) — pure, except the two small readers and
writers of the lineage records at the end.

Names. Every part file names the job and sink (``tag``: 8 hex digits of a hash of both), the
epoch, the subtask, the **lineage** of the run that began its transaction
(:mod:`epochal.epochs.lineage`) and a sequence number:

============  ==========================================================================
exactly-once  ``part-<tag>-e<epoch:010>-s<subtask:04>-l<lineage>-<seq:04>.<ext>``
at-least-once ``part-<tag>-g<generation:06>-s<subtask:04>-l<lineage>-e<epoch:010>-<seq:06>.<ext>``
staged        the final name's stem ``+ -g<generation:06>`` under ``_staging/``
============  ==========================================================================

Two runs of a job count epochs (and, from fresh checkpoint storage, generations) from the
same numbers; the lineage keeps a rerun, a branch restored from an older savepoint and a
second launch from ever renaming over each other's committed files. The final name is fixed
when the transaction begins and travels in its handle, so a re-commit of the same
transaction by a later generation — or by a branch that restored it — targets the same name
(an idempotent commit). A writer built without a lineage (by hand, in tests) writes the
names of epochal versions before lineages (no ``-l`` field); :func:`parse` reads both.

Lineage records. Each run writes ``_epochal_lineages/<lineage>.json`` (``{"parent":
..., "forked_at": ...}``) into the sink directory, so the directory alone says which runs
branched from which: :func:`abandoned` needs it to find the descendants of a savepoint.
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass

from epochal.alignment.factory import SinkMode
from epochal.epochs.lineage import LEGACY, LINEAGE_ID
from epochal.sinks.api import SinkContext

LINEAGES_DIR = "_epochal_lineages"

_NAME = re.compile(
    r"^part-(?P<tag>[0-9a-f]{8})-(?:"
    r"e(?P<epoch>\d{10,})-s(?P<subtask>\d{4,})(?:-l(?P<lineage>[0-9a-f]{12}))?-(?P<seq>\d{4,})"
    r"|g(?P<gen>\d{6,})-s(?P<dsubtask>\d{4,})(?:-l(?P<dlineage>[0-9a-f]{12})-e(?P<depoch>\d{10,}))?-(?P<dseq>\d{6,})"
    r")(?:-g(?P<staged>\d{6,}))?\.")


def name_tag(job: str, sink: str) -> str:
    """The 8 hex digits that tag every file of job ``job``'s sink ``sink``."""
    return hashlib.sha256(f"{job}\0{sink}".encode()).hexdigest()[:8]


@dataclass(frozen=True)
class PartName:
    """What a part file's name says. ``epoch`` is None for an at-least-once file written
    before lineages (its name held only the generation); ``lineage`` is :data:`LEGACY`
    for every name written before lineages."""

    tag: str
    subtask: int
    lineage: str
    epoch: int | None
    direct: bool


def parse(name: str) -> PartName | None:
    """The fields of a part file's base name, final or staged; None if it is not one."""
    m = _NAME.match(name)
    if m is None:
        return None
    if m.group("epoch") is not None:
        return PartName(m.group("tag"), int(m.group("subtask")), m.group("lineage") or LEGACY,
                        int(m.group("epoch")), False)
    epoch = m.group("depoch")
    return PartName(m.group("tag"), int(m.group("dsubtask")), m.group("dlineage") or LEGACY,
                    None if epoch is None else int(epoch), True)


class EpochNames:
    """TRANSACTIONAL names (module docstring); ``seq`` counts within the epoch."""

    def __init__(self, ctx: SinkContext, ext: str):
        self._subtask, self._generation, self._ext = ctx.subtask, ctx.generation, ext
        self.tag = name_tag(ctx.job, ctx.sink_name)
        self._lineage = f"-l{ctx.lineage_id}" if ctx.lineage_id else ""

    def final(self, epoch: int, index: int) -> str:
        return f"part-{self.tag}-e{epoch:010d}-s{self._subtask:04d}{self._lineage}-{index:04d}.{self._ext}"

    def staged(self, final: str) -> str:
        return f"{final[:-len(self._ext) - 1]}-g{self._generation:06d}.{self._ext}"


class GenerationNames(EpochNames):
    """DIRECT names (module docstring); ``seq`` counts within the writer, so a transaction
    of any epoch gets a name of its own (DIRECT publishes several per epoch)."""

    def __init__(self, ctx: SinkContext, ext: str):
        super().__init__(ctx, ext)
        self._seq = 0

    def final(self, epoch: int, index: int) -> str:
        self._seq += 1
        lineage = f"{self._lineage}-e{epoch:010d}" if self._lineage else ""
        return (f"part-{self.tag}-g{self._generation:06d}-s{self._subtask:04d}{lineage}-{self._seq - 1:06d}"
                f".{self._ext}")


NAMES = {SinkMode.TRANSACTIONAL: EpochNames, SinkMode.DIRECT: GenerationNames}


@dataclass(frozen=True)
class Fork:
    """A run's lineage record: the lineage it restored (None: a fresh run) and at which epoch."""

    parent: str | None
    forked_at: int | None


def descends(lineage: str, parent: str, epoch: int, forks: dict[str, Fork]) -> bool:
    """Whether run ``lineage`` began after epoch ``epoch`` of run ``parent``: it, or a run it
    descends from, restored a checkpoint of ``parent`` at an epoch ≥ ``epoch``. A run whose
    record is missing is taken as not descending (its files are kept)."""
    seen = set()
    while lineage in forks and lineage not in seen:
        seen.add(lineage)
        fork = forks[lineage]
        if fork.parent is None or fork.forked_at is None:
            return False
        if fork.parent == parent:
            return fork.forked_at >= epoch
        lineage = fork.parent
    return False


def abandoned(name: PartName, me: str, parent: str, forked_at: int, forks: dict[str, Fork]) -> bool:
    """Whether a committed file belongs to the future that run ``me``, restored from epoch
    ``forked_at`` of run ``parent``, abandons: written by ``parent`` after that epoch, or by
    any run other than ``me`` that began after it (:func:`descends`). Files of ``parent`` up
    to the epoch — the restored checkpoint's own transactions included — of the runs before
    it, of unrelated runs, and of ``me`` are never abandoned; nor is an at-least-once file
    whose name holds no epoch (written before lineages)."""
    if name.lineage == me:
        return False
    if name.lineage == parent:
        return name.epoch is not None and name.epoch > forked_at
    return descends(name.lineage, parent, forked_at, forks)


# ------------------------------------------------------------------ lineage records


def record_lineage(fs, root: str, lineage) -> None:
    """Write run ``lineage``'s record (module docstring) unless it is there. Idempotent; every
    writer of the run calls it when it is created."""
    path = posixpath.join(root, LINEAGES_DIR, f"{lineage.id}.json")
    if fs.exists(path):
        return
    fs.makedirs(posixpath.join(root, LINEAGES_DIR), exist_ok=True)
    fs.pipe_file(path, json.dumps({"parent": lineage.parent, "forked_at": lineage.forked_at}).encode())


def read_forks(fs, root: str) -> dict[str, Fork]:
    """Every lineage record of the sink directory at ``root``; unreadable ones are left out."""
    directory = posixpath.join(root, LINEAGES_DIR)
    fs.invalidate_cache(directory)
    try:
        paths = fs.ls(directory, detail=False)
    except FileNotFoundError:
        return {}
    forks = {}
    for path in paths:
        lineage = posixpath.basename(path.rstrip("/")).removesuffix(".json")
        if not LINEAGE_ID.match(lineage):
            continue
        try:
            doc = json.loads(fs.cat_file(path))
            forks[lineage] = Fork(doc.get("parent"), doc.get("forked_at"))
        except (ValueError, AttributeError, FileNotFoundError):
            continue
    return forks


# ------------------------------------------------------------------ lingering staged files


def staged_leftovers(fs, root: str, staging: str, tag: str, promised) -> list[tuple[str, bool]]:
    """``(staged name, promised)`` for every staged part file of the sink tagged ``tag``
    under ``staging`` (any run, any subtask): files a crash, a cancel or an abandoned run
    left before their commit (a writer's start-up cleanup deletes only its own run's and
    its parent's). ``promised``: a pending transaction handle of
    :class:`~epochal.sinks.lingering.Promised` lists it — a resume commits it."""
    wanted = {staged for handle in promised.handles for staged, _final in getattr(handle, "files", ())}
    fs.invalidate_cache(staging)
    try:
        paths = fs.ls(staging, detail=False)
    except FileNotFoundError:
        return []
    out = []
    for path in sorted(paths):
        base = posixpath.basename(path.rstrip("/"))
        name = parse(base)
        if name is not None and name.tag == tag:
            out.append((posixpath.relpath(path, root), posixpath.relpath(path, root) in wanted))
    return out
