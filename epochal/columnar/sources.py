"""``ArrowFileSource``: the files of a directory as Arrow batches (a columnar stream).

Splits are the files matching at plan time (one per split, assigned round-robin). With
``columns=`` only those columns are read (Parquet: only their column chunks are decoded, the
pruning Spark's Parquet scan does by itself; CSV: only they are converted; JSON lines: the
others are dropped after parsing). Formats:

* ``"lines"`` — one ``string`` column (``line``): a block of bytes is read from the file's
  offset, cut after its last newline and split with ``pyarrow.compute`` (no per-line
  Python); the offset is a byte position. The text must be UTF-8 and no line longer than
  ``max_line_bytes``: otherwise reading fails with a :class:`~epochal.errors.DataError`
  naming the source, the file and the line's byte offset (retrying cannot help);
* ``"csv"``, ``"jsonl"`` (pyarrow's streaming readers) and ``"parquet"`` — the offset is the
  number of rows already emitted; a restored reader skips that many rows of the file. CSV
  files start with a header line naming the columns, unless ``header=False`` (Spark's
  default for CSV): then every line is data and the columns are the ``schema``'s, in order.

State: ``{path: offset}``, with ``-1`` for a finished file. Replayable as the engine needs:
a reader created from a snapshot continues with exactly the next row.
"""
from __future__ import annotations


import pyarrow as pa
import pyarrow.compute as pc
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from epochal.errors import DataError, PipelineDefinitionError
from epochal.sources.base import Poll, Source, SourceReader, check_positive_int
from epochal.sources.files import matching_files

__all__ = ["ArrowFileSource"]

_FORMATS = ("lines", "csv", "jsonl", "parquet")
LINES = pa.schema([("line", pa.string())])


class ArrowFileSource(Source):
    """Files as Arrow batches of about ``batch_rows`` rows (``lines``: ``block_bytes`` per read).

    Args:
        path: directory (plain path or fsspec URL); pattern: glob of its files.
        format: ``"lines"``, ``"csv"``, ``"jsonl"`` or ``"parquet"``.
        schema: the batches' schema; inferred from the first file when omitted (``lines``:
            one ``line`` string column).
        max_line_bytes: ``lines``: the longest line accepted (a line is read whole before
            it is cut; beyond this the file is refused instead of exhausting memory).
        header: ``csv``: whether each file's first line names the columns; ``False`` needs
            ``schema`` (its names are the columns, in file order).
        columns: the columns to read, in this order (default: all); each must be a column of
            the schema (given or inferred). Not for ``lines`` (one column).
    """

    def __init__(self, path: str, *, pattern: str = "*", format: str = "lines", schema: pa.Schema | None = None,
                 batch_rows: int = 65536, block_bytes: int = 4 << 20, max_line_bytes: int = 64 << 20,
                 header: bool = True, columns: list[str] | tuple[str, ...] | None = None):
        if format not in _FORMATS:
            raise PipelineDefinitionError(f"{self.name_for(path)}: format must be one of {_FORMATS}, got {format!r}")
        if not header and (format != "csv" or schema is None):
            raise PipelineDefinitionError(
                f"{self.name_for(path)}: header=False is for format='csv' with a schema (its names are the columns), "
                f"got format={format!r}" + (" and no schema" if schema is None else ""))
        self._header = bool(header)
        self._path, self._pattern, self._format = str(path), pattern, format
        self._batch_rows = check_positive_int(batch_rows, "batch_rows", self.name_for(path))
        self._block = check_positive_int(block_bytes, "block_bytes", self.name_for(path))
        self._max_line = check_positive_int(max_line_bytes, "max_line_bytes", self.name_for(path))
        self._planned: list[str] | None = None
        if schema is None:
            schema = LINES if format == "lines" else self._infer()
        elif not isinstance(schema, pa.Schema):
            raise PipelineDefinitionError(f"{self.name}: schema must be a pyarrow.Schema, got {schema!r}")
        self._file_schema = schema  # what the files hold (csv without header: names them)
        self._columns = None if columns is None else self._check_columns(columns, schema)
        self._schema = schema if self._columns is None else pa.schema([schema.field(c) for c in self._columns])

    def _check_columns(self, columns, schema: pa.Schema) -> list[str]:
        """``columns`` as a list, refused (naming the source) unless they are distinct names of ``schema``."""
        if self._format == "lines":
            raise PipelineDefinitionError(f"{self.name}: columns= is not for format='lines' (one 'line' column)")
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns) or not columns:
            raise PipelineDefinitionError(f"{self.name}: columns must be a non-empty list of column names, "
                                          f"got {columns!r}")
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise PipelineDefinitionError(f"{self.name}: columns {unknown} are not in the files' schema "
                                          f"(columns: {schema.names})")
        if len(set(columns)) != len(columns):
            raise PipelineDefinitionError(f"{self.name}: columns {list(columns)} name a column twice")
        return list(columns)

    @staticmethod
    def name_for(path) -> str:
        return f"ArrowFileSource({str(path)!r})"

    @property
    def name(self) -> str:
        return self.name_for(self._path)

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def locations(self) -> tuple[str, ...]:
        return (self._path,)

    def splits(self) -> list[str]:
        if self._planned is None:
            fs, root = url_to_fs(self._path)
            if not fs.isdir(root):
                raise FileNotFoundError(f"{self.name}: directory {root!r} does not exist")
            self._planned = matching_files(self._path, self._pattern)  # no _SUCCESS, .crc, ...
        return list(self._planned)

    def _infer(self) -> pa.Schema:
        files = self.splits()
        if not files:
            raise PipelineDefinitionError(f"{self.name}: no file matches {self._pattern!r} to infer the {self._format} "
                                          "schema from; pass schema=")
        fs, _ = url_to_fs(self._path)
        reader = _open(fs, files[0], self._format, None, self._batch_rows, True, None, self.name)
        try:
            return reader.schema
        finally:
            reader.close()

    def create_reader(self, splits: list, state: dict | None, *, subtask: int = 0,
                      parallelism: int = 1) -> SourceReader:
        return _ArrowFileReader(self, list(splits), state)


#: the most rows of a Parquet file decoded at once (a row group, if it has no more)
PARQUET_DECODE_ROWS = 1 << 20


def _open(fs, path: str, fmt: str, schema, batch_rows: int, header: bool, columns: list[str] | None, where: str):
    """A pyarrow record-batch reader of one csv / jsonl / parquet file (``header``: csv only;
    ``columns``: parquet and csv read only those, in that order; jsonl: all). A file Arrow
    cannot open is a :class:`DataError` naming the source ``where`` and the file."""
    try:
        return _open_format(fs, path, fmt, schema, batch_rows, header, columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise DataError(f"{where}: cannot read {path!r} as {fmt}: {type(exc).__name__}: {exc}") from exc


def _open_format(fs, path: str, fmt: str, schema, batch_rows: int, header: bool, columns: list[str] | None):
    if fmt == "parquet":
        import pyarrow.parquet as pq

        # a local file is opened by Arrow itself (no Python file object between its reads);
        # no Arrow thread pool: the engine already runs one task per core, and decoding the
        # columns on pool threads beside them costs more CPU than it saves. Decoded a row
        # group at a time (up to PARQUET_DECODE_ROWS), then cut to batch_rows by _read
        # (zero-copy slices): 9-12% less CPU than decoding 256k-row batches of 1M-row groups
        pf = pq.ParquetFile(path if isinstance(fs, LocalFileSystem) else fs.open(path, "rb"))
        group = pf.metadata.row_group(0).num_rows if pf.metadata.num_row_groups else batch_rows
        decode = max(batch_rows, min(group, PARQUET_DECODE_ROWS))
        batches = pf.iter_batches(batch_size=decode, columns=columns, use_threads=False)
        if columns is None:
            return pa.RecordBatchReader.from_batches(pf.schema_arrow, batches)
        # iter_batches yields the file's column order: put them in the asked order
        return pa.RecordBatchReader.from_batches(
            pa.schema([pf.schema_arrow.field(c) for c in columns]), (b.select(columns) for b in batches))
    f = fs.open(path, "rb")
    if fmt == "csv":
        import pyarrow.csv as pcsv

        convert = pcsv.ConvertOptions(column_types=schema, include_columns=columns) if schema is not None else None
        names = None if header else schema.names
        return pcsv.open_csv(f, read_options=pcsv.ReadOptions(block_size=1 << 22, column_names=names),
                             convert_options=convert)
    import pyarrow.json as pjson

    parse = pjson.ParseOptions(explicit_schema=schema) if schema is not None else None
    return pjson.open_json(f, read_options=pjson.ReadOptions(block_size=1 << 22), parse_options=parse)


def _one_binary(data: memoryview) -> pa.Array:
    """``data`` as a binary array of one element, without copying it (below 2 GiB)."""
    if len(data) >= 1 << 31:
        return pa.array([bytes(data)], pa.large_binary())
    offsets = pa.array([0, len(data)], pa.int32()).buffers()[1]
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(data)])


class _ArrowFileReader(SourceReader):
    """Reads its files one after another, one batch per poll."""

    def __init__(self, source: ArrowFileSource, splits: list[str], state: dict | None):
        self._src = source
        self._fs, _ = url_to_fs(source._path)
        self._offsets = {p: int((state or {}).get(p, 0)) for p in splits}
        self._queue = [p for p in splits if self._offsets[p] >= 0]
        self._file = None  # lines: the open file; other formats: the batch reader
        self._path = None

    def poll(self, max_records: int) -> Poll:
        while self._queue:
            if self._file is None:
                self._open(self._queue[0])
            batch = self._read()
            if batch is not None:
                return Poll([batch])
            self._offsets[self._path] = -1
            self._close()
            self._queue.pop(0)
        return Poll([], finished=True)

    def _open(self, path: str) -> None:
        src, offset = self._src, self._offsets[path]
        self._path = path
        if src._format == "lines":
            self._file = self._fs.open(path, "rb")
            self._file.seek(offset)
            self._carry = b""
            return
        self._file = _open(self._fs, path, src._format, src._file_schema, src._batch_rows, src._header, src._columns,
                           src.name)
        skip = offset
        while skip > 0:  # a restored reader skips the rows it emitted before
            batch = self._file.read_next_batch()
            if batch.num_rows > skip:
                self._pending = batch.slice(skip)
                break
            skip -= batch.num_rows
        else:
            self._pending = None

    def _read(self) -> pa.RecordBatch | None:
        if self._src._format == "lines":
            return self._read_lines()
        batch, self._pending = getattr(self, "_pending", None), None
        if batch is None:
            try:
                batch = self._file.read_next_batch()
            except StopIteration:
                return None
        limit = self._src._batch_rows
        if batch.num_rows > limit:  # csv / jsonl by bytes, parquet by row group: cut to batch_rows (zero-copy)
            batch, self._pending = batch.slice(0, limit), batch.slice(limit)
        self._offsets[self._path] += batch.num_rows
        if src_columns := self._src._columns:
            if batch.schema.names != src_columns:  # jsonl parses every column
                batch = batch.select(src_columns)
        return batch if batch.schema.equals(self._src.schema) else batch.cast(self._src.schema)

    def _read_lines(self) -> pa.RecordBatch | None:
        """The next block of whole lines (the last line of the file may lack its newline).
        A line longer than a block is read block after block (a loop, not recursion) up to
        ``max_line_bytes``."""
        parts, size = [self._carry], len(self._carry)  # the carry holds no newline
        while True:
            block = self._file.read(self._src._block)
            if not block or b"\n" in block:
                # one copy of the block at most (a fresh 1 MiB copy costs its page faults)
                data = b"".join(parts) + block if len(parts) > 1 else parts[0] + block if parts[0] else block
                break
            parts.append(block)
            size += len(block)
            if size > self._src._max_line:  # no newline yet, and more than a line may hold
                raise DataError(
                    f"{self._src.name}: file {self._path!r} has a line longer than max_line_bytes="
                    f"{self._src._max_line} starting at byte {self._offsets[self._path]}; raise max_line_bytes or "
                    "split the line (format='lines' reads a line whole before cutting it)")
        if not data:
            return None
        end = len(data) if not block else data.rfind(b"\n") + 1
        chunk, self._carry = memoryview(data)[:end], data[end:]  # the chunk: a view, not a copy
        start = self._offsets[self._path]
        lines = pc.split_pattern(_one_binary(chunk), b"\n").flatten()
        if data[end - 1] == 0x0A:
            lines = lines.slice(0, len(lines) - 1)
        if data.isascii():  # ASCII is UTF-8: no validation pass (the scan costs ~10 % of one)
            text = lines.view(pa.string())
        else:
            try:
                text = lines.cast(pa.string())  # validates UTF-8
            except pa.ArrowInvalid:
                raise self._not_utf8(bytes(chunk), start) from None
        if data.find(b"\r", 0, end) >= 0:  # CRLF line ends (a scan of the block costs ~1 % of the trim)
            text = pc.utf8_rtrim(text, "\r")
        self._offsets[self._path] += end
        return pa.record_batch([text], schema=LINES)

    def _not_utf8(self, chunk: bytes, start: int) -> DataError:
        """The error naming the first line of ``chunk`` (read from byte ``start``) that is not UTF-8."""
        offset = start
        for line in chunk.split(b"\n"):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return DataError(
                    f"{self._src.name}: file {self._path!r} is not UTF-8 text: the line at byte {offset} has "
                    f"{line[exc.start:exc.start + 4]!r} at byte {offset + exc.start} ({exc.reason}); format='lines' "
                    "reads UTF-8 only — convert the file, or read it with a source of bytes")
            offset += len(line) + 1
        return DataError(f"{self._src.name}: file {self._path!r}: bytes {start}..{start + len(chunk)} are not UTF-8")

    def snapshot(self) -> dict:
        return dict(self._offsets)

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None

    def close(self) -> None:
        self._close()
