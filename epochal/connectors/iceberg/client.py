"""What the Iceberg sink needs from pyiceberg: the client library, catalogs given by name or
properties, tables with errors that name the operator, the commit-retry property, schemas,
and the table's data directory.

pyiceberg is an optional extra: :func:`pyiceberg` imports it on first use and says how to
install it, so ``import epochal`` never needs it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

import pyarrow as pa

from epochal.connectors.iceberg.recovery import EXPIRED
from epochal.connectors.staging import TableFiles
from epochal.errors import ConfigError

EXTRA = "pip install 'epochal[iceberg]'"

#: the table property whose retries re-apply a stale writer's append (a duplicate, measured)
RETRIES = "commit.retry.num-retries"


def pyiceberg():
    """The ``pyiceberg`` package, or ConfigError naming the extra to install."""
    try:
        import pyiceberg as pi
        import pyiceberg.catalog  # noqa: F401
        import pyiceberg.io.pyarrow  # noqa: F401
    except ImportError:  # pragma: no cover - the test extra installs it
        raise ConfigError(f"Iceberg connectors need pyiceberg: {EXTRA}") from None
    return pi


def check_catalog(catalog, what: str) -> tuple[str, dict]:
    """``(name, properties)`` of a catalog given as its name (configured in
    ``~/.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__*``) or a dict of properties
    (``{"type": "sql", "uri": "sqlite:///...", "warehouse": "file:///..."}``; optional
    ``"name"``). Catalog objects hold connections and cannot be shipped to tasks."""
    if isinstance(catalog, str) and catalog.strip():
        return catalog, {}
    if isinstance(catalog, Mapping) and all(isinstance(k, str) for k in catalog):
        props = {k: str(v) for k, v in catalog.items()}
        return props.pop("name", "default"), props
    raise ConfigError(f"{what} catalog: expected a catalog name or a dict of catalog properties (e.g. "
                      f"{{'type': 'sql', 'uri': 'sqlite:///cat.db', 'warehouse': 'file:///wh'}}), got "
                      f"{type(catalog).__name__}: a Catalog object cannot be shipped to the tasks")


def check_identifier(table, what: str) -> tuple[str, ...]:
    """``"namespace.table"`` (or a tuple of parts) as a tuple of identifier parts."""
    parts = tuple(table.split(".")) if isinstance(table, str) else tuple(table) if isinstance(table, (tuple, list)) else ()
    if len(parts) < 2 or not all(isinstance(p, str) and p for p in parts):
        raise ConfigError(f"{what} table: expected 'namespace.table' (or a tuple of names), got {table!r}")
    return parts


def load_catalog(name: str, properties: dict, what: str):
    pi = pyiceberg()
    try:
        return pi.catalog.load_catalog(name, **properties)
    except Exception as exc:
        raise ConfigError(f"{what}: cannot load the Iceberg catalog {name!r} ({_describe(properties)}): "
                          f"{_short(exc)}") from None


def load_table(catalog, identifier: tuple[str, ...], what: str):
    """The table, or None if the catalog has no such table (or namespace)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    except Exception as exc:
        raise ConfigError(f"{what}: cannot load the Iceberg table {'.'.join(identifier)}: {_short(exc)}") from None


def require_table(catalog, identifier: tuple[str, ...], what: str):
    table = load_table(catalog, identifier, what)
    if table is None:
        raise ConfigError(f"{what}: the Iceberg catalog has no table {'.'.join(identifier)}; check the name, or "
                          "pass IcebergSink(..., schema=pyarrow.schema([...])) to create it")
    return table


def close_catalog(catalog) -> None:
    """Release a catalog's connections (a SQL catalog's engine pool); None is fine."""
    engine = getattr(catalog, "engine", None)
    if engine is not None and hasattr(engine, "dispose"):
        engine.dispose()


def retries_disabled(table) -> bool:
    return table.metadata.properties.get(RETRIES) == "0"


def arrow_schema(table) -> pa.Schema:
    """The table's schema as Arrow, with Iceberg field ids (``PARQUET:field_id``) so the data
    files carry them, as pyiceberg's own writer does."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(table.schema())


def _norm(t: pa.DataType) -> str:
    if pa.types.is_large_string(t):
        return "string"
    if pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return f"list<{_norm(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_norm(f.type)}" for f in t) + ">"
    return str(t)


def schema_differences(given: pa.Schema, table: pa.Schema) -> list[str]:
    """How ``given`` differs from the table's (Arrow-mapped) schema, nullability aside."""
    a = {f.name: _norm(f.type) for f in given}
    b = {f.name: _norm(f.type) for f in table}
    out = [f"column {n!r} is not in the table" for n in a if n not in b]
    out += [f"table column {n!r} is missing" for n in b if n not in a]
    out += [f"column {n!r} is {a[n]} but the table has {b[n]}" for n in a if n in b and a[n] != b[n]]
    return out


def data_files(table, what: str) -> tuple[TableFiles, str]:
    """The table's data directory: ``(files, prefix)`` where ``prefix`` is the relative
    directory of new data files (``data``) under ``files``."""
    io = table.io
    location = table.location().rstrip("/")
    parse = getattr(io, "parse_location", None)
    scheme, netloc, path = parse(location) if parse else ("", "", location)
    if scheme in ("file", ""):
        return TableFiles(local=path), "data"
    fs_by_scheme = getattr(io, "fs_by_scheme", None)
    if fs_by_scheme is None:
        raise ConfigError(f"{what}: the table's FileIO ({type(io).__name__}) gives no pyarrow file system for "
                          f"{location}; use pyiceberg's PyArrowFileIO (py-io-impl)")
    return TableFiles(fs=fs_by_scheme(scheme, netloc), root=path), "data"


def full_path(table, rel: str) -> str:
    """The URI Iceberg records for a data file at ``rel`` under the table location."""
    location = table.location().rstrip("/")
    return f"{location}/{rel}" if "://" in location else f"file://{location}/{rel}"


#: ``scheme://user:password@`` in a URI (a catalog's database URL)
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):[^@\s/]*@")


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` replaced by ``***``."""
    return _CREDENTIALS.sub(lambda m: f"{m.group('head')}:***@", text)


def _describe(properties: dict) -> str:
    shown = {k: v for k, v in properties.items() if not any(s in k.lower() for s in ("secret", "password", "token",
                                                                                        "credential", "key"))}
    return redact(", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "configured by name")


def _short(exc: BaseException, limit: int = 300) -> str:
    text = redact(" ".join(str(exc).split()))
    return f"{type(exc).__name__}: {text[:limit]}"


def ancestry(table):
    """``(snapshot id, summary properties)`` of the current snapshot and its ancestors, newest
    first; then ``(parent id, EXPIRED)`` if older snapshots were expired
    (:func:`expired_before`).

    Linear: the snapshots are indexed once (pyiceberg's ``ancestors_of`` looks each parent up
    with a scan of every snapshot: quadratic in the table's history)."""
    current = table.current_snapshot()
    if current is None:
        return
    by_id = {snapshot.snapshot_id: snapshot for snapshot in table.metadata.snapshots}
    snapshot = current
    while True:
        s = snapshot.summary
        yield snapshot.snapshot_id, (dict(s.additional_properties) if s is not None else None)
        parent = snapshot.parent_snapshot_id
        if parent is None:
            if expired_before(table, snapshot):
                yield None, EXPIRED
            return
        snapshot = by_id.get(parent)
        if snapshot is None:
            yield parent, EXPIRED
            return


def expired_before(table, root) -> bool:
    """Whether snapshots older than ``root`` (an ancestor without a parent) were expired:
    pyiceberg's ``expire_snapshots`` clears the parent id of what remains, but in a format
    v2 table the first snapshot has sequence number 1 and every commit adds one."""
    return table.metadata.format_version >= 2 and (root.sequence_number or 0) > 1
