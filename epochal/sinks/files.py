"""FileSink: part files published atomically per epoch, through fsspec.

Table 4.1 of seed 004 (HDFS row), mapped onto :class:`~epochal.sinks.base.TwoPhaseCommitSink`:

=========  ===============================================================================
Start      nothing yet; a part file is created under ``<path>/_staging/`` at the first record
write      append to the current part file, roll to a new one every ``max_records_per_file``
           (a rolled file is closed on the spot, its fsync waits for the durability step)
Pre-commit seal (task thread, at the barrier): detach the open part file from the writer
           (parquet: write its last buffered rows as a row group); durability step
           (uploader thread, before the ack): close the part file — flush, fsync, and
           on an object store the upload — and fsync the rolled ones: they survive a crash
Commit     move each staged file to its final name in ``<path>/`` (atomic rename on local
           file systems); a file whose staged copy is gone and final copy exists is
           skipped, so a repeated commit is a no-op
Abort      delete the staged files (the IBM FileSink truncates on reset, seed 000 §4.2.2;
           a staging file per transaction makes the truncation a delete)
=========  ===============================================================================

Names (:mod:`epochal.sinks.file_names`). Final names carry a tag of the job and sink (8 hex
digits of a hash of both, so two jobs or sinks that share a directory with ``take_over``
never overwrite each other), epoch, subtask, the run's lineage and a sequence but no
generation (``part-3fa0c1d2-e0000000007-s0002-l9a41c07be2d3-0000.jsonl``): two runs — a
rerun, a branch restored from an older savepoint, a second launch — never name a file
alike, and a later generation re-committing the same transaction targets the same name (it
is in the handle). Staged names add the generation (``...-g000003``), so a zombie of an
older attempt never collides with the current one. A commit never renames over an existing
file: a name taken by a file that is not the transaction's raises :class:`SinkCommitError`.
Readers that skip hidden files (``_staging``, ``_epochal_lineages``, names starting with
``_`` or ``.``) — ``pyarrow.dataset``, ``spark.read.parquet(dir)``, :func:`read_committed`
— never see partial data.

``SinkMode.DIRECT`` (at-least-once) uses the same staging but publishes every part file at
each barrier, named by generation, lineage and epoch
(``part-3fa0c1d2-g000003-s0002-l9a41c07be2d3-e0000000007-000011.jsonl``): output is visible
one barrier after it was written, never half-written, and records replayed after a restore
appear again in files of the new generation.

Rollback (``restore_from`` an older savepoint; docs/lifecycle.md): the branch re-emits the
epochs after the savepoint, as every sink does. ``rollback="keep"`` (default) leaves the
files the abandoned future committed; ``rollback="remove"`` deletes them when the branch
restores (:func:`~epochal.sinks.file_names.abandoned`), so the directory holds one history.

Formats (:mod:`epochal.sinks.file_formats`; named tuples are written as dicts): ``jsonl``
(``json.dumps`` per line; dates, times and datetimes — an Arrow timestamp column — as ISO 8601
text, as Spark writes them), ``csv`` (dict records, header from ``schema`` or the first
record), ``parquet`` (dict records via pyarrow; schema inferred from the first batch unless
given — pass ``schema=`` for stable column types).

>>> import uuid; from epochal.alignment.factory import SinkMode
>>> out = f"memory://doc-{uuid.uuid4().hex}"
>>> ctx = SinkContext("out", subtask=0, parallelism=1, job="j", generation=0,
...                   mode=SinkMode.TRANSACTIONAL)
>>> w = FileSink(out).create_writer(ctx); w.restore(None); w.write({"a": 1})
>>> state = w.snapshot(1); read_committed(out)
[]
>>> w.notify_epoch_complete(1); read_committed(out)
[{'a': 1}]
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem

from epochal.alignment.factory import SinkMode
from epochal.durable import fsync_dir, fsync_path
from epochal.errors import ConfigError
from epochal.sinks.base import Sink, SinkCommitError, SinkContext, TwoPhaseCommitSink, log
from epochal.sinks.file_formats import FORMATS, OWNER_FILE, Parquet, Part, read_committed  # noqa: F401
from epochal.sinks.file_names import (  # noqa: F401  (name_tag: where it always was)
    NAMES, abandoned, name_tag, parse, read_forks, record_lineage, staged_leftovers)

STAGING_DIR = "_staging"
ROLLBACKS = ("keep", "remove")  # what a restore from an older point does to the abandoned future's files


class FileSink(Sink):
    """Write records as part files under ``path`` (plain path, ``file://``, ``memory://``,
    or any fsspec URL whose file system can rename).

    Args:
        path: output directory; one job per directory.
        format: ``"jsonl"``, ``"csv"`` or ``"parquet"``.
        max_records_per_file: roll to a new part file after this many records (None: one
            file per epoch and subtask).
        schema: pyarrow schema — column types for parquet, column order for csv.
        take_over: write into ``path`` even if another job or sink owns it (its ownership
            marker ``_epochal_sink.json`` names another job or sink) or it holds files not
            written by epochal. Without it such a directory is refused when the job starts,
            and so is this job's own directory holding the output of an earlier run unless
            the job resumes (``resume=True``) — two runs never mix silently.
        parquet_options: parquet only: keyword arguments of ``pyarrow.parquet.ParquetWriter``
            for every part file (e.g. ``{"use_dictionary": False}``: no dictionary pages,
            cheaper to write for columns of mostly distinct values; ``{"compression":
            "zstd"}``). Default: pyarrow's defaults.
        rollback: what a run restored from an earlier point of another run (``restore_from``
            an older savepoint or checkpoint; also ``resume=True``) does to the files the
            other run — and every run that began after that point — committed after it:
            ``"keep"`` them (the default; the directory then holds them plus the epochs the
            branch produces again, as Delta, Iceberg, Kafka and PostgreSQL do) or
            ``"remove"`` them when the branch's writers restore, before it commits anything,
            so the directory holds exactly one history. Removal assumes no other run writes
            the directory meanwhile.

    Raises:
        ConfigError: for an unknown format, a non-positive ``max_records_per_file``, a
            schema given for jsonl (where it would have no effect), ``parquet_options``
            that are not for parquet or that ``ParquetWriter`` refuses, or an unknown
            ``rollback``.
    """

    local_recovery = True  # each subtask recovers only its own output (failover regions)

    def __init__(self, path: str, *, format: str = "jsonl", max_records_per_file: int | None = None,
                 schema: pa.Schema | None = None, take_over: bool = False, parquet_options: dict | None = None,
                 rollback: str = "keep"):
        if not isinstance(path, str) or not path:
            raise ConfigError(f"FileSink path: expected a non-empty string, got {path!r}")
        if format not in FORMATS:
            raise ConfigError(f"FileSink format: expected one of {sorted(FORMATS)}, got {format!r}")
        if max_records_per_file is not None and (
                isinstance(max_records_per_file, bool) or not isinstance(max_records_per_file, int)
                or max_records_per_file < 1):
            raise ConfigError("FileSink max_records_per_file: expected a positive int or None, "
                              f"got {max_records_per_file!r}")
        if schema is not None and (format == "jsonl" or not isinstance(schema, pa.Schema)):
            raise ConfigError(f"FileSink schema: expected a pyarrow.Schema for csv or parquet, got "
                              f"{type(schema).__name__} for format {format!r}")
        if parquet_options is not None:
            check_parquet_options(parquet_options, format)
        if rollback not in ROLLBACKS:
            raise ConfigError(f"FileSink rollback: expected one of {list(ROLLBACKS)}, got {rollback!r}")
        self.path = path
        self.format = format
        self.parquet_options = dict(parquet_options or {})
        self.max_records_per_file = max_records_per_file
        self.schema = schema
        self.take_over = bool(take_over)
        self.rollback = rollback

    def create_writer(self, ctx: SinkContext) -> FileSinkWriter:
        return FileSinkWriter(self, ctx)

    def __repr__(self) -> str:
        return f"FileSink({self.path!r}, format={self.format!r})"

    def locations(self) -> tuple[str, ...]:
        return (self.path,)

    def exclusive_locations(self) -> tuple[str, ...]:
        return (normalized_location(self.path),)

    def claim(self, job: str, sink: str, resume: bool) -> None:
        """Refuse a directory that is a file, is owned by another job or sink, holds files
        epochal did not write, or holds an earlier run's output of this very sink while the
        job starts afresh (see ``take_over``); then write the ownership marker."""
        claim_directory(self.path, job, sink, resume, self.take_over, self.format)

    def lingering(self, job: str, sink: str, promised) -> list:
        """The staged part files of this job's sink that no commit published yet, any run's
        (:func:`~epochal.sinks.file_names.staged_leftovers`); those of the latest completed
        checkpoint's pending transactions are promised. Run it while the job is stopped."""
        from epochal.sinks.lingering import Lingering

        fs, root = fsspec.core.url_to_fs(self.path)
        return [Lingering(sink, "files", staged, promised=kept, detail="promised (a resume commits it)" if kept else
                          "staged, never committed") for staged, kept in
                staged_leftovers(fs, root, posixpath.join(root, STAGING_DIR), name_tag(job, sink), promised)]

    def end_lingering(self, job: str, sink: str, items: list, promised) -> None:
        """Delete the staged files of ``items``, never one the checkpoint promises."""
        fs, root = fsspec.core.url_to_fs(self.path)
        keep = {staged for staged, kept in staged_leftovers(fs, root, posixpath.join(root, STAGING_DIR),
                                                             name_tag(job, sink), promised) if kept}
        for item in items:
            if not item.promised and item.what not in keep and item.what.startswith(STAGING_DIR + "/"):
                with contextlib.suppress(FileNotFoundError):
                    fs.rm(posixpath.join(root, item.what))


def check_parquet_options(options, format: str) -> None:
    """Refuse ``parquet_options`` (:class:`FileSink`) for another format, or that
    ``pyarrow.parquet.ParquetWriter`` refuses (tried on an in-memory file), naming the key."""
    import io

    import pyarrow.parquet as pq

    if format != "parquet":
        raise ConfigError(f"FileSink parquet_options: only for format 'parquet', got format {format!r}")
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ConfigError(f"FileSink parquet_options: expected a dict of ParquetWriter keyword arguments, "
                          f"got {options!r}")
    try:
        pq.ParquetWriter(io.BytesIO(), pa.schema([("x", pa.int64())]), **options).close()
    except (TypeError, ValueError, pa.ArrowException) as exc:
        raise ConfigError(f"FileSink parquet_options {options!r}: pyarrow.parquet.ParquetWriter refuses them: "
                          f"{exc}") from exc


@dataclass
class FileTransaction:
    """Picklable handle of one epoch's part files: ``(staged, final)`` names relative to the
    sink path, so a writer in another process can commit it."""

    epoch: int
    files: list[tuple[str, str]] = field(default_factory=list)


class FileSinkWriter(TwoPhaseCommitSink):
    """The per-task writer of a :class:`FileSink` (hooks of the two-phase commit only)."""

    def __init__(self, sink: FileSink, ctx: SinkContext):
        super().__init__(ctx)
        self._fs, self._root = fsspec.core.url_to_fs(sink.path)
        self._fs.makedirs(self._join(STAGING_DIR), exist_ok=True)
        self._format = FORMATS[sink.format](ctx.sink_name, sink.schema)
        if isinstance(self._format, Parquet):
            self._format.options = getattr(sink, "parquet_options", {})  # (sinks pickled before the option: none)
        self._names = NAMES[ctx.mode](ctx, self._format.ext)
        self._rollback = getattr(sink, "rollback", "keep")  # (sinks pickled before the option: keep)
        if ctx.lineage is not None:
            record_lineage(self._fs, self._root, ctx.lineage)
        self._max = sink.max_records_per_file
        self._part: Part | None = None  # open part file of the open transaction
        self._local = isinstance(self._fs, LocalFileSystem)  # rolled files need a later fsync
        self._unsynced: list[str] = []  # rolled part files of the open transaction, not fsynced
        # exactly-once: commits renamed files whose directories are not fsynced yet; the next
        # durability step (or the clean end) does it, off the task thread, once for them all
        self._defer_dir_sync = ctx.mode is SinkMode.TRANSACTIONAL and self._local
        self._published = False

    def begin_transaction(self, epoch: int) -> FileTransaction:
        return FileTransaction(epoch)  # files appear with the first record: empty epochs publish nothing

    def write_to(self, txn: FileTransaction, record: Any) -> None:
        part = self._part or self._new_part(txn)
        part.write(record)
        if self._max is not None and part.count >= self._max:
            self._roll(part)

    def write_batch_to(self, txn: FileTransaction, batch) -> None:
        """Parquet takes a ``pyarrow.RecordBatch`` whole (row groups); other formats as a
        batch of dict rows."""
        if not isinstance(self._format, Parquet):
            return self.write_many_to(txn, batch.to_pylist())
        part = self._part or self._new_part(txn)
        part.write_batch(batch)
        if self._max is not None and part.count >= self._max:
            self._roll(part)

    def write_many_to(self, txn: FileTransaction, records: list) -> None:
        """A batch at once: each part file gets one ``write_many`` per batch (jsonl: one
        encode and one file write), cut where ``max_records_per_file`` rolls the file."""
        if type(self).write_to is not FileSinkWriter.write_to:  # a subclass's write_to sees every record
            super().write_many_to(txn, records)
            return
        start, n, most = 0, len(records), self._max
        while start < n:
            part = self._part or self._new_part(txn)
            stop = n if most is None else min(n, start + most - part.count)
            part.write_many(records if start == 0 and stop == n else records[start:stop])
            start = stop
            if most is not None and part.count >= most:
                self._roll(part)

    def _new_part(self, txn: FileTransaction) -> Part:
        final = self._names.final(txn.epoch, len(txn.files))
        staged = posixpath.join(STAGING_DIR, self._names.staged(final))
        part = self._part = self._format.part(self._fs, self._join(staged))
        txn.files.append((staged, final))
        return part

    def _roll(self, part: Part) -> None:
        self._part = None
        part.close(sync=False)  # cheap: the fsync is the durability step's
        if self._local:
            self._unsynced.append(part.path)

    def pre_commit(self, txn: FileTransaction):
        """Seal: detach the open part file (parquet: flush its buffered rows, which may still
        raise :class:`SinkWriteError` here, on the task thread); the returned step closes it
        and fsyncs the rolled ones."""
        part, self._part = self._part, None
        unsynced, self._unsynced = self._unsynced, []
        published, self._published = self._published, False
        if part is not None:
            part.seal()
        elif not unsynced and not published:
            return None  # nothing written, or nothing left to make durable
        return functools.partial(_make_durable, self._fs, part, unsynced,
                                 (self._root, self._join(STAGING_DIR)) if published else ())

    def commit(self, txn: FileTransaction) -> None:
        """Rename the transaction's files into place: visible now. The renames are durable
        only with both directories fsynced; exactly-once defers that (group commit) to the
        next durability step, which runs on the uploader before the next checkpoint is
        acknowledged — so no checkpoint that no longer lists this transaction as pending
        completes before its renames are durable, and a crash before then re-commits it
        from the restored state — or to the clean end (:meth:`abort` of the last, open
        transaction). The task thread pays the renames only."""
        for staged, final in txn.files:
            self._publish(staged, final)
        if not txn.files:
            return
        if self._defer_dir_sync:
            self._published = True
        else:
            _sync_dirs(self._fs, (self._root, self._join(STAGING_DIR)))

    def abort(self, txn: FileTransaction) -> None:
        if self._published:  # the clean end (close) aborts the open transaction last
            self._published = False
            _sync_dirs(self._fs, (self._root, self._join(STAGING_DIR)))
        part, self._part = self._part, None
        self._unsynced = []
        if part is not None:
            part.discard()
        for staged, _ in txn.files:
            if self._fs.exists(self._join(staged)):
                self._fs.rm(self._join(staged))

    def cleanup_orphans(self, restored_epoch: int) -> None:
        """Delete the staged files of this subtask written by this run or by the run it
        restored, of any generation and epoch — and those of every old subtask ``j >=
        parallelism`` with ``j % parallelism == subtask``, which no longer exists after a
        rescale and whose transactions this subtask took over. Staged files of other runs
        (a second launch from other storage into the same directory) are never touched.
        With ``rollback="remove"``, a branch then deletes the committed files of the future
        it abandons (:meth:`_remove_abandoned`).

        A superset of the contract (epochs > ``restored_epoch``): ``restore`` calls this after
        re-committing the restored state, and a staged file of an epoch ≤ ``restored_epoch``
        that is still there belongs to no completed checkpoint of the current lineage.
        Idempotent.
        """
        lineage = self.ctx.lineage
        runs = {self.ctx.lineage_id} | ({lineage.parent} if lineage is not None and lineage.parent is not None
                                        else set())
        for path, name in self._listing(self._join(STAGING_DIR)):
            if name.lineage in runs:
                self._fs.rm(path)
        if self._rollback == "remove" and lineage is not None and lineage.parent is not None \
                and lineage.forked_at is not None:
            self._remove_abandoned(lineage)

    def _remove_abandoned(self, lineage) -> None:
        """``rollback="remove"``: delete the committed files of this subtask (and of the old
        subtasks it absorbs) that the restored branch abandons: written after the restored
        epoch by the run it restored, or by any other run that began after that epoch. Each
        file has exactly one owner (its subtask mod the parallelism). Idempotent."""
        forks = read_forks(self._fs, self._root)
        gone = [path for path, name in self._listing(self._root)
                if abandoned(name, lineage.id, lineage.parent, lineage.forked_at, forks)]
        for path in gone:
            self._fs.rm(path)
        if gone:
            _sync_dirs(self._fs, (self._root,))
            log.warning("%s: this run (%s) removed %d part files that the abandoned future after epoch %d of "
                        "lineage %s committed (FileSink rollback='remove')", self._where(), lineage.describe(),
                        len(gone), lineage.forked_at, lineage.parent or "(written before lineages)")

    def _listing(self, directory: str):
        """``(path, PartName)`` of this job's and sink's part files in ``directory`` whose
        subtask this subtask owns (``j % parallelism == subtask``)."""
        self._fs.invalidate_cache(directory)
        try:
            # On an object store the directory is only its files: another subtask cleaning up at
            # the same time may delete the last one between any check and this listing.
            paths = self._fs.ls(directory, detail=False)
        except FileNotFoundError:
            return []
        own, p, tag = self.ctx.subtask, self.ctx.parallelism, self._names.tag
        found = []
        for path in paths:
            name = parse(posixpath.basename(path.rstrip("/")))
            # never another job's or sink's files (take_over)
            if name is not None and name.tag == tag and name.subtask % p == own:
                found.append((path, name))
        return found

    def _publish(self, staged: str, final: str) -> None:
        """Rename one staged file to its final name, never over another file: a final name
        that exists while the staged file does too is another run's or job's file (on an
        object store, where a rename is a copy and a delete, a copy of the same size is a
        rename cut short and is finished)."""
        src, dst = self._join(staged), self._join(final)
        if self._fs.exists(src):
            if self._fs.exists(dst) and (self._local or self._fs.size(dst) != self._fs.size(src)):
                raise SinkCommitError(
                    f"{self._where()}: cannot commit {staged!r} -> {final!r} under {self._root!r}: a file of that "
                    "name exists and is not this transaction's (written by another job or sink with the same name "
                    "tag, or copied in by hand?); nothing was overwritten")
            self._fs.mv(src, dst)
        elif not self._fs.exists(dst):
            raise SinkCommitError(
                f"{self._where()}: cannot commit {staged!r} -> {final!r} under {self._root!r}: "
                "neither file exists (staging data deleted by hand or by another job on this path?)")

    def _join(self, name: str) -> str:
        return posixpath.join(self._root, name)


def _make_durable(fs, part: Part | None, unsynced: list[str], published: tuple[str, ...] = ()) -> None:
    """A FileSink transaction's durability step (uploader thread): touches only the sealed
    part, the rolled files' paths and the directories of earlier commits' renames
    (``published``), never the writer. The staging directory is fsynced last, so the staged
    files' entries survive a power loss too."""
    if part is not None:
        part.close()
    for path in unsynced:
        fsync_path(fs, path)
    staged = unsynced or ([part.path] if part is not None else [])
    _sync_dirs(fs, tuple(d for d in published if not staged or d != posixpath.dirname(staged[0])))
    if staged:
        fsync_dir(fs, posixpath.dirname(staged[0]))


def _sync_dirs(fs, directories: tuple[str, ...]) -> None:
    for directory in directories:
        fsync_dir(fs, directory)


# ------------------------------------------------------------------------- the directory


def normalized_location(path: str) -> str:
    """``path`` as a comparable location: absolute for local paths, no trailing slash."""
    protocol = fsspec.utils.get_protocol(path)
    if protocol in ("file", "local"):
        local = path.split("://", 1)[1] if "://" in path else path
        return posixpath.normpath(os.path.abspath(local))
    return path.rstrip("/")


def claim_directory(path: str, job: str, sink: str, resume: bool, take_over: bool,
                    file_format: str | None = None) -> None:
    """Ownership of a FileSink's output directory (see :class:`FileSink` ``take_over``); the
    marker also says which ``file_format`` the part files have (:func:`read_committed`)."""
    fs, root = fsspec.core.url_to_fs(path)
    where = f"sink {sink!r}: {path}"
    if fs.isfile(root):
        raise ConfigError(f"{where} is a file, not a directory: choose a directory for the part files")
    marker = posixpath.join(root, OWNER_FILE)
    owner = None
    if fs.exists(marker):
        try:
            owner = json.loads(fs.cat_file(marker))
        except ValueError:
            owner = {}
    if not take_over:
        fs.invalidate_cache(root)
        try:
            entries = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)]
        except FileNotFoundError:
            entries = []
        output = [e for e in entries if not e.startswith(("_", "."))]
        if owner is not None and (owner.get("job"), owner.get("sink")) != (job, sink):
            raise ConfigError(
                f"{where} is the output directory of job {owner.get('job')!r} sink {owner.get('sink')!r} "
                f"({OWNER_FILE}); write elsewhere, or pass FileSink(..., take_over=True) to write into it anyway")
        if owner is None and output:
            raise ConfigError(
                f"{where} is not empty ({len(output)} entries, e.g. {sorted(output)[0]!r}) and was not written by "
                "epochal; use an empty or new directory, or pass FileSink(..., take_over=True)")
        if owner is not None and output and not resume:
            raise ConfigError(
                f"{where} holds committed output of an earlier run of this job ({len(output)} part files): pass "
                "resume=True to continue that run from its checkpoints, delete the directory to start afresh, or "
                "pass FileSink(..., take_over=True) to add to it")
    fs.makedirs(root, exist_ok=True)
    owner = {"job": job, "sink": sink, "format": 1}
    if file_format is not None:
        owner["file_format"] = file_format
    fs.pipe_file(marker, json.dumps(owner).encode())
