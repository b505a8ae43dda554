"""What the Delta source and sink share: the client library, table URIs and storage
options, opening a table with errors that name the operator, schemas, the table's files,
and Delta's partition-value encoding (protocol "Partition Value Serialization").

deltalake (delta-rs) is an optional extra: :func:`deltalake` imports it on first use and
says how to install it, so ``import epochal`` never needs it. delta-rs starts a tokio
runtime on first use that does not survive ``fork()``: only task processes (forked from a
zygote that never touches a table) and the driver use it, never a forked snapshot child.
"""
from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping
from urllib.parse import quote, urlparse

import pyarrow as pa

from epochal.connectors.staging import TableFiles
from epochal.errors import ConfigError

EXTRA = "pip install 'epochal[delta]'"

#: URI schemes delta-rs opens (no scheme: a local path)
SCHEMES = frozenset({"", "file", "s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "adl", "memory", "lakefs"})

#: Delta's directory name for a null partition value (Hive's)
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def deltalake():
    """The ``deltalake`` module, or ConfigError naming the extra to install."""
    try:
        import deltalake as dl
    except ImportError:  # pragma: no cover - the test extra installs it
        raise ConfigError(f"Delta Lake connectors need the deltalake package: {EXTRA}") from None
    return dl


def check_uri(uri, what: str) -> str:
    """``uri`` as delta-rs should see it: a local path made absolute (task processes and
    Spark executors have other working directories), a URL as given.

    Raises:
        ConfigError: not a string, empty, or a scheme delta-rs cannot open.
    """
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"{what} table_uri: expected a path or URL of a Delta table, got {uri!r}")
    scheme = urlparse(uri).scheme.lower() if "://" in uri else ""
    if scheme not in SCHEMES:
        raise ConfigError(f"{what} table_uri {uri!r}: unknown scheme {scheme!r}; delta-rs opens local paths, "
                          f"file://, s3://, gs://, az://, abfss:// (one of {sorted(s for s in SCHEMES if s)})")
    if scheme == "":
        return os.path.abspath(uri)
    if scheme == "file":
        path = uri[len("file://"):]
        if not path.startswith("/"):
            raise ConfigError(f"{what} table_uri {uri!r}: a file:// URL needs an absolute path (file:///dir/table)")
        return "file://" + os.path.normpath(path)
    return uri.rstrip("/")


def local_path(uri: str) -> str | None:
    """The local directory of ``uri`` (from :func:`check_uri`), None for remote tables."""
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri if "://" not in uri else None


def check_storage_options(options, what: str) -> dict[str, str] | None:
    """delta-rs storage options (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...): str → str."""
    if options is None:
        return None
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigError(f"{what} storage_options: expected a dict of delta-rs storage options (str -> str), "
                          f"got {options!r}")
    return {k: str(v) for k, v in options.items()}


def open_table(uri: str, storage_options: dict | None, what: str, version: int | None = None):
    """The ``DeltaTable`` at ``uri`` (at ``version`` if given), or None if there is none.

    Raises:
        ConfigError: the location cannot be read (credentials, endpoint, bad bucket), naming it.
    """
    dl = deltalake()
    from deltalake.exceptions import TableNotFoundError

    try:
        return dl.DeltaTable(uri, version=version, storage_options=storage_options)
    except TableNotFoundError:
        return None
    except (OSError, dl.exceptions.DeltaError, ValueError) as exc:
        if version is not None and "version" in str(exc).lower():
            raise ConfigError(f"{what}: Delta table {uri} has no version {version}: {_short(exc)}") from None
        raise ConfigError(f"{what}: cannot open the Delta table at {uri}: {_short(exc)} (is the URI right, and "
                          "storage_options set for its store?)") from None


def require_table(uri: str, storage_options: dict | None, what: str, version: int | None = None):
    """:func:`open_table`, or ConfigError if no table is there."""
    dt = open_table(uri, storage_options, what, version)
    if dt is None:
        raise ConfigError(f"{what}: there is no Delta table at {uri} (no _delta_log); check the URI")
    return dt


def arrow_schema(dt) -> pa.Schema:
    """The table's schema as a ``pyarrow.Schema`` (delta types mapped by delta-rs)."""
    return pa.schema(dt.schema().to_arrow())


def delta_fields(schema: pa.Schema) -> list[tuple[str, str]]:
    """``(name, delta type)`` per column of an Arrow schema, as Delta would store it."""
    dl = deltalake()
    fields = json.loads(dl.Schema.from_arrow(schema).to_json())["fields"]
    return [(f["name"], json.dumps(f["type"], sort_keys=True)) for f in fields]


def schema_differences(given: pa.Schema, table: pa.Schema) -> list[str]:
    """How ``given`` differs from the table's schema in Delta types (nullability aside)."""
    a, b = dict(delta_fields(given)), dict(delta_fields(table))
    out = [f"column {n!r} is not in the table" for n in a if n not in b]
    out += [f"table column {n!r} is missing" for n in b if n not in a]
    out += [f"column {n!r} is {a[n]} but the table has {b[n]}" for n in a if n in b and a[n] != b[n]]
    if not out and list(a) != list(b):
        out.append(f"column order {list(a)} differs from the table's {list(b)}")
    return out


def check_appendable(dt, uri: str, what: str) -> None:
    """Refuse tables whose writer rules a plain append of parquet files would break:
    CHECK constraints, column invariants, generated or identity columns (delta-rs checks
    those only in its own writer) and column mapping (files need physical column names)."""
    config = dt.metadata().configuration or {}
    problems = [f"CHECK constraint {k[len('delta.constraints.'):]!r}" for k in config
                if k.startswith("delta.constraints.")]
    mode = config.get("delta.columnMapping.mode")
    if mode not in (None, "none"):
        problems.append(f"column mapping (delta.columnMapping.mode={mode})")
    for field in json.loads(dt.schema().to_json())["fields"]:
        for key in field.get("metadata", {}):
            if key in ("delta.invariants", "delta.generationExpression") or key.startswith("delta.identity."):
                problems.append(f"column {field['name']!r} has {key}")
    if problems:
        raise ConfigError(f"{what}: the Delta table at {uri} has {', '.join(problems)}; this sink appends parquet "
                          "files without evaluating them, so it refuses the table")


def hidden_dir(name: str) -> bool:
    """Whether a directory of a Delta table holds no data files: ``.`` first, or ``_`` first
    (``_delta_log``, ``_change_data``) unless it is a partition directory ``col=value``
    (a partition column may start with ``_``)."""
    return name.startswith(".") or (name.startswith("_") and "=" not in name)


def referenced(dt) -> set[str]:
    """Relative paths of the files the table's current version references."""
    from urllib.parse import unquote

    actions = pa.table(dt.get_add_actions(flatten=False))
    return {unquote(p) for p in actions.column("path").to_pylist()}


def table_files(uri: str, storage_options: dict | None) -> TableFiles:
    """The files of the table at ``uri``: the local directory, or the store through
    delta-rs's own file system (same storage options as the table)."""
    local = local_path(uri)
    if local is not None:
        return TableFiles(local=local)
    import pyarrow.fs as pafs
    from deltalake.fs import DeltaStorageHandler

    return TableFiles(fs=pafs.PyFileSystem(DeltaStorageHandler(uri, storage_options)))


# ------------------------------------------------------------------ partition values

_PARTITION_TYPES = "string, integer, boolean and date"


def check_partition_type(column: str, typ: pa.DataType, what: str) -> None:
    if not (pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_integer(typ)
            or pa.types.is_boolean(typ) or pa.types.is_date32(typ)):
        raise ConfigError(f"{what}: partition column {column!r} has type {typ}; partition columns of "
                          f"{_PARTITION_TYPES} type are supported")


def encode_partition_value(value) -> str | None:
    """A partition value as the Delta log stores it (``partitionValues``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def decode_partition_value(text: str | None, typ: pa.DataType):
    """The Python value of a ``partitionValues`` string for a column of type ``typ``."""
    if text is None:
        return None
    if pa.types.is_boolean(typ):
        return text.lower() == "true"
    if pa.types.is_integer(typ):
        return int(text)
    if pa.types.is_date32(typ):
        return datetime.date.fromisoformat(text[:10])
    return text


def partition_dir(columns: list[str], values: tuple) -> str:
    """``col=value/...`` for a partition (values percent-encoded as delta-rs does)."""
    parts = []
    for column, value in zip(columns, values):
        encoded = encode_partition_value(value)
        parts.append(f"{column}={NULL_PARTITION if encoded is None else quote(encoded, safe='')}")
    return "/".join(parts)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"
