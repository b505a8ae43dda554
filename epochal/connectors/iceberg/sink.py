"""IcebergSink: one Iceberg snapshot per epoch and sink subtask, exactly-once for every reader.

Table 4.1 of seed 004 ("DBMS (MVCC)" row), mapped onto
:class:`~epochal.sinks.base.TwoPhaseCommitSink`:

=========  ===============================================================================
Start      a handle carrying its own app id (``<prefix>-<lineage>-<subtask>``) and the epoch
write      records are converted to the table's Arrow schema (with Iceberg field ids) and
           written as row groups of a parquet data file in the table's ``data/``
           directory: a file no snapshot references, invisible to every reader
Pre-commit seal at the barrier (task thread); durability step (uploader thread): close the
           file (footer, fsync locally) and describe it as an Iceberg ``DataFile`` (stats
           from its footer, as pyiceberg's own writer does)
Commit     a **fast append** of the epoch's data files — one new snapshot, a pure metadata
           operation (manifest, manifest list, metadata file, the catalog's compare-and-
           swap) — whose summary records the app id and epoch, unless the table's ancestry
           already holds the epoch (:mod:`~epochal.connectors.iceberg.recovery`)
Abort      delete the open transaction's file (never referenced)
=========  ===============================================================================

**Why a fast append of files written at pre-commit.** pyiceberg offers ``append(df)``
(writes and commits in one call: nothing could be pre-committed), ``add_files(paths)``
(commits existing files, but sets a name mapping on the table and reads every footer at
commit time) and the snapshot producer's ``fast_append().append_data_file(...)`` that
``append`` itself uses. The last one, fed with data files written at pre-commit, is the
two-phase commit: the data is durable before the checkpoint is acknowledged, and the commit
is only metadata. Files carry Iceberg field ids, so readers need no name mapping.

**Retries.** The table must have ``commit.retry.num-retries=0`` (see
:mod:`~epochal.connectors.iceberg.recovery` for why): the sink sets it on a table it
creates and refuses an existing table without it (changing it would change every other
writer's commits), naming the property and how to set it. Each commit checks it again.

Unpartitioned tables only: a partitioned table is refused when the job starts.

**At-least-once** (``SinkMode.DIRECT``): the same files, fast-appended at every barrier
without the epoch in the summary (nothing is skipped).
"""
from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from epochal.alignment.factory import SinkMode
from epochal.connectors.commit_retry import CommitAttempts
from epochal.connectors.iceberg import client, lingering, recovery
from epochal.connectors.iceberg.client import ancestry, expired_before  # noqa: F401 - re-exported
from epochal.connectors.staging import RowBuffer, StagedParquet, TableRows
from epochal.errors import ConfigError
from epochal.sinks.base import Sink, SinkCommitError, SinkContext, TwoPhaseCommitSink
from epochal.sinks.lingering import Lingering

log = logging.getLogger("epochal")

#: runs whose epoch records the table properties keep, by default (``IcebergSink(keep_lineages=)``)
KEEP_LINEAGES = 8


class IcebergSink(Sink):
    """Append records to an Iceberg table: exactly-once under the exactly-once guarantee
    (one snapshot per epoch and subtask; see the module docstring), at-least-once otherwise.

    Args:
        catalog: the catalog's name (pyiceberg configuration) or a dict of its properties,
            e.g. ``{"type": "sql", "uri": "sqlite:////data/cat.db", "warehouse": "file:///data/wh"}``.
        table: ``"namespace.table"``.
        schema: a ``pyarrow.Schema``. A missing table (and namespace) is created with it
            when the job starts, with ``commit.retry.num-retries=0``; an existing table must
            have it. None: the table must exist.
        app_id: prefix of the app ids in snapshot summaries (``f"{app_id}-{lineage}-{subtask}"``);
            default ``f"epochal-{job}-{sink}"`` (see :class:`~epochal.sinks.DeltaSink`).
        keep_lineages: how many runs' (lineages') epoch records the table properties keep
            per app id prefix (one property per sink subtask and run); older runs' records are
            dropped as newer runs commit. A restore of a checkpoint of a dropped run whose
            snapshots were also expired is refused (it cannot be told what the table holds).

    Records: dicts, named tuples, or plain tuples in column order; a columnar stream writes
    its Arrow batches (cast to the table schema).

    Raises:
        ConfigError: for an invalid argument when the sink is built; when the job starts,
            naming the sink, for an unreachable catalog, a missing table without a schema,
            a different schema, a partitioned table, or retries not disabled.
    """

    def __init__(self, catalog, table, *, schema: pa.Schema | None = None, app_id: str | None = None,
                 keep_lineages: int = KEEP_LINEAGES):
        what = "IcebergSink"
        if isinstance(keep_lineages, bool) or not isinstance(keep_lineages, int) or keep_lineages < 1:
            raise ConfigError(f"{what} keep_lineages: expected a positive int (runs whose epoch records the table "
                              f"properties keep), got {keep_lineages!r}")
        self.keep_lineages = keep_lineages
        self.catalog_name, self.catalog_properties = client.check_catalog(catalog, what)
        self.identifier = client.check_identifier(table, what)
        if schema is not None and not isinstance(schema, pa.Schema):
            raise ConfigError(f"{what} schema: expected a pyarrow.Schema, got {type(schema).__name__}")
        if app_id is not None and (not isinstance(app_id, str) or not app_id.strip()):
            raise ConfigError(f"{what} app_id: expected a non-empty string, got {app_id!r}")
        self.schema, self.app_id = schema, app_id

    def __repr__(self) -> str:
        return f"IcebergSink({self.catalog_name!r}, {'.'.join(self.identifier)!r})"

    def create_writer(self, ctx: SinkContext) -> IcebergSinkWriter:
        return IcebergSinkWriter(self, ctx)

    def prefix(self, job: str, sink: str) -> str:
        return self.app_id or f"epochal-{job}-{sink}"

    def catalog(self, what: str):
        return client.load_catalog(self.catalog_name, self.catalog_properties, what)

    def claim(self, job: str, sink: str, resume: bool) -> None:
        """On the driver, before any task starts: create the table from ``schema`` if missing;
        check an existing one (schema, unpartitioned, retries disabled). Snapshots of an
        earlier run of this job are fine: this run's app ids name its own lineage."""
        what = f"sink {sink!r} ({self!r})"
        client.pyiceberg()
        catalog = self.catalog(what)
        table = client.load_table(catalog, self.identifier, what)
        if table is None:
            if self.schema is None:
                client.require_table(catalog, self.identifier, what)
            table = self._create(catalog, what)
        if not table.spec().is_unpartitioned():
            raise ConfigError(f"{what}: the Iceberg table is partitioned ({table.spec()}); IcebergSink writes "
                              "unpartitioned tables")
        if not client.retries_disabled(table):
            raise ConfigError(
                f"{what}: the Iceberg table has {client.RETRIES}={table.metadata.properties.get(client.RETRIES, '(unset: 4)')}; "
                f"pyiceberg's commit retries re-apply a stale writer's append (a duplicate), so IcebergSink needs "
                f"{client.RETRIES}=0. Set it with: with table.transaction() as t: "
                f"t.set_properties({{'{client.RETRIES}': '0'}}) (it applies to every writer of the table)")
        if self.schema is not None:
            diffs = client.schema_differences(self.schema, client.arrow_schema(table))
            if diffs:
                raise ConfigError(f"{what}: the schema differs from the Iceberg table's: {'; '.join(diffs)}")

    def lingering(self, job: str, sink: str, promised) -> list[Lingering]:
        """Staged data files of this job's sink in the table's ``data/`` that no snapshot
        references, those of the latest completed checkpoint's pending epochs marked promised
        (:func:`epochal.connectors.iceberg.lingering.find`)."""
        return lingering.find(self, job, sink, promised)[0]

    def end_lingering(self, job: str, sink: str, items: list, promised) -> None:
        """Delete the staged files of ``items`` (:func:`epochal.connectors.iceberg.lingering.end`)."""
        lingering.end(self, job, sink, items, promised)

    def savepoint_snapshot(self, lineage: str, epoch: int) -> int | None:
        """The snapshot to roll the table back to before restoring a savepoint (or
        checkpoint) of epoch ``epoch`` written by lineage ``lineage`` (its ``_metadata``'s
        ``lineage`` and ``epoch``): the parent of the oldest snapshot in the current
        ancestry that commits an epoch after it for that lineage (the current snapshot if
        none). Roll back with ``table.manage_snapshots().rollback_to_snapshot(id).commit()``:
        that drops the epochs the restored run is about to produce again — and every later
        commit by anyone else. None: the table had no snapshot before.

        Raises:
            ConfigError: the snapshots back to there were expired, so it cannot be told.
        """
        what = f"{self!r}"
        table = client.require_table(self.catalog(what), self.identifier, what)
        marker = f"-{lineage}-"  # app ids are <prefix>-<lineage>-<subtask>; a lineage is 12 random hex digits
        answer = table.current_snapshot().snapshot_id if table.current_snapshot() else None
        for snapshot_id, props in ancestry(table):
            if props is recovery.EXPIRED:
                raise ConfigError(f"{what}: the snapshots before {snapshot_id} were expired; the snapshot of the "
                                  f"savepoint of epoch {epoch} cannot be told")
            app = (props or {}).get(recovery.APP_ID, "")
            try:
                later = marker in app and int(props.get(recovery.EPOCH, -1)) > epoch
            except (TypeError, ValueError):
                later = False
            if later:
                parent = table.metadata.snapshot_by_id(snapshot_id).parent_snapshot_id
                answer = parent
        return answer

    def _create(self, catalog, what: str):
        namespace = self.identifier[:-1]
        try:
            catalog.create_namespace_if_not_exists(namespace)
            table = catalog.create_table_if_not_exists(self.identifier, schema=self.schema,
                                                       properties={client.RETRIES: "0"})
        except Exception as exc:
            raise ConfigError(f"{what}: cannot create the Iceberg table {'.'.join(self.identifier)}: "
                              f"{client._short(exc)}") from None
        log.info("%s: created the Iceberg table %s", what, ".".join(self.identifier))
        return table


@dataclass
class IcebergTransaction:
    """Picklable handle of one epoch's data files (relative to the table location), carrying
    its own app id (None: at-least-once), which names the lineage that wrote it.
    ``snapshot_id``: the table's snapshot after the writer's last commit when the epoch was
    sealed (None: none yet), so a checkpoint or savepoint records where the table stood."""

    epoch: int
    app_id: str | None
    files: list[str] = field(default_factory=list)
    rows: int = 0
    snapshot_id: int | None = None


class IcebergSinkWriter(TableRows, TwoPhaseCommitSink):
    """The per-task writer of an :class:`IcebergSink`: the two-phase-commit hooks (the
    ``write_*_to`` ones from :class:`~epochal.connectors.staging.TableRows`)."""

    #: at-least-once commits at barriers only: a snapshot per 50 ms would flood the metadata
    direct_publish_interval = float("inf")

    def __init__(self, sink: IcebergSink, ctx: SinkContext):
        super().__init__(ctx)
        client.pyiceberg()
        self._sink = sink
        self._transactional = ctx.mode is SinkMode.TRANSACTIONAL
        prefix = self._prefix = sink.prefix(ctx.job, ctx.sink_name)
        self._lineage = ctx.lineage_id
        self._parent = ctx.lineage.parent if ctx.lineage is not None else None
        self.app_id = recovery.app_id(prefix, ctx.subtask, self._lineage)
        self._tag = recovery.name_tag(prefix, self._lineage)
        self._token = uuid.uuid4().hex[:8]
        self._table = None  # loaded by the first hook
        self._seq = 0
        self._part: StagedParquet | None = None
        self._described: dict[str, Any] = {}  # data file path -> DataFile, made by the durability step
        self._fresh: set[int] = set()
        self._known: dict[str, tuple[int, int | None]] = {}  # app id -> (snapshot id, epoch) of the last look
        self._snapshot: int | None = None  # the snapshot of this writer's last commit
        #: ``(attempts, seconds)`` of each exactly-once commit this writer made (benchmarks read it)
        self.commit_stats: list[tuple[int, float]] = []

    # ------------------------------------------------------------------ hooks

    def begin_transaction(self, epoch: int) -> IcebergTransaction:
        self._start()
        return IcebergTransaction(epoch, self.app_id if self._transactional else None)

    def pre_commit(self, txn: IcebergTransaction):
        self._flush(txn)
        part, self._part = self._part, None
        txn.snapshot_id = self._snapshot
        if part is None:
            return None
        if self._transactional:
            self._fresh.add(txn.epoch)
        return functools.partial(self._close_file, txn, part, self._table)

    def commit(self, txn: IcebergTransaction) -> None:
        """1. Nothing to do for an epoch without files.
        2. Reload the table; refuse it if its retries were switched on meanwhile.
        3. Exactly-once: ask the snapshot ancestry for the app id's epoch; skip the epoch if
           the table holds it (for a handle this writer pre-committed itself — a zombie told
           late — only if the table references its files: else another writer uses the app id).
        4. Fast-append the data files (described by the durability step, or from their
           footers for a restored handle — which also checks they still exist) in one
           snapshot with the epoch in its summary and in the app id's table property (one
           catalog commit); when the catalog's compare-and-swap fails
           (``CommitFailedException``: other subtasks committed first), wait a random time
           up to a bound that doubles each time (:mod:`~epochal.connectors.commit_retry`:
           full jitter, so contending subtasks spread out) and go to 2 again, until its deadline.
        """
        # Step 1
        if not txn.files:
            return
        from pyiceberg.exceptions import CommitFailedException

        self._start()
        failure = None
        attempts = CommitAttempts()
        for attempt in attempts:
            # Step 2
            table = self._reload()
            if not client.retries_disabled(table):
                raise SinkCommitError(f"{self._where()}: the Iceberg table {'.'.join(self._sink.identifier)} no "
                                      f"longer has {client.RETRIES}=0; committing could duplicate an epoch")
            # Step 3
            props, table_props, removals = {}, {}, []
            if txn.app_id is not None:
                held = self._committed(table, txn.app_id)
                if recovery.decide(txn.epoch, held) is recovery.Decision.ALREADY_COMMITTED:
                    if txn.epoch in self._fresh:
                        self._check_same_handle(table, txn, held)
                    log.info("%s: epoch %d of %s is already in the Iceberg table, skipped", self._where(), txn.epoch,
                             txn.app_id)
                    return
                if held is None:
                    self._check_not_forgotten(table, txn)
                props = recovery.summary(txn.app_id, txn.epoch, self.ctx.job, self.ctx.sink_name, self.ctx.generation)
                table_props = {recovery.property_key(txn.app_id): str(txn.epoch)}
                removals = self._prune(table, txn.app_id, table_props)
            # Step 4
            data_files = self._data_files(table, txn)
            try:
                with table.transaction() as tx:
                    if removals:
                        tx.remove_properties(*removals)
                    if table_props:
                        tx.set_properties(table_props)
                    with tx.update_snapshot(snapshot_properties=props).fast_append() as append:
                        for data_file in data_files:
                            append.append_data_file(data_file)
                self._fresh.discard(txn.epoch)
                for path in txn.files:
                    self._described.pop(path, None)
                current = table.current_snapshot()  # the transaction updated the table's metadata
                self._snapshot = current.snapshot_id if current is not None else self._snapshot
                if txn.app_id is not None:
                    self.commit_stats.append((attempt, attempts.elapsed()))
                return
            except CommitFailedException as exc:
                failure = exc
            except Exception as exc:
                raise self._commit_error(txn, exc) from exc
        raise self._commit_error(txn, failure, attempts.exhausted())

    def abort(self, txn: IcebergTransaction) -> None:
        part, self._part = self._part, None
        self._buffer.rows = []
        if part is not None:
            part.discard()

    def release_clients(self) -> None:
        """The task ends (any path): delete the open transaction's staged file (no checkpoint
        promises it), close the catalog's connection pool (a SQL catalog's engine) and drop
        the table. Sealed epochs' files stay: a completed checkpoint may promise them."""
        part, self._part = self._part, None
        if part is not None:
            part.discard()
        client.close_catalog(getattr(self, "_catalog", None))
        self._table = self._catalog = None

    def cleanup_orphans(self, restored_epoch: int) -> None:
        """As :meth:`DeltaSinkWriter.cleanup_orphans
        <epochal.connectors.delta.sink.DeltaSinkWriter.cleanup_orphans>`, with the committed
        epochs from the snapshot ancestry: log the epochs a branch produces again; subtask 0
        deletes the sink's staged files of rolled-back epochs, listing ``data/`` once."""
        self._start()
        if not self._transactional:
            return
        table = self._reload()
        # Step 1
        if self._parent is not None:
            parent_app = recovery.app_id(self._prefix, self.ctx.subtask, self._parent)
            again = recovery.reproduced(self._committed(table, parent_app), restored_epoch)
            if again:
                log.warning("%s: this run (lineage %s) restored epoch %d, but lineage %s committed epochs up to %d "
                            "to the Iceberg table %s (app id %r): epochs %d-%d are produced again under app id %r "
                            "(a rollback re-emits them; roll the table back to the snapshot recorded in the "
                            "savepoint to drop them)", self._where(), self._lineage or "(legacy)", restored_epoch,
                            self._parent or "(legacy)", again[-1], ".".join(self._sink.identifier), parent_app,
                            again[0], again[-1], self.app_id)
        # Step 2
        if self.ctx.subtask != 0:
            return
        tags = {self._tag: self._lineage}
        if self._parent is not None:
            tags.setdefault(recovery.name_tag(self._prefix, self._parent), self._parent)
        listed = self._files.list(self._dir, keep=lambda name: name.startswith(tuple(f"part-{t}-" for t in tags)))
        doomed = []
        for tag, lineage in tags.items():
            names = [recovery.parse_name(p.rsplit("/", 1)[-1]) for p in listed]
            apps = {n.subtask: recovery.app_id(self._prefix, n.subtask, lineage)
                    for n in names if n is not None and n.tag == tag}
            epochs = recovery.committed_epochs(ancestry(table), apps.values(), None,
                                               recovery.recorded_epochs(table.metadata.properties))
            current = (lambda p: recovery.parse_name(p.rsplit("/", 1)[-1]).generation >= self.ctx.generation
                       ) if tag == self._tag else (lambda p: False)
            doomed += recovery.orphans(listed, tag, None, self.ctx.parallelism, restored_epoch, keep=current,
                                       committed={j: epochs[a] for j, a in apps.items()})
        if not doomed:
            return
        referenced = {task.file.file_path for task in table.scan().plan_files()} if table.current_snapshot() else set()
        deleted = self._files.delete_unreferenced(doomed, lambda p: client.full_path(table, p) in referenced)
        log.info("%s: deleted %d staged file(s) of epochs after %d", self._where(), deleted, restored_epoch)

    # ------------------------------------------------------------------ table

    def _start(self) -> None:
        if self._table is not None:
            return
        what = f"sink {self.ctx.sink_name!r} subtask {self.ctx.subtask}"
        catalog = self._sink.catalog(what)
        table = client.require_table(catalog, self._sink.identifier, what)
        self._catalog = catalog
        self._schema = client.arrow_schema(table)
        self._files, self._dir = client.data_files(table, what)
        self._buffer = RowBuffer(self.ctx.sink_name, self._schema)
        self._table = table

    def _reload(self):
        self._table = self._catalog.load_table(self._sink.identifier)
        return self._table

    def _committed(self, table, app: str) -> int | None:
        """The epoch ``app`` committed last: the ancestry walked down to where this writer
        last looked for that app id (cached per app id), or the table property when the
        history before was expired."""
        known = self._known.get(app)
        epochs = recovery.committed_epochs(ancestry(table), [app], (known[0], {app: known[1]}) if known else None,
                                           recovery.recorded_epochs(table.metadata.properties))
        current = table.current_snapshot()
        if current is not None:
            self._known[app] = (current.snapshot_id, epochs[app])
        return epochs[app]

    def _prune(self, table, app: str, changes: dict[str, str]) -> list[str]:
        """Add to ``changes`` the recent-lineages list with ``app``'s lineage newest; return the
        property keys of lineages beyond the sink's ``keep_lineages`` to remove
        (:func:`~epochal.connectors.iceberg.recovery.pruned_properties`; never this run's or
        its parent's). Nothing for a legacy app id."""
        parsed = recovery.parse_app_id(self._prefix, app)
        if parsed is None or not parsed[0]:
            return []
        protect = {self._lineage} | ({self._parent} if self._parent else set())
        more, removals = recovery.pruned_properties(table.metadata.properties, self._prefix, parsed[0],
                                                    self._sink.keep_lineages, protect)
        changes.update(more)
        if removals:
            log.info("%s: dropping the epoch records of %d old app id(s) of %s from the Iceberg table's properties "
                     "(keep_lineages=%d)", self._where(), len(removals), self._prefix, self._sink.keep_lineages)
        return removals

    def _check_not_forgotten(self, table, txn: IcebergTransaction) -> None:
        """The table holds no record of ``txn``'s app id: for a handle of an earlier run (this
        run's own records are never pruned while it commits), refuse if that may be because
        its lineage's record was pruned and its snapshots were expired (it cannot be told
        whether the epoch was committed; committing could append it twice)."""
        parsed = recovery.parse_app_id(self._prefix, txn.app_id)
        if parsed is None or parsed[0] == self._lineage:
            return
        if not recovery.forgotten(table.metadata.properties, self._prefix, txn.app_id):
            return
        if not any(props is recovery.EXPIRED for _, props in ancestry(table)):
            return  # the whole history is there: no record means never committed
        raise SinkCommitError(
            f"{self._where()}: cannot tell whether the Iceberg table {'.'.join(self._sink.identifier)} holds epoch "
            f"{txn.epoch} of app id {txn.app_id!r}: its snapshots were expired and its record was dropped from the "
            f"table properties when more than keep_lineages={self._sink.keep_lineages} later runs committed. Restore "
            "a newer checkpoint (to keep more runs' records from now on, raise IcebergSink(keep_lineages=...))")

    def _data_files(self, table, txn: IcebergTransaction) -> list:
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        out = []
        for rel in txn.files:
            described = self._described.get(rel)
            if described is None:  # a restored handle: describe the file again from its footer
                try:
                    described = parquet_file_to_data_file(table.io, table.metadata, client.full_path(table, rel))
                except FileNotFoundError:
                    raise SinkCommitError(
                        f"{self._where()}: cannot commit epoch {txn.epoch}: its data file {rel} is gone from the "
                        "table location (deleted by hand, or by an orphan-file cleanup?)") from None
            out.append(described)
        return out

    def _check_same_handle(self, table, txn: IcebergTransaction, held) -> None:
        """As :meth:`DeltaSinkWriter._check_same_handle
        <epochal.connectors.delta.sink.DeltaSinkWriter._check_same_handle>`."""
        self._fresh.discard(txn.epoch)
        referenced = {task.file.file_path for task in table.scan().plan_files()}
        if not {client.full_path(table, rel) for rel in txn.files} & referenced:
            raise SinkCommitError(
                f"{self._where()}: the Iceberg table already holds epoch {txn.epoch} of app id {txn.app_id!r} (epoch "
                f"{held}) with other files than this epoch's: do two jobs write with the same app id? Give each its "
                "own IcebergSink(..., app_id=...)")

    def _commit_error(self, txn: IcebergTransaction, exc, how: str = "") -> SinkCommitError:
        return SinkCommitError(f"{self._where()}: committing epoch {txn.epoch} to the Iceberg table "
                               f"{'.'.join(self._sink.identifier)} failed{how}: {client._short(exc)}")

    # ------------------------------------------------------------------ data files

    def _write_table(self, txn: IcebergTransaction, table: pa.Table) -> None:
        if self._part is None:
            name = recovery.staged_name(self._tag, self.ctx.subtask, txn.epoch if self._transactional else None,
                                        self.ctx.generation, self._token, self._seq)
            self._seq += 1
            self._part = StagedParquet(self._files, f"{self._dir}/{name}", self._schema)
        self._part.write(table)

    def _close_file(self, txn: IcebergTransaction, part: StagedParquet, table) -> None:
        """The durability step (uploader thread): close the file durably and describe it
        (``table``: the table as loaded at the seal; only its schema and io are read)."""
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        written = part.close(durable=True)
        if written is None:
            return
        self._files.sync_dirs([written.path])
        self._described[written.path] = parquet_file_to_data_file(table.io, table.metadata,
                                                                  client.full_path(table, written.path))
        txn.files.append(written.path)
        txn.rows += written.rows
