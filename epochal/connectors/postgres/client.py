"""What the PostgreSQL sink asks the server, on the driver and in tasks: the driver
(psycopg 3, an optional extra), connections, a table's columns, the server's settings and
the progress table that records which epochs the database holds."""
from __future__ import annotations

from dataclasses import dataclass

from epochal.connectors.redaction import dsn_secrets, redact
from epochal.errors import ConfigError

#: seconds to wait for a connection
CONNECT_TIMEOUT_S = 10


def psycopg():
    """The ``psycopg`` module, or ConfigError naming the extra to install."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the test extra installs it
        raise ConfigError("PostgresSink needs psycopg 3: pip install 'epochal[postgres]'") from None
    return psycopg


def connect(dsn: str, what: str, *, autocommit: bool = False):
    """A connection to ``dsn``; ConfigError naming the sink and the server's answer, with
    the DSN's secrets masked (:mod:`epochal.connectors.redaction`: a malformed DSN's parser
    quotes fragments of it, and the cause reaches logs, the dashboard and ``JobFailedError``)."""
    pg = psycopg()
    try:
        return pg.connect(dsn, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S)
    except (pg.OperationalError, pg.ProgrammingError) as exc:  # ProgrammingError: a DSN that does not parse
        raise ConfigError(f"{what}: cannot connect to PostgreSQL ({redact(_one_line(exc), dsn_secrets(dsn))}); is "
                          "the server running and the DSN right?") from None


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # pg_type.typname, e.g. int8, text, jsonb, _int4 (an array)
    not_null: bool


def table_columns(conn, table: str, what: str) -> list[Column]:
    """The table's columns in table order; ConfigError if the table does not exist."""
    pg = psycopg()
    try:
        rows = conn.execute(
            "SELECT a.attname, t.typname, a.attnotnull FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (quote_ident(table),)).fetchall()  # the name as the writes quote it: case kept
    except (pg.errors.UndefinedTable, pg.errors.InvalidSchemaName):
        conn.rollback()
        raise ConfigError(f"{what}: table {table!r} does not exist; create it first") from None
    return [Column(name, typ, bool(nn)) for name, typ, nn in rows]


def pick_columns(found: list[Column], wanted: list[str] | None, table: str, what: str) -> list[Column]:
    """``wanted`` columns (all of the table's when None), each checked to exist."""
    if wanted is None:
        return found
    by_name = {c.name: c for c in found}
    missing = [c for c in wanted if c not in by_name]
    if missing:
        raise ConfigError(f"{what}: table {table!r} has no column(s) {missing} (it has {[c.name for c in found]})")
    return [by_name[c] for c in wanted]


def max_prepared_transactions(conn) -> int:
    return int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])


#: the progress table's primary key: an epoch of one run (lineage) of one sink subtask
PROGRESS_KEY = ("job", "sink", "target", "lineage", "subtask", "epoch")


def ensure_progress_table(conn, table: str) -> None:
    """Create the progress table unless it exists: one row per committed epoch transaction of
    a (job, sink, target table, lineage, subtask); the newest per lineage are kept. A table
    made by a version without lineages gains the column ("" for its rows) and the new key."""
    name = quote_ident(table)
    conn.execute(f"CREATE TABLE IF NOT EXISTS {name} (job text NOT NULL, sink text NOT NULL, "
                 "target text NOT NULL, lineage text NOT NULL DEFAULT '', subtask int NOT NULL, "
                 "epoch bigint NOT NULL, generation bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), "
                 f"PRIMARY KEY ({', '.join(PROGRESS_KEY)}))")
    key = conn.execute(
        "SELECT c.conname, array_agg(a.attname::text) FROM pg_constraint c JOIN pg_attribute a "
        "ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey) WHERE c.conrelid = %s::regclass AND c.contype = 'p' "
        "GROUP BY c.conname", (name,)).fetchone()
    if key is None or "lineage" not in key[1]:
        conn.execute(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS lineage text NOT NULL DEFAULT ''")
        drop = f"DROP CONSTRAINT {quote_ident(key[0])}, " if key is not None else ""
        conn.execute(f"ALTER TABLE {name} {drop}ADD PRIMARY KEY ({', '.join(PROGRESS_KEY)})")


def quote_ident(name: str) -> str:
    """A (possibly schema-qualified) name as SQL identifiers: ``a.b`` → ``"a"."b"``."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]
