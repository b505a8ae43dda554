"""PostgresSink: one PostgreSQL transaction per epoch and sink subtask, prepared at the
barrier and committed when the epoch's checkpoint completes — the DBMS row of seed 004's
Table 4.1, on :class:`~epochal.sinks.base.TwoPhaseCommitSink`:

=========  ===============================================================================
Start      the epoch's transaction, on its own connection from the writer's small pool,
           begins with the first record: a ``COPY ... FROM STDIN`` into the table that
           stays open while the epoch's rows stream in (with ``upsert_key``: rows are kept
           until the barrier, see below)
Pre-commit seal at the barrier (task thread, O(1)): the connection leaves the writer.
           Durability step (uploader thread, before the ack): end the COPY, insert the
           epoch's progress row, ``PREPARE TRANSACTION <gid>`` — durable on the server, and
           invisible; the connection goes back to the pool
Commit     ``COMMIT PREPARED <gid>``; idempotent: a gid the server no longer has was
           committed iff the epoch's progress row is visible (else it is reported lost)
Abort      roll back the open transaction (close its connection)
=========  ===============================================================================

On restore the writer commits the pending prepared transactions of the restored state
(``COMMIT PREPARED``), then rolls back every other prepared transaction of its subtask — and
of the subtasks it absorbs after a rescale — found in ``pg_prepared_xacts`` (rolled-back
attempts, zombies): none is ever left behind holding locks. Each commit also sweeps what
zombies of older generations prepared since. See :mod:`~epochal.connectors.postgres.recovery`.

``upsert_key``: rows are kept in memory until the barrier, then the durability step runs
``INSERT ... ON CONFLICT (key) DO UPDATE`` for each, in order, in one pipeline (a COPY into a
temporary table cannot be prepared: PostgreSQL refuses PREPARE for transactions that touched
temporary objects).

At-least-once (``SinkMode.DIRECT``): the same transactions, committed at every barrier (no
prepare, no progress rows); after a restore, rows of the epochs after it are written again.
"""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epochal.alignment.factory import SinkMode
from epochal.config import parse_duration
from epochal.connectors.postgres import recovery
from epochal.connectors.postgres.client import (
    connect,
    ensure_progress_table,
    max_prepared_transactions,
    pick_columns,
    psycopg,
    quote_ident,
    table_columns,
)
from epochal.connectors.postgres.rows import RowMaker
from epochal.errors import ConfigError
from epochal.sinks.base import Sink, SinkCommitError, SinkContext, SinkWriteError, TwoPhaseCommitSink
from epochal.sinks.lingering import Lingering

log = logging.getLogger("epochal")

#: commits between two sweeps for zombies' prepared transactions and old progress rows
SWEEP_EVERY = 64


class PostgresSink(Sink):
    """Write records into a PostgreSQL table, exactly-once under the exactly-once guarantee.

    Args:
        dsn: a libpq connection string or URL (``"postgresql://user@host:5432/db"``).
        table: the target table (``"schema.table"`` allowed); it must exist.
        columns: the columns to write, in the order tuples list them; default: all of the
            table's, in table order (leave out generated or defaulted ones by naming the rest).
            Dict records give values by column name (absent keys are NULL).
        upsert_key: column(s) of a unique constraint: rows become
            ``INSERT ... ON CONFLICT (key) DO UPDATE`` (the last row of a key wins) instead of
            appends.
        progress_table: where each committed epoch transaction records its epoch (created if
            missing): how recovery knows which epochs the database holds.
        lock_timeout: how long a statement of the durability step may wait for a row lock
            (a duration). Rows of one key (``upsert_key``, or any unique constraint) must all
            come from one sink subtask — ``key_by`` the key before the sink: otherwise one
            subtask's upsert waits for another's *prepared* transaction, which commits only
            after the checkpoint that waits for the first: a deadlock across the protocol,
            which this timeout turns into an error that says so.

    The server must allow prepared transactions (``max_prepared_transactions`` > 0, e.g. as
    many as sink subtasks × 3) under the exactly-once guarantee; the job refuses to start
    otherwise, naming the setting.

    Raises:
        ConfigError: for an invalid argument, when the sink is built.
    """

    local_recovery = True  # each subtask recovers only its own output (failover regions)

    def __init__(self, dsn: str, table: str, *, columns: Sequence[str] | None = None,
                 upsert_key: str | Sequence[str] | None = None, progress_table: str = "epochal_progress",
                 lock_timeout: float | str = 30.0):
        what = "PostgresSink"
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigError(f"{what} dsn: expected a connection string or URL, got "  # never its value: secrets
                              f"{'an empty string' if isinstance(dsn, str) else type(dsn).__name__}")
        if not isinstance(table, str) or not table.strip():
            raise ConfigError(f"{what} table: expected a table name, got {table!r}")
        if columns is not None:
            columns = [columns] if isinstance(columns, str) else list(columns)
            if not columns or not all(isinstance(c, str) and c for c in columns) or len(set(columns)) < len(columns):
                raise ConfigError(f"{what} columns: expected distinct column names, got {columns!r}")
        if upsert_key is not None:
            upsert_key = [upsert_key] if isinstance(upsert_key, str) else list(upsert_key)
            if not upsert_key or not all(isinstance(c, str) and c for c in upsert_key):
                raise ConfigError(f"{what} upsert_key: expected a column name or a list of them, got {upsert_key!r}")
            if columns is not None and not set(upsert_key) <= set(columns):
                raise ConfigError(f"{what} upsert_key {upsert_key} must be among columns {columns}")
        if not isinstance(progress_table, str) or not progress_table:
            raise ConfigError(f"{what} progress_table: expected a table name, got {progress_table!r}")
        self.dsn, self.table, self.columns = dsn, table, columns
        self.upsert_key, self.progress_table = upsert_key, progress_table
        self.lock_timeout = parse_duration(lock_timeout, "PostgresSink lock_timeout")

    def __repr__(self) -> str:
        return f"PostgresSink({self.table!r})"

    def create_writer(self, ctx: SinkContext) -> PostgresSinkWriter:
        return PostgresSinkWriter(self, ctx)

    def hold(self, job: str, sink: str) -> TargetLock:
        """One writer per target: a session-level advisory lock on (job, sink, table), held by
        a connection of the driver for the job's whole life (the server frees it when that
        connection ends, also if the driver dies). A second run of the same job and sink into
        the same table — from another checkpoint storage, or another machine — is refused
        here, naming the run that holds it; without it the second run's recovery would roll
        back the first one's prepared transactions. Different jobs or sinks never collide."""
        return TargetLock.take(self.dsn, job, sink, self.table, f"sink {sink!r} ({self!r})")

    def claim(self, job: str, sink: str, resume: bool) -> None:
        """On the driver: the server answers, the table and columns exist, the progress
        table exists (created if missing). A job that starts afresh (not resuming its
        checkpoints) rolls back what an earlier run of the same job and sink left prepared
        (it belongs to checkpoints the new run will never restore); progress rows stay —
        they name their lineage, so a new run never takes them for its own, and a later
        ``restore_from`` a savepoint of that run still finds what it committed."""
        what = f"sink {sink!r} ({self!r})"
        with connect(self.dsn, what, autocommit=True) as conn:
            found = table_columns(conn, self.table, what)
            chosen = pick_columns(found, self.columns, self.table, what)
            if self.upsert_key and not set(self.upsert_key) <= {c.name for c in chosen}:
                raise ConfigError(f"{what}: upsert_key {self.upsert_key} must be among the written columns "
                                  f"{[c.name for c in chosen]}")
            ensure_progress_table(conn, self.progress_table)
            if not resume:
                sink_id = recovery.sink_hash(job, sink, self.table)
                for (g,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                                         (f"ep-{sink_id}-%",)).fetchall():
                    if recovery.parse_gid(g) is not None:  # only a well-formed gid is interpolated
                        conn.execute(f"ROLLBACK PREPARED '{g}'")

    def lingering(self, job: str, sink: str, promised) -> list[Lingering]:
        """The prepared transactions of this job's sink on the table (``pg_prepared_xacts``),
        those of the checkpoint's pending epochs marked promised."""
        keep = {getattr(h, "gid", None) for h in promised.handles}
        with connect(self.dsn, f"sink {sink!r} ({self!r})", autocommit=True) as conn:
            rows = conn.execute("SELECT gid, prepared FROM pg_prepared_xacts WHERE gid LIKE %s ORDER BY prepared",
                                (f"ep-{recovery.sink_hash(job, sink, self.table)}-%",)).fetchall()
        found = []
        for gid, at in rows:
            g = recovery.parse_gid(gid)
            if g is not None:
                found.append(Lingering(sink, "postgres", gid, gid in keep,
                                       f"prepared transaction of subtask {g.subtask} epoch {g.epoch} "
                                       f"(lineage {g.lineage or '(legacy)'}), prepared at {at}"))
        return found

    def end_lingering(self, job: str, sink: str, items: list, promised) -> None:
        """``ROLLBACK PREPARED`` each item not promised (its gid parsed, never interpolated raw)."""
        keep = {getattr(h, "gid", None) for h in promised.handles}
        with connect(self.dsn, f"sink {sink!r} ({self!r})", autocommit=True) as conn:
            for item in items:
                if item.what in keep or recovery.parse_gid(item.what) is None:
                    continue
                try:
                    conn.execute(f"ROLLBACK PREPARED '{item.what}'")
                except psycopg().errors.UndefinedObject:
                    pass  # ended meanwhile

    def check_run(self, sink: str, checkpoint, mode: SinkMode) -> None:
        """Exactly-once needs prepared transactions: refuse a server that disallows them."""
        if mode is not SinkMode.TRANSACTIONAL:
            return
        with connect(self.dsn, f"sink {sink!r}", autocommit=True) as conn:
            allowed = max_prepared_transactions(conn)
        if allowed == 0:
            raise ConfigError(
                f"sink {sink!r} ({self!r}): the server has max_prepared_transactions = 0, so it cannot prepare the "
                "epoch transactions exactly-once needs; set max_prepared_transactions (e.g. to 3 × the sink's "
                "parallelism or more) in postgresql.conf and restart the server, or run at-least-once")


class TargetLock:
    """A session advisory lock on a sink target, on its own autocommit connection."""

    def __init__(self, conn, key: int):
        self.conn, self.key = conn, key

    @classmethod
    def take(cls, dsn: str, job: str, sink: str, table: str, what: str) -> TargetLock:
        import hashlib
        import os
        import socket

        key = int.from_bytes(hashlib.sha256(f"epochal\0{job}\0{sink}\0{table}".encode()).digest()[:8], "big",
                             signed=True)
        conn = connect(dsn, what, autocommit=True)
        try:
            me = f"epochal job {job} sink {sink}: driver {os.getpid()}@{socket.gethostname()}"[:63]
            conn.execute("SELECT set_config('application_name', %s, false)", (me,))
            if not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
                holder = conn.execute(
                    "SELECT a.application_name, a.client_addr, a.backend_start FROM pg_locks l JOIN pg_stat_activity a "
                    "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND "
                    "l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid",  # a bigint key: high, low 32 bits
                    ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone()
                who = (f"{holder[0] or 'a session'} (connected from {holder[1] or 'a local socket'} since {holder[2]})"
                       if holder else "another session")
                raise ConfigError(
                    f"{what}: another run of job {job!r} is writing table {table!r} through sink {sink!r} now — "
                    f"{who} holds its lock. One writer per target: stop that run first (a second run would roll "
                    "back its prepared transactions), or give this job another name")
        except BaseException:
            conn.close()
            raise
        return cls(conn, key)

    def release(self) -> None:
        """Unlock by ending the session. Idempotent."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def __repr__(self) -> str:
        return f"TargetLock({self.key})"


@dataclass
class PostgresTransaction:
    """Picklable handle of one epoch's transaction: its gid and who prepared it."""

    epoch: int
    subtask: int
    generation: int
    gid: str
    rows: int = 0
    lineage: str = ""  # the run that prepared it (epochal.epochs.lineage); "" before lineages


class _Open:
    """The writer-side state of the open transaction: its connection and COPY (or rows)."""

    def __init__(self, conn, copy_cm=None, copy=None):
        self.conn, self.copy_cm, self.copy = conn, copy_cm, copy
        self.rows: list = []


class PostgresSinkWriter(TwoPhaseCommitSink):
    """The per-task writer of a :class:`PostgresSink` (the two-phase-commit hooks only)."""

    def __init__(self, sink: PostgresSink, ctx: SinkContext):
        super().__init__(ctx)
        self._pg = psycopg()
        self._sink = sink
        self._what = f"sink {ctx.sink_name!r} ({sink!r})"
        self._transactional = ctx.mode is SinkMode.TRANSACTIONAL
        self._sink_id = recovery.sink_hash(ctx.job, ctx.sink_name, sink.table)
        self._lineage = ctx.lineage_id
        self._admin = None  # autocommit connection: COMMIT/ROLLBACK PREPARED, progress queries
        self._pool: list = []  # idle transaction connections
        self._pool_lock = threading.Lock()  # the uploader returns connections
        self._live: dict[str, _Open] = {}  # gid (or txn id) -> the open transaction's state
        self._rows: RowMaker | None = None
        self._seq = 0
        self._commits = 0

    # ------------------------------------------------------------------ setup

    def _start(self) -> None:
        if self._admin is not None:
            return
        self._admin = connect(self._sink.dsn, self._what, autocommit=True)
        cols = pick_columns(table_columns(self._admin, self._sink.table, self._what), self._sink.columns,
                            self._sink.table, self._what)
        self._rows = RowMaker(cols)
        table, names = quote_ident(self._sink.table), ", ".join(quote_ident(c.name) for c in cols)
        self._copy_sql = f"COPY {table} ({names}) FROM STDIN"
        if self._sink.upsert_key:
            key = ", ".join(quote_ident(c) for c in self._sink.upsert_key)
            rest = [c.name for c in cols if c.name not in self._sink.upsert_key]
            action = ("DO UPDATE SET " + ", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in rest)
                      if rest else "DO NOTHING")
            marks = ", ".join(["%s"] * len(cols))
            self._upsert_sql = f"INSERT INTO {table} ({names}) VALUES ({marks}) ON CONFLICT ({key}) {action}"
        progress = quote_ident(self._sink.progress_table)
        self._progress_sql = (f"INSERT INTO {progress} (job, sink, target, lineage, subtask, epoch, generation) "
                              "VALUES (%s, %s, %s, %s, %s, %s, %s)")
        self._committed_sql = (f"SELECT subtask, max(epoch) FROM {progress} WHERE job = %s AND sink = %s AND "
                               "target = %s AND lineage = %s GROUP BY subtask")
        self._prune_sql = (f"DELETE FROM {progress} WHERE job = %s AND sink = %s AND target = %s AND lineage = %s "
                           "AND subtask = %s AND epoch < %s")

    def _connection(self):
        with self._pool_lock:
            if self._pool:
                return self._pool.pop()
        conn = connect(self._sink.dsn, self._what)
        conn.execute(f"SET lock_timeout = {int(self._sink.lock_timeout * 1000)}")
        conn.commit()
        return conn

    def _release(self, conn) -> None:
        with self._pool_lock:
            self._pool.append(conn)

    # ------------------------------------------------------------------ hooks

    def begin_transaction(self, epoch: int) -> PostgresTransaction:
        self._start()
        self._seq += 1  # DIRECT mode begins several transactions per epoch
        g = recovery.gid(self._sink_id, self.ctx.subtask, epoch, self.ctx.generation, self._lineage)
        return PostgresTransaction(epoch, self.ctx.subtask, self.ctx.generation,
                                   g if self._transactional else f"{g}-t{self._seq}", lineage=self._lineage)

    def write_to(self, txn: PostgresTransaction, record: Any) -> None:
        self.write_many_to(txn, [record])

    def write_many_to(self, txn: PostgresTransaction, records: list) -> None:
        make = self._rows
        rows = []
        for record in records:
            try:
                rows.append(make(record))
            except (TypeError, ValueError) as exc:
                raise SinkWriteError(self.ctx.sink_name, record, str(exc)) from exc
        if not rows:
            return
        state = self._live.get(txn.gid) or self._begin(txn)
        if self._sink.upsert_key:
            state.rows.extend(rows)
        else:
            write_row = state.copy.write_row
            for row in rows:
                write_row(row)
        txn.rows += len(rows)

    def write_batch_to(self, txn: PostgresTransaction, batch) -> None:
        self.write_many_to(txn, batch.to_pylist())

    def _begin(self, txn: PostgresTransaction) -> _Open:
        conn = self._connection()
        state = _Open(conn)
        if not self._sink.upsert_key:
            state.copy_cm = conn.cursor().copy(self._copy_sql)
            state.copy = state.copy_cm.__enter__()
        self._live[txn.gid] = state
        return state

    def pre_commit(self, txn: PostgresTransaction):
        """Seal: detach the transaction's connection from the writer (O(1)); the durability
        step ends the COPY (or runs the upserts), records the epoch, and prepares."""
        state = self._live.pop(txn.gid, None)
        if state is None:
            return None  # no rows: nothing to prepare
        return functools.partial(self._prepare, txn, state)

    def _prepare(self, txn: PostgresTransaction, state: _Open) -> None:
        """The durability step (uploader thread): touches only ``state``'s connection.

        1. End the COPY, or run the epoch's upserts in order, in one pipeline.
        2. Exactly-once: insert the epoch's progress row and ``PREPARE TRANSACTION gid``.
           At-least-once: ``COMMIT``.
        3. Return the connection to the pool.
        """
        conn = state.conn
        try:
            # Step 1
            if state.copy_cm is not None:
                state.copy_cm.__exit__(None, None, None)
            else:
                with conn.cursor() as cur:
                    cur.executemany(self._upsert_sql, state.rows)
            # Step 2
            if self._transactional:
                conn.execute(self._progress_sql, (self.ctx.job, self.ctx.sink_name, self._sink.table, txn.lineage,
                                                  txn.subtask, txn.epoch, txn.generation))
                conn.execute(f"PREPARE TRANSACTION '{txn.gid}'")
            else:
                conn.commit()
        except self._pg.errors.LockNotAvailable as exc:
            conn.close()
            raise SinkCommitError(
                f"{self._where()}: epoch {txn.epoch} waited more than lock_timeout={self._sink.lock_timeout:g} s for a "
                f"row lock ({self._pg_error(exc)}): rows of one key probably come from several sink subtasks, and one "
                "waits for another's prepared transaction, which commits only after this checkpoint; key_by the "
                "upsert key (or unique column) before the sink") from exc
        except self._pg.Error as exc:
            conn.close()
            raise SinkCommitError(f"{self._where()}: epoch {txn.epoch}: {self._pg_error(exc)}") from exc
        # Step 3
        self._release(conn)

    def commit(self, txn: PostgresTransaction) -> None:
        """``COMMIT PREPARED``; if the server no longer has the gid, the progress rows decide
        (committed: nothing to do; else the epoch is lost). Every ``SWEEP_EVERY`` commits,
        roll back what zombies of older generations prepared and prune progress rows."""
        if not self._transactional or not txn.rows:
            return
        self._start()
        try:
            self._admin.execute(f"COMMIT PREPARED '{txn.gid}'")
        except self._pg.errors.UndefinedObject:
            lineage = getattr(txn, "lineage", "")  # handles pickled before lineages have none
            action = recovery.resolve(txn.epoch, txn.subtask, txn.gid, self._committed(lineage), self._prepared())
            if action is recovery.Action.LOST:
                raise SinkCommitError(
                    f"{self._where()}: epoch {txn.epoch} of subtask {txn.subtask} was pre-committed (prepared as "
                    f"{txn.gid!r}) but the server neither has it prepared nor committed it: was it rolled back "
                    "by hand? Its rows are lost") from None
        self._commits += 1
        if self._commits % SWEEP_EVERY == 0:
            self._sweep(generation_below=self.ctx.generation)
            self._admin.execute(self._prune_sql, (self.ctx.job, self.ctx.sink_name, self._sink.table, self._lineage,
                                                  self.ctx.subtask, txn.epoch))

    def abort(self, txn: PostgresTransaction) -> None:
        state = self._live.pop(txn.gid, None)
        if state is not None:
            state.conn.close()  # the server rolls the open transaction back

    def cleanup_orphans(self, restored_epoch: int) -> None:
        """After the restored pending epochs were committed: roll back every other prepared
        transaction of this subtask and of the subtasks it absorbs, of any generation and
        lineage; then say so if this run rolls back output (restored an epoch older than what
        the restored lineage committed here: the epochs after it are produced again)."""
        self._start()
        self._sweep(generation_below=None)
        lineage = self.ctx.lineage
        if lineage is not None and lineage.parent is not None and lineage.parent != self._lineage:
            ahead = self._committed(lineage.parent).get(self.ctx.subtask, 0)
            if ahead > restored_epoch:
                log.warning("%s: restored epoch %d of lineage %s, which committed epochs up to %d into %s: this run "
                            "(lineage %s) produces the epochs after %d again (a rollback to an older savepoint or "
                            "checkpoint)", self._where(), restored_epoch, lineage.parent or "(legacy)", ahead,
                            self._sink.table, self._lineage, restored_epoch)

    def release_clients(self) -> None:
        """Close every connection: open transactions roll back with them; prepared ones stay
        (the restored checkpoint may promise them) for the next writer to commit or sweep."""
        conns = [state.conn for state in self._live.values()] + self._pool + [self._admin]
        self._live.clear()
        self._pool = []
        self._admin = None
        for conn in conns:
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass

    # ------------------------------------------------------------------ server state

    def _prepared(self) -> set[str]:
        rows = self._admin.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                                   (f"ep-{self._sink_id}-%",)).fetchall()
        return {r[0] for r in rows}

    def _committed(self, lineage: str) -> dict[int, int]:
        """Subtask → the highest epoch ``lineage`` committed into the target (its progress rows)."""
        rows = self._admin.execute(self._committed_sql,
                                   (self.ctx.job, self.ctx.sink_name, self._sink.table, lineage)).fetchall()
        return {int(s): int(e) for s, e in rows}

    def _sweep(self, generation_below: int | None) -> None:
        keep = {t.handle.gid for t in self._pending}
        for g in recovery.orphans(self._sink_id, self.ctx.subtask, self.ctx.parallelism, self._prepared(), keep,
                                  generation_below):
            try:
                self._admin.execute(f"ROLLBACK PREPARED '{g}'")
                log.info("%s: rolled back orphaned prepared transaction %s", self._where(), g)
            except self._pg.errors.UndefinedObject:
                pass  # ended meanwhile (another writer's sweep)

    def _pg_error(self, exc: BaseException) -> str:
        text = " ".join(str(exc).split())[:500]
        if "max_prepared_transactions" in text or "prepared transactions are disabled" in text:
            text += " (set max_prepared_transactions > 0 on the server)"
        return text
