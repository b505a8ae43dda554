"""DeltaSink: one Delta commit per epoch and sink subtask, exactly-once for every Delta reader.

Table 4.1 of seed 004 ("DBMS (MVCC)" row: pre-commit = a new version, commit = make it
the current one), mapped onto :class:`~epochal.sinks.base.TwoPhaseCommitSink`:

=========  ===============================================================================
Start      a handle carrying its own app id (``<prefix>-<subtask>``) and the epoch
write      records are converted to the table's Arrow schema in chunks (a record that does
           not fit raises :class:`~epochal.sinks.base.SinkWriteError` naming it) and
           written as row groups of parquet data files directly in the table directory,
           one per partition (``col=value/``): files no version references, invisible to
           every Delta reader
Pre-commit seal at the barrier (task thread: convert the last buffered records, detach the
           files); durability step (uploader thread, before the ack): close the files
           (footer, fsync locally; an object store persists them on close) and record in
           the handle what an ``AddAction`` needs — path, size, partition values, row count
Commit     one ``create_write_transaction`` of the epoch's files with the application
           transaction ``(app id, version = epoch)``, unless ``transaction_version(app id)``
           already holds the epoch (:func:`~epochal.connectors.delta.recovery.decide`):
           idempotent, and a re-commit of a restored handle checks its files still exist;
           a commit that lost to concurrent ones asks again after a jittered backoff
Abort      delete the open transaction's files (never referenced)
=========  ===============================================================================

App ids name the run (:mod:`epochal.epochs.lineage`): ``<prefix>-<lineage>-<subtask>``. A
rerun from fresh checkpoint storage writes under new app ids (nothing of the earlier run
is taken for its own); a restored handle is committed under the app id of the run that
wrote it. A run restored from an older savepoint is a branch: the epochs its parent
committed after the savepoint stay in the table and are produced again (as Flink does),
which the writer logs when it starts; :meth:`DeltaSink.savepoint_version` tells the version
to rewind the table to first (``DeltaTable.restore``). After a restore, staged files of
rolled-back epochs are deleted (:func:`~epochal.connectors.delta.recovery.orphans`, decided
by name: never a file of an epoch a version may reference), by subtask 0 for the whole sink.
Staged files a stopped job left behind are listed and deleted by ``epochal sinks lingering``
(:meth:`DeltaSink.lingering`, :mod:`epochal.connectors.leftovers`).

**Zombies.** A task of an older generation still running after a restart can only commit
handles of completed checkpoints — the same handles the new generation re-commits. Both ask
:func:`~epochal.connectors.delta.recovery.decide` before committing; when they race, delta-rs's
conflict checker fails the second commit on the shared app id (``CommitFailedError``,
measured), which then asks again and skips. An epoch is never published twice.

**At-least-once** (``SinkMode.DIRECT``): the same files, committed at every barrier without
an application transaction (so nothing is skipped); after a restore, records of epochs
after it appear again. Files of a transaction open at a crash are left to
``DeltaTable.vacuum()`` (they are unreferenced).

One Delta version per epoch and subtask that wrote records: a 1 s checkpoint interval with
4 subtasks adds up to 4 versions a second; delta-rs writes a log checkpoint every 100
versions (``delta.checkpointInterval``). Files carry ``numRecords`` and ``nullCount`` stats
(no min/max: readers skip files by partition only).
"""
from __future__ import annotations

import functools
import json
import logging
import uuid
from dataclasses import dataclass, field

import pyarrow as pa

from epochal.alignment.factory import SinkMode
from epochal.connectors.commit_retry import CommitAttempts
from epochal.connectors.delta import client, lingering, recovery
from epochal.connectors.staging import RowBuffer, StagedParquet, TableRows, flat_column, split_partitions
from epochal.epochs.lineage import LINEAGE_ID
from epochal.errors import ConfigError
from epochal.sinks.base import Sink, SinkCommitError, SinkContext, TwoPhaseCommitSink
from epochal.sinks.lingering import Lingering

log = logging.getLogger("epochal")

class DeltaSink(Sink):
    """Append records to a Delta table: exactly-once under the exactly-once guarantee (one
    Delta commit per epoch and subtask; see the module docstring), at-least-once otherwise.

    Args:
        table_uri: local path, ``file://``, ``s3://`` (or another store delta-rs opens).
        partition_by: partition columns of a table the sink creates; for an existing table,
            if given, they must be the table's.
        storage_options: delta-rs storage options (e.g. ``AWS_ENDPOINT_URL``,
            ``AWS_ACCESS_KEY_ID``, ``AWS_ALLOW_HTTP``), also used for the data files.
        schema: a ``pyarrow.Schema``. A missing table is created with it when the job
            starts (the driver creates it, once); an existing table must have it (Delta
            types compared). None: the table must exist, and its schema is used.
        app_id: prefix of the Delta application ids (``f"{app_id}-{lineage}-{subtask}"``,
            one per run of the job: :mod:`epochal.epochs.lineage`); default
            ``f"epochal-{job}-{sink}"``. Two jobs writing one table need distinct prefixes.

    Records: dicts (column → value), named tuples, or plain tuples in column order; a
    columnar stream writes its Arrow batches (cast to the table schema).

    Raises:
        ConfigError: for an invalid argument when the sink is built; when the job starts,
            naming the sink, for a missing table without a schema, a schema or partitioning
            that differs from the table's, a table with constraints or generated columns,
            or an unreadable location.
    """

    def __init__(self, table_uri, *, partition_by: str | list[str] | None = None,
                 storage_options: dict | None = None, schema: pa.Schema | None = None, app_id: str | None = None):
        what = "DeltaSink"
        self.table_uri = client.check_uri(table_uri, what)
        if isinstance(partition_by, str):
            partition_by = [partition_by]
        if partition_by is not None and (not isinstance(partition_by, (list, tuple)) or
                                         not all(isinstance(c, str) and c for c in partition_by)):
            raise ConfigError(f"{what} partition_by: expected a column name or a list of them, got {partition_by!r}")
        if schema is not None and not isinstance(schema, pa.Schema):
            raise ConfigError(f"{what} schema: expected a pyarrow.Schema, got {type(schema).__name__}")
        if schema is not None and partition_by:
            for column in partition_by:
                if column not in schema.names:
                    raise ConfigError(f"{what} partition_by: column {column!r} is not in the schema {schema.names}")
                client.check_partition_type(column, schema.field(column).type, what)
        if app_id is not None and (not isinstance(app_id, str) or not app_id.strip()):
            raise ConfigError(f"{what} app_id: expected a non-empty string, got {app_id!r}")
        self.partition_by = list(partition_by) if partition_by is not None else None
        self.storage_options = client.check_storage_options(storage_options, what)
        self.schema = schema
        self.app_id = app_id

    def __repr__(self) -> str:
        return f"DeltaSink({self.table_uri!r})"

    def create_writer(self, ctx: SinkContext) -> DeltaSinkWriter:
        return DeltaSinkWriter(self, ctx)

    def locations(self) -> tuple[str, ...]:
        return (self.table_uri,)

    def prefix(self, job: str, sink: str) -> str:
        return self.app_id or f"epochal-{job}-{sink}"

    def claim(self, job: str, sink: str, resume: bool) -> None:
        """On the driver, before any task starts: create the table from ``schema`` if it does
        not exist; check schema, partitioning and writer features of an existing one. A
        table holding epochs of an earlier run of this job is fine: this run's app ids name
        its own lineage."""
        what = f"sink {sink!r} ({self!r})"
        dl = client.deltalake()
        dt = client.open_table(self.table_uri, self.storage_options, what)
        if dt is None:
            if self.schema is None:
                raise ConfigError(f"{what}: there is no Delta table at {self.table_uri}; pass "
                                  "DeltaSink(..., schema=pyarrow.schema([...])) to create it, or create it first")
            try:
                dl.DeltaTable.create(self.table_uri, self.schema, partition_by=self.partition_by or None,
                                     mode="ignore", storage_options=self.storage_options,
                                     commit_properties=dl.CommitProperties(
                                         custom_metadata={"epochal.job": job, "epochal.sink": sink}))
            except Exception as exc:
                raise ConfigError(f"{what}: cannot create the Delta table at {self.table_uri}: "
                                  f"{client._short(exc)}") from None
            log.info("%s: created the Delta table %s", what, self.table_uri)
            dt = client.require_table(self.table_uri, self.storage_options, what)
        client.check_appendable(dt, self.table_uri, what)
        table_schema = client.arrow_schema(dt)
        if self.schema is not None:
            diffs = client.schema_differences(self.schema, table_schema)
            if diffs:
                raise ConfigError(f"{what}: the schema differs from the Delta table's: {'; '.join(diffs)} (table: "
                                  f"{table_schema.to_string(show_schema_metadata=False)})".replace("\n", ", "))
        columns = list(dt.metadata().partition_columns)
        if self.partition_by is not None and self.partition_by != columns:
            raise ConfigError(f"{what}: partition_by={self.partition_by} but the Delta table is partitioned by "
                              f"{columns}")
        for column in columns:
            client.check_partition_type(column, table_schema.field(column).type, what)

    def lingering(self, job: str, sink: str, promised) -> list[Lingering]:
        """Staged data files of this job's sink that no table version references, those of
        the latest completed checkpoint's pending epochs marked promised
        (:func:`epochal.connectors.delta.lingering.find`)."""
        return lingering.find(self, job, sink, promised)[0]

    def end_lingering(self, job: str, sink: str, items: list, promised) -> None:
        """Delete the staged files of ``items`` (:func:`epochal.connectors.delta.lingering.end`)."""
        lingering.end(self, job, sink, items, promised)

    def savepoint_version(self, lineage: str, epoch: int) -> int:
        """The table version to rewind to before restoring a savepoint (or checkpoint) of
        epoch ``epoch`` written by lineage ``lineage`` (the ``lineage`` and ``epoch`` of its
        ``_metadata``; :attr:`JobResult.lineage <epochal.runtime.driver.result.JobResult.lineage>`):
        the last version before the first commit of an epoch after it by that lineage (the
        current version if there is none). Rewinding there
        (``DeltaTable(uri).restore(version)``) drops the epochs the restored run is about to
        produce again — and every commit made after it by anyone else.

        Raises:
            ConfigError: no table at the URI, or a version of the history is gone (log
                retention) so the answer cannot be told.
        """
        what = f"{self!r}"
        dt = client.require_table(self.table_uri, self.storage_options, what)
        first = None
        oldest = dt.version()
        for commit in dt.history():
            version = commit.get("version")
            if version is None:
                continue
            oldest = min(oldest, version)
            try:
                mine = commit.get("epochal.lineage") == lineage and int(commit.get("epochal.epoch", -1)) > epoch
            except (TypeError, ValueError):
                mine = False
            if mine and (first is None or version < first):
                first = version
        if first is None:
            return dt.version()
        if first == 0 or oldest > first - 1:
            raise ConfigError(f"{what}: the version before {first} is no longer in the table's history")
        return first - 1


@dataclass
class DeltaTransaction:
    """Picklable handle of one epoch's data files, carrying its own app id (None: at-least-once)
    — which names the lineage that wrote it — so any writer, after a restart, a rescale or in
    a later run, commits it under that app id.

    ``files`` holds one dict per durable file (the fields of a Delta ``AddAction``), filled
    by the durability step. ``table_version``: the table version of the writer's last commit
    when the epoch was sealed (None: it had committed nothing yet), so a checkpoint or
    savepoint records where the table stood; handles pickled by older versions lack it.
    """

    epoch: int
    app_id: str | None
    files: list[dict] = field(default_factory=list)
    table_version: int | None = None


class DeltaSinkWriter(TableRows, TwoPhaseCommitSink):
    """The per-task writer of a :class:`DeltaSink`: the two-phase-commit hooks (the
    ``write_*_to`` ones from :class:`~epochal.connectors.staging.TableRows`)."""

    #: at-least-once commits at barriers only: a Delta version per 50 ms would flood the log
    direct_publish_interval = float("inf")

    def __init__(self, sink: DeltaSink, ctx: SinkContext):
        super().__init__(ctx)
        self._dl = client.deltalake()
        self._sink = sink
        self._transactional = ctx.mode is SinkMode.TRANSACTIONAL
        prefix = self._prefix = sink.prefix(ctx.job, ctx.sink_name)
        self._lineage = ctx.lineage_id
        self._parent = ctx.lineage.parent if ctx.lineage is not None else None
        self.app_id = recovery.app_id(prefix, ctx.subtask, self._lineage)
        self._tag = recovery.name_tag(prefix, self._lineage)
        self._token = uuid.uuid4().hex[:8]
        self._files = client.table_files(sink.table_uri, sink.storage_options)
        self._dt = None  # opened by the first hook
        self._seq = 0
        self._parts: dict[tuple, StagedParquet] = {}  # partition values -> open data file
        self._fresh: set[int] = set()  # epochs pre-committed by this writer (their files exist)
        self._version: int | None = None  # the table version of this writer's last commit
        #: ``(attempts, seconds)`` of each exactly-once commit this writer made (benchmarks read it)
        self.commit_stats: list[tuple[int, float]] = []

    # ------------------------------------------------------------------ hooks

    def begin_transaction(self, epoch: int) -> DeltaTransaction:
        self._start()
        return DeltaTransaction(epoch, self.app_id if self._transactional else None)

    def pre_commit(self, txn: DeltaTransaction):
        """Seal (task thread): convert the buffered records (a bad one raises SinkWriteError
        here) and detach the open data files; the returned step closes them durably."""
        self._flush(txn)
        parts, self._parts = self._parts, {}
        txn.table_version = self._version
        if not parts:
            return None  # an empty epoch commits nothing
        if self._transactional:
            self._fresh.add(txn.epoch)
        return functools.partial(self._close_files, txn, parts)

    def commit(self, txn: DeltaTransaction) -> None:
        """1. Nothing to do for an epoch without files.
        2. At-least-once: commit the files (no application transaction).
        3. Otherwise ask Delta for the app id's version; skip the epoch if it holds it.
        4. A handle this writer did not pre-commit (restored, rescaled): its files must exist.
        5. Commit the files with ``Transaction(app id, epoch)``; when a concurrent commit
           wins (``CommitFailedError``: a zombie, or other subtasks' commits beyond
           delta-rs's own immediate retries), wait a random time up to a bound that doubles
           each time (:mod:`~epochal.connectors.commit_retry`: full jitter, so contending
           subtasks spread out) and go to 3 again, until its deadline.
        """
        # Step 1
        if not txn.files:
            return
        self._start()
        # Step 2
        if txn.app_id is None:
            self._delta_call(txn, self._commit_files, self._refresh(), txn, None)
            return
        checked = txn.epoch in self._fresh
        failure = None
        attempts = CommitAttempts()
        for attempt in attempts:
            # Step 3
            dt = self._refresh()
            held = dt.transaction_version(txn.app_id)
            if recovery.decide(txn.epoch, held) is recovery.Decision.ALREADY_COMMITTED:
                if txn.epoch in self._fresh:
                    self._check_same_handle(dt, txn, held)
                log.info("%s: epoch %d of %s is already in the Delta table (version %s), skipped",
                         self._where(), txn.epoch, txn.app_id, held)
                return
            # Step 4
            if not checked:
                self._check_files(txn)
                checked = True
            # Step 5
            try:
                self._commit_files(dt, txn, self._dl.Transaction(txn.app_id, txn.epoch))
                self._fresh.discard(txn.epoch)
                self.commit_stats.append((attempt, attempts.elapsed()))
                return
            except self._dl.exceptions.CommitFailedError as exc:
                failure = exc
            except Exception as exc:
                raise self._commit_error(txn, exc) from exc
        raise self._commit_error(txn, failure, attempts.exhausted())

    def abort(self, txn: DeltaTransaction) -> None:
        parts, self._parts = self._parts, {}
        self._buffer.rows = []
        for part in parts.values():
            part.discard()

    def release_clients(self) -> None:
        """The task ends (any path): delete the open transaction's staged files (no checkpoint
        promises them; after a clean close there are none) and drop the table object.
        Sealed epochs' files stay: a completed checkpoint may promise them."""
        parts, self._parts = self._parts, {}
        for part in parts.values():
            part.discard()
        self._dt = None

    def cleanup_orphans(self, restored_epoch: int) -> None:
        """After a restore of epoch ``restored_epoch`` (exactly-once only):

        1. A branch (``restore_from`` an older savepoint, or a resume): say which epochs the
           parent lineage committed after the fork point — this run produces them again.
        2. Subtask 0 deletes the staged files of rolled-back epochs of every subtask, of this
           run and of the run it restored, listing the table once for the whole sink
           (:func:`~epochal.connectors.delta.recovery.orphans`); files of this generation are
           never touched (the other subtasks are writing them). At-least-once: nothing
           (leftovers are for vacuum)."""
        self._start()
        if not self._transactional:
            return
        dt = self._refresh()
        # Step 1
        if self._parent is not None:
            parent_app = recovery.app_id(self._prefix, self.ctx.subtask, self._parent)
            again = recovery.reproduced(dt.transaction_version(parent_app), restored_epoch)
            if again:
                log.warning("%s: this run (lineage %s) restored epoch %d, but lineage %s committed epochs up to %d "
                            "to the Delta table %s (app id %r): epochs %d-%d are produced again under app id %r "
                            "(a rollback re-emits them; DeltaSink.savepoint_version tells the version to rewind to)",
                            self._where(), self._lineage or "(legacy)", restored_epoch, self._parent or "(legacy)",
                            again[-1], self._sink.table_uri, parent_app, again[0], again[-1], self.app_id)
        # Step 2
        if self.ctx.subtask != 0:
            return
        tags = {self._tag: self._lineage}
        if self._parent is not None:
            tags.setdefault(recovery.name_tag(self._prefix, self._parent), self._parent)
        listed = self._files.list(keep=lambda name: name.startswith(tuple(f"part-{t}-" for t in tags)),
                                  hidden=client.hidden_dir)
        doomed = []
        for tag, lineage in tags.items():
            names = [recovery.parse_name(p.rsplit("/", 1)[-1]) for p in listed]
            subtasks = {n.subtask for n in names if n is not None and n.tag == tag}
            committed = {j: dt.transaction_version(recovery.app_id(self._prefix, j, lineage)) for j in subtasks}
            current = (lambda p: recovery.parse_name(p.rsplit("/", 1)[-1]).generation >= self.ctx.generation
                       ) if tag == self._tag else (lambda p: False)
            doomed += recovery.orphans(listed, tag, None, self.ctx.parallelism, restored_epoch, keep=current,
                                       committed=committed)
        if not doomed:
            return
        referenced = self._referenced(dt)  # none is, by the epoch rule; checked all the same
        deleted = self._files.delete_unreferenced(doomed, referenced.__contains__)
        log.info("%s: deleted %d staged file(s) of epochs after %d", self._where(), deleted, restored_epoch)

    # ------------------------------------------------------------------ table

    def _start(self) -> None:
        """Once, on the first hook (inside ``restore``): open the table and take its schema."""
        if self._dt is not None:
            return
        what = f"sink {self.ctx.sink_name!r} subtask {self.ctx.subtask}"
        dt = client.require_table(self._sink.table_uri, self._sink.storage_options, what)
        self._schema = client.arrow_schema(dt)
        self._partitions = list(dt.metadata().partition_columns)
        self._data_schema = pa.schema([f for f in self._schema if f.name not in self._partitions])
        self._buffer = RowBuffer(self.ctx.sink_name, self._schema)
        self._dt = dt

    def _refresh(self):
        self._dt.update_incremental()
        return self._dt

    def _referenced(self, dt) -> set[str]:
        """Relative paths of the files the current version references."""
        return client.referenced(dt)

    def _commit_files(self, dt, txn: DeltaTransaction, transaction) -> None:
        dl = self._dl
        actions = [dl.transaction.AddAction(f["path"], f["size"], f["partition_values"], f["modification_time"],
                                            True, f["stats"]) for f in txn.files]
        meta = {"epochal.job": self.ctx.job, "epochal.sink": self.ctx.sink_name, "epochal.subtask": str(self.ctx.subtask),
                "epochal.epoch": str(txn.epoch), "epochal.generation": str(self.ctx.generation),
                "epochal.lineage": self._lineage_of(txn)}
        dt.create_write_transaction(
            actions, mode="append", schema=self._schema, partition_by=self._partitions or None,
            commit_properties=dl.CommitProperties(app_transactions=[transaction] if transaction else None,
                                                  custom_metadata=meta))
        dt.update_incremental()  # create_write_transaction leaves the table object at its version
        self._version = dt.version()

    def _lineage_of(self, txn: DeltaTransaction) -> str:
        """The lineage whose epoch ``txn`` is: the one its app id names (a restored handle of
        an earlier run keeps its run's; "" for app ids of versions before lineages), this
        writer's for at-least-once."""
        if txn.app_id is None:
            return self._lineage
        rest = txn.app_id[len(self._prefix) + 1:] if txn.app_id.startswith(self._prefix + "-") else ""
        lineage, _, subtask = rest.partition("-")
        return lineage if LINEAGE_ID.match(lineage) and subtask.isdigit() else ""

    def _check_same_handle(self, dt, txn: DeltaTransaction, held: int) -> None:
        """An epoch this writer pre-committed is in the table already: fine if a newer
        generation committed this very handle (restored from the checkpoint: this writer is a
        zombie told late), an error if other data went in under the app id."""
        self._fresh.discard(txn.epoch)
        if not {f["path"] for f in txn.files} & self._referenced(dt):
            raise SinkCommitError(
                f"{self._where()}: the Delta table {self._sink.table_uri} already holds epoch {txn.epoch} of app id "
                f"{txn.app_id!r} (version {held}) with other files than this epoch's: do two jobs write with the "
                "same app id? Give each its own DeltaSink(..., app_id=...)")

    def _check_files(self, txn: DeltaTransaction) -> None:
        missing = [f["path"] for f in txn.files if self._files.size(f["path"]) is None]
        if missing:
            raise SinkCommitError(
                f"{self._where()}: cannot commit epoch {txn.epoch} to {self._sink.table_uri}: its data file(s) "
                f"{missing[:3]}{' ...' if len(missing) > 3 else ''} are gone (deleted by hand, or by a vacuum with a "
                "retention shorter than the checkpoints'?)")

    def _delta_call(self, txn, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            raise self._commit_error(txn, exc) from exc

    def _commit_error(self, txn: DeltaTransaction, exc, how: str = "") -> SinkCommitError:
        return SinkCommitError(f"{self._where()}: committing epoch {txn.epoch} to the Delta table "
                               f"{self._sink.table_uri} failed{how}: {client._short(exc)}")

    # ------------------------------------------------------------------ data files

    def _write_table(self, txn: DeltaTransaction, table: pa.Table) -> None:
        if not self._partitions:
            self._part(txn, ()).write(table)
            return
        for key, rows in split_partitions(table, self._partitions):
            self._part(txn, key).write(rows.drop_columns(self._partitions))

    def _part(self, txn: DeltaTransaction, key: tuple) -> StagedParquet:
        part = self._parts.get(key)
        if part is None:
            name = recovery.staged_name(self._tag, self.ctx.subtask, txn.epoch if self._transactional else None,
                                        self.ctx.generation, self._token, self._seq)
            self._seq += 1
            rel = f"{client.partition_dir(self._partitions, key)}/{name}" if key else name
            part = self._parts[key] = StagedParquet(self._files, rel, self._data_schema)
        return part

    def _close_files(self, txn: DeltaTransaction, parts: dict[tuple, StagedParquet]) -> None:
        """The durability step (uploader thread): touches ``parts`` and ``txn`` only."""
        paths = []
        for key, part in parts.items():
            written = part.close(durable=True)
            if written is None:
                continue
            stats = {"numRecords": written.rows,
                     "nullCount": {c: n for c, n in written.null_counts.items() if flat_column(self._data_schema, c)}}
            txn.files.append({"path": written.path, "size": written.size,
                              "partition_values": {c: client.encode_partition_value(v)
                                                   for c, v in zip(self._partitions, key)},
                              "modification_time": written.modification_time, "stats": json.dumps(stats)})
            paths.append(written.path)
        self._files.sync_dirs(paths)

