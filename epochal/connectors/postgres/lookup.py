"""``PostgresTable``: a PostgreSQL table read by key, for lookup enrichment
(:mod:`epochal.lookup`; outside the exactly-once cut)."""
from __future__ import annotations

from epochal.connectors.postgres.client import connect, pick_columns, quote_ident, table_columns
from epochal.lookup.api import LookupTable

__all__ = ["PostgresTable"]


class PostgresTable(LookupTable):
    """Rows of ``table`` by ``key_column``: each row a dict of ``columns`` (all by default).
    One connection per task, opened at the first fetch (autocommit: each fetch reads the
    latest committed rows); a broken connection is reopened once per fetch."""

    def __init__(self, dsn: str, table: str, key_column: str, columns: list[str] | None = None):
        self.dsn, self.table, self.key_column, self.columns = dsn, table, key_column, columns
        self._conn = None
        self._sql = ""
        self._names: list[str] = []

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_conn"] = None
        return state

    def _open(self):
        what = f"PostgresTable {self.table!r}"
        conn = connect(self.dsn, what, autocommit=True)
        found = table_columns(conn, self.table, what)
        pick_columns(found, [self.key_column], self.table, what)  # the key column exists
        names = [c.name for c in pick_columns(found, self.columns, self.table, what)]
        self._names = names
        self._sql = (f"SELECT {quote_ident(self.key_column)}, {', '.join(map(quote_ident, names))} FROM "
                     f"{quote_ident(self.table)} WHERE {quote_ident(self.key_column)} = ANY(%s)")
        return conn

    def fetch(self, keys: list) -> dict:
        for attempt in (0, 1):
            conn = self._conn = self._conn if self._conn is not None else self._open()
            try:
                with conn.cursor() as cur:
                    cur.execute(self._sql, (list(keys),))
                    return {r[0]: dict(zip(self._names, r[1:])) for r in cur.fetchall()}
            except Exception:
                self.close()
                if attempt:
                    raise
        return {}

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
