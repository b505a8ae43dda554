"""DeltaSource: a Delta table's rows, replayable by (version, file index, row).

Like Spark's Delta streaming source, the source reads a **snapshot** (every file of one
version, in path order) and then, version after version, the files each later commit
**added** (in log order), read from the commit's JSON in ``_delta_log/`` (seed 004 §4.1.3.1
"Regular Sources": the table's log indexes and sequences the data durably, so an offset into
it is enough to replay). Bounded by default (the snapshot of the version current at plan
time); ``follow=True`` keeps polling for new versions and never finishes.

Offsets: per split, ``{"v": version, "i": file index, "r": row, "s": 1 while in the
snapshot of v}`` — the next row to read. The file index counts all files of the snapshot or
commit, so it means the same for every split; split ``k`` of ``splits`` reads the files
with ``crc32(path) % splits == k`` (the engine assigns split ``k`` to subtask
``k % parallelism``).

A commit that removes data (a DELETE, UPDATE, MERGE or overwrite: a ``remove`` with
``dataChange``) cannot be followed by a stream of appends and raises, unless
``ignore_changes=True``: then removals are ignored and the files such a commit adds are read
like any others (rows it rewrote appear again, as with Spark's ``ignoreChanges``). Commits
that only reorganise files (``dataChange: false``, e.g. OPTIMIZE) are skipped. Tables with
deletion vectors or column mapping are refused (their files alone are not the rows).
"""
from __future__ import annotations

import json
import time
import zlib
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from epochal.config import parse_duration
from epochal.connectors.delta import client
from epochal.errors import ConfigError
from epochal.sources.base import Poll, Source, SourceReader, check_max_records, check_positive_int

__all__ = ["DeltaSource", "DeltaSourceError"]


class DeltaSourceError(ConfigError):
    """The table cannot be followed from the source's offset (a commit removed data, the
    log was cleaned up past the offset, the table uses a feature the source cannot read)."""


class DeltaSource(Source):
    """The rows of the Delta table at ``table_uri`` (see the module docstring).

    Args:
        table_uri: local path, ``file://``, ``s3://`` (or another store delta-rs opens).
        storage_options: delta-rs storage options, also used to read the files.
        version: read the snapshot of this version (default: the latest when the job is
            planned), then the versions after it if ``follow``.
        starting_version: instead of a snapshot, read the files added by this version and
            the ones after it (up to the latest at plan time, or forever with ``follow``).
        follow: keep reading new versions as they are committed (unbounded).
        poll_interval: seconds (or ``"500ms"``) between looks for a new version.
        columns: the columns to read (default all, in table order).
        splits: how many splits share the files (by a stable hash of the path).
        columnar: emit ``pyarrow.RecordBatch``es (a columnar stream) instead of dicts.
        batch_rows: rows per batch read from a file.
        ignore_changes: read on past commits that remove data instead of raising.

    Raises:
        ConfigError: for an invalid argument when the source is built; when the job is
            planned, for a missing table or version, or a table the source cannot read.
    """

    def __init__(self, table_uri, *, storage_options: dict | None = None, version: int | None = None,
                 starting_version: int | None = None, follow: bool = False, poll_interval: float | str = 1.0,
                 columns: list[str] | None = None, splits: int = 1, columnar: bool = False, batch_rows: int = 8192,
                 ignore_changes: bool = False):
        what = "DeltaSource"
        self._uri = client.check_uri(table_uri, what)
        self._options = client.check_storage_options(storage_options, what)
        for key, value in (("version", version), ("starting_version", starting_version)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"{what} {key}: expected a table version (an integer >= 0) or None, got {value!r}")
        if version is not None and starting_version is not None:
            raise ConfigError(f"{what}: version (read a snapshot) and starting_version (read changes from a version) "
                              "exclude each other")
        if columns is not None and (not isinstance(columns, (list, tuple)) or not columns
                                    or not all(isinstance(c, str) for c in columns)):
            raise ConfigError(f"{what} columns: expected a non-empty list of column names, got {columns!r}")
        self._version, self._starting = version, starting_version
        self._follow = bool(follow)
        self._interval = parse_duration(poll_interval, f"{what} poll_interval")
        self._columns = list(columns) if columns is not None else None
        self._splits = check_positive_int(splits, "splits", what)
        self._columnar = bool(columnar)
        self._batch_rows = check_positive_int(batch_rows, "batch_rows", what)
        self._ignore_changes = bool(ignore_changes)
        self._plan: dict | None = None

    @property
    def name(self) -> str:
        return f"DeltaSource({self._uri!r})"

    def locations(self) -> tuple[str, ...]:
        return (self._uri,)

    @property
    def schema(self):
        """The batches' schema when ``columnar`` (read from the table on first use)."""
        return self._planned()["schema"] if self._columnar else None

    def splits(self) -> list[int]:
        self._planned()
        return list(range(self._splits))

    def _planned(self) -> dict:
        """Resolve, once, on the driver: the snapshot version, the first and last version of
        changes to read, and the output schema (shipped with the source)."""
        if self._plan is not None:
            return self._plan
        dt = client.require_table(self._uri, self._options, self.name, self._version)
        check_readable(dt, self.name)
        latest = dt.version()
        table = client.arrow_schema(dt)
        partitions = list(dt.metadata().partition_columns)
        columns = self._columns or table.names
        unknown = [c for c in columns if c not in table.names]
        if unknown:
            raise ConfigError(f"{self.name} columns: {unknown} are not columns of the table {table.names}")
        for c in partitions:
            if c in columns:
                client.check_partition_type(c, table.field(c).type, self.name)
        if self._starting is None:
            plan = {"snapshot": latest, "first": latest + 1, "end": None if self._follow else latest}
        else:
            if not self._follow and self._starting > latest:
                raise ConfigError(f"{self.name} starting_version={self._starting} is after the latest version "
                                  f"{latest}; pass follow=True to wait for it")
            plan = {"snapshot": None, "first": self._starting, "end": None if self._follow else latest}
        plan.update(schema=pa.schema([table.field(c) for c in columns]), partitions=partitions,
                    partition_types={c: table.field(c).type for c in partitions})
        self._plan = plan
        return plan

    def create_reader(self, splits: list, state: dict | None, *, subtask: int = 0,
                      parallelism: int = 1) -> SourceReader:
        return _DeltaReader(self, self._planned(), list(splits), state or {})


def check_readable(dt, what: str) -> None:
    p = dt.protocol()
    features = set(p.reader_features or ())
    config = dt.metadata().configuration or {}
    unsupported = sorted(features & {"deletionVectors", "columnMapping", "v2Checkpoint"} |
                         ({"columnMapping"} if config.get("delta.columnMapping.mode") not in (None, "none") else set()))
    if unsupported or p.min_reader_version > 3:
        raise DeltaSourceError(f"{what}: the table uses {unsupported or f'reader version {p.min_reader_version}'}; "
                               "DeltaSource reads tables whose data files alone are the rows")


@dataclass(frozen=True)
class _File:
    path: str  # relative to the table root, decoded
    partition: dict  # column -> Python value


@dataclass
class _Cursor:
    """The read position of one split: the next row of file ``index`` of the snapshot of
    ``version`` (``snapshot``) or of the files commit ``version`` added."""

    version: int
    index: int
    row: int
    snapshot: bool
    batches: object = None  # iterator over the open file's batches
    pending: pa.RecordBatch | None = None  # rows read but not returned yet
    finished: bool = False
    wait_until: float = 0.0  # follow: when to look for commit ``version`` again

    def state(self) -> dict:
        return {"v": self.version, "i": self.index, "r": self.row, "s": int(self.snapshot)}


class _DeltaReader(SourceReader):
    """Reads its splits' files in turns (one split per poll), so a followed split never
    starves another."""

    def __init__(self, source: DeltaSource, plan: dict, splits: list[int], state: dict):
        self._src, self._plan = source, plan
        self._files = client.table_files(source._uri, source._options)
        self._schema: pa.Schema = plan["schema"]
        self._partitions = set(plan["partitions"])
        self._data_columns = [n for n in self._schema.names if n not in self._partitions]
        self._splits = splits
        self._cursors: dict[int, _Cursor] = {}
        for k in splits:
            s = state.get(str(k))
            if s is None:
                snap = plan["snapshot"]
                self._cursors[k] = _Cursor(plan["first"] if snap is None else snap, 0, 0, snap is not None)
            else:
                self._cursors[k] = _Cursor(int(s["v"]), int(s["i"]), int(s["r"]), bool(s["s"]))
        self._listings: dict[tuple[int, bool], list[_File]] = {}
        self._turn = 0
        self._table = None  # a DeltaTable, opened when a commit is missing (to tell "not yet" from "cleaned up")

    def poll(self, max_records: int) -> Poll:
        check_max_records(max_records, self._src.name)
        live = [k for k in self._splits if not self._cursors[k].finished]
        for step in range(len(live)):
            k = live[(self._turn + step) % len(live)]
            out = self._read(self._cursors[k], k, 1 if self._src._columnar else max_records)
            if out:
                self._turn = (self._turn + step + 1) % len(live)
                return Poll(out, split=k)
        done = all(c.finished for c in self._cursors.values())
        return Poll([], finished=done, idle=not done)

    def snapshot(self) -> dict:
        return {str(k): c.state() for k, c in self._cursors.items()}

    def close(self) -> None:
        for c in self._cursors.values():
            c.batches, c.pending = None, None

    # ------------------------------------------------------------------ reading

    def _read(self, cur: _Cursor, split: int, limit: int) -> list:
        """Up to ``limit`` rows (dicts) or one batch of split ``split``; [] if none now."""
        out: list = []
        while len(out) < limit and not cur.finished:
            batch = self._next_batch(cur, split)
            if batch is None:
                break
            if self._src._columnar:
                cur.row += batch.num_rows
                return [batch]
            take = min(limit - len(out), batch.num_rows)
            if take < batch.num_rows:
                cur.pending = batch.slice(take)
                batch = batch.slice(0, take)
            cur.row += take
            out.extend(batch.to_pylist())
        return out

    def _next_batch(self, cur: _Cursor, split: int) -> pa.RecordBatch | None:
        """The next batch of rows at ``cur`` (advancing over files and versions), or None when
        the split has nothing now (or is finished)."""
        while True:
            if cur.pending is not None:
                batch, cur.pending = cur.pending, None
                return batch
            if cur.batches is not None:
                batch = next(cur.batches, None)
                if batch is not None:
                    return batch
                cur.batches = None
                cur.index, cur.row = cur.index + 1, 0
            files = self._listing(cur)
            if files is None:
                return None  # the next commit is not there yet
            while cur.index < len(files) and zlib.crc32(files[cur.index].path.encode()) % self._src._splits != split:
                cur.index, cur.row = cur.index + 1, 0
            if cur.index < len(files):
                cur.batches = self._open(files[cur.index], cur.row)
                continue
            # this snapshot or commit is done: on to the next version
            if cur.snapshot:
                cur.snapshot = False
            cur.version, cur.index, cur.row = cur.version + 1, 0, 0
            end = self._plan["end"]
            if end is not None and cur.version > end:
                cur.finished = True
                return None
            self._forget()

    def _listing(self, cur: _Cursor) -> list[_File] | None:
        key = (cur.version, cur.snapshot)
        files = self._listings.get(key)
        if files is not None:
            return files
        if cur.snapshot:
            files = self._snapshot_files(cur.version)
        else:
            now = time.monotonic()
            if now < cur.wait_until:
                return None
            files = self._commit_files(cur.version)
            if files is None:
                cur.wait_until = now + self._src._interval
                return None
        self._listings[key] = files
        return files

    def _forget(self) -> None:
        """Drop listings no cursor needs any more."""
        needed = {(c.version, c.snapshot) for c in self._cursors.values()}
        for key in [k for k in self._listings if k not in needed]:
            del self._listings[key]

    def _snapshot_files(self, version: int) -> list[_File]:
        dt = client.require_table(self._src._uri, self._src._options, self._src.name, version)
        actions = pa.table(dt.get_add_actions(flatten=False))
        paths = [self._confined(unquote(p), version) for p in actions.column("path").to_pylist()]
        parts = (actions.column("partition").to_pylist() if "partition" in actions.column_names
                 else [{}] * len(paths))
        return sorted((_File(p, dict(v or {})) for p, v in zip(paths, parts)), key=lambda f: f.path)

    def _commit_files(self, version: int) -> list[_File] | None:
        """The files commit ``version`` added with ``dataChange``, in log order; None if the
        commit does not exist yet."""
        rel = f"_delta_log/{version:020d}.json"
        text = self._read_commit(rel)
        if text is None:
            if not self._committed(version):
                return None  # not written yet
            text = self._read_commit(rel)  # it may have landed between the two looks
            if text is None:
                raise DeltaSourceError(
                    f"{self._src.name}: commit {version} is no longer in the table's log (removed after "
                    "delta.logRetentionDuration); the source cannot continue from its offset")
        types = self._plan["partition_types"]
        files = []
        for line in (text.decode("utf-8") if isinstance(text, bytes) else text).splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "remove" in action and action["remove"].get("dataChange", True) and not self._src._ignore_changes:
                raise DeltaSourceError(
                    f"{self._src.name}: version {version} removes data ({action['remove'].get('path')!r}: a DELETE, "
                    "UPDATE, MERGE or overwrite); a stream of appends cannot follow it. Pass ignore_changes=True to "
                    "read on (the files such commits add are read, rewritten rows appear again)")
            add = action.get("add")
            if add is None or not add.get("dataChange", True):
                continue
            if add.get("deletionVector"):
                raise DeltaSourceError(f"{self._src.name}: version {version} adds a file with a deletion vector; "
                                       "DeltaSource cannot read those")
            path = self._confined(unquote(add["path"]), version)
            values = {c: client.decode_partition_value(v, types.get(c, pa.string()))
                      for c, v in (add.get("partitionValues") or {}).items()}
            files.append(_File(path, values))
        return files

    def _confined(self, path: str, version: int) -> str:
        """``path`` of a file the log of ``version`` names, if it lies inside the table: a
        relative path that stays below the table root (no URL, no absolute path, no ``..``
        leaving it). The source reads files by joining paths to the root, so anything else
        would read outside the table (Delta's shallow clones and absolute paths are not
        supported)."""
        parts = path.split("/")
        depth, escapes = 0, False
        for part in parts:
            if part == "..":
                depth -= 1
                escapes = escapes or depth < 0
            elif part not in ("", "."):
                depth += 1
        if "://" in path or path.startswith(("/", "\\")) or escapes or "\\" in path or not path.strip():
            raise DeltaSourceError(f"{self._src.name}: version {version} of {self._src._uri} names the data file "
                                   f"{path!r}, which is not inside the table; DeltaSource reads only files below "
                                   "the table root")
        return path

    def _read_commit(self, rel: str):
        try:
            with self._files.open_read(rel) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _committed(self, version: int) -> bool:
        """Whether the table has reached ``version`` (a missing commit file is then gone)."""
        if self._table is None:
            self._table = client.require_table(self._src._uri, self._src._options, self._src.name)
        else:
            self._table.update_incremental()
        return self._table.version() >= version

    def _open(self, file: _File, start_row: int):
        """An iterator over ``file``'s rows from ``start_row``, as batches of the output schema."""
        pf = pq.ParquetFile(self._files.open_read(file.path))
        present = [c for c in self._data_columns if c in pf.schema_arrow.names]
        group, skip = 0, start_row
        meta = pf.metadata
        while group < meta.num_row_groups and skip >= meta.row_group(group).num_rows:
            skip -= meta.row_group(group).num_rows
            group += 1
        schema, batch_rows = self._schema, self._src._batch_rows

        def batches():
            nonlocal skip
            if group >= meta.num_row_groups:
                return
            for raw in pf.iter_batches(batch_size=batch_rows, row_groups=range(group, meta.num_row_groups),
                                       columns=present, use_threads=False):
                if skip:
                    if skip >= raw.num_rows:
                        skip -= raw.num_rows
                        continue
                    raw, skip = raw.slice(skip), 0
                yield self._shape(raw, file, schema)

        return batches()

    def _shape(self, raw: pa.RecordBatch, file: _File, schema: pa.Schema) -> pa.RecordBatch:
        n = raw.num_rows
        columns = []
        for field in schema:
            if field.name in self._partitions:
                columns.append(pa.array([file.partition.get(field.name)] * n, field.type))
            elif field.name in raw.schema.names:
                col = raw.column(field.name)
                columns.append(col if col.type == field.type else col.cast(field.type))
            else:
                columns.append(pa.nulls(n, field.type))
        return pa.RecordBatch.from_arrays(columns, schema=schema)
