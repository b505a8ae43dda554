"""Files in a directory (any fsspec filesystem), replayable by byte offset.

Splits are the files that match at plan time. Each file is read as lines (or JSON lines)
through a large read buffer; its offset is the byte position of the next unread line, so
a restored reader seeks there and continues. With ``epoch_per_file`` the source asks for
an epoch after every file (operator-driven trigger, seed 000 §3.1, like IBM Streams'
DirectoryScan). With ``monitor_interval`` the directory is re-listed and new files are
picked up, each by exactly one subtask chosen by a stable hash of its path.
"""
from __future__ import annotations

import codecs
import json
import posixpath
import time
import zlib

from fsspec.core import url_to_fs

from epochal.config import parse_duration
from epochal.errors import PipelineDefinitionError
from epochal.sources.base import Poll, Source, SourceReader, check_max_records, check_positive_int

__all__ = ["DirectorySource"]

_FORMATS = ("lines", "jsonl")


def owner_of(path: str, parallelism: int) -> int:
    """The subtask that reads a file discovered at run time: stable across processes."""
    return zlib.crc32(path.encode("utf-8")) % parallelism


def is_data_file(path: str) -> bool:
    """Whether a directory source reads ``path``: not a hidden or marker file. Names starting
    with ``_`` or ``.`` are what writers leave beside their data (Spark's and Hadoop's
    ``_SUCCESS``, ``.crc`` checksums, epochal's own ``_staging``); Spark skips them too."""
    return not posixpath.basename(path).startswith(("_", "."))


def matching_files(path: str, pattern: str) -> list[str]:
    """The data files (:func:`is_data_file`) under directory ``path`` that ``pattern`` matches,
    sorted (filesystem paths, without protocol)."""
    fs, root = url_to_fs(path)
    found = fs.glob(posixpath.join(root.rstrip("/"), pattern), detail=True)
    return sorted(p for p, info in found.items() if info.get("type") == "file" and is_data_file(p))


class DirectorySource(Source):
    """The files of a directory matching ``pattern``, as lines or JSON objects.

    Args:
        path: a plain path or fsspec URL (``file://``, ``memory://``, ...) of the directory.
        pattern: glob pattern relative to ``path``; only files match.
        format: ``"lines"`` — each line without its trailing ``\\n`` / ``\\r\\n``;
            ``"jsonl"`` — each non-blank line parsed with :func:`json.loads`. A malformed
            line raises :class:`ValueError` naming the source, file and line number.
        encoding: text encoding; must encode ``"\\n"`` as the single byte ``0x0A``.
        epoch_per_file: the poll that finishes a file has ``request_epoch=True`` and
            contains no record of the next file.
        monitor_interval: ``None`` — bounded: the files listed at plan time, then
            finished. Otherwise seconds (or ``"500ms"``) between re-listings of the
            directory; new files are read by subtask ``crc32(path) % parallelism`` and the
            source never finishes. Files must be complete when they appear (write
            elsewhere, then rename); a file already read is never read again.
        buffer_size: bytes per read call.

    State: ``{"files": {path: byte offset of the next unread line}, "done": [paths]}``.
    ``splits()`` lists the directory once and remembers the list (it is shipped with the
    source), so restarts see the same assignment and a monitoring reader can tell the
    plan-time files of other subtasks from new ones.
    """

    def __init__(self, path: str, *, pattern: str = "*", format: str = "lines",
                 encoding: str = "utf-8", epoch_per_file: bool = False,
                 monitor_interval: float | str | None = None, buffer_size: int = 1 << 20):
        self._path = str(path)
        self._pattern = pattern
        if format not in _FORMATS:
            raise PipelineDefinitionError(f"{self.name}: format must be one of {_FORMATS}, got {format!r}")
        self._format = format
        try:
            codecs.lookup(encoding)
            ascii_newline = "\n".encode(encoding) == b"\n"
        except LookupError:
            raise PipelineDefinitionError(f"{self.name}: unknown encoding {encoding!r}") from None
        if not ascii_newline:
            raise PipelineDefinitionError(
                f"{self.name}: encoding {encoding!r} does not encode newline as one byte 0x0A; "
                "use an ASCII-compatible encoding such as utf-8 or latin-1")
        self._encoding = encoding
        self._epoch_per_file = bool(epoch_per_file)
        self._monitor_interval = parse_duration(monitor_interval, "monitor_interval", optional=True)
        if self._monitor_interval is not None and self._monitor_interval <= 0:
            raise PipelineDefinitionError(f"{self.name}: monitor_interval must be > 0 (or None), "
                                          f"got {monitor_interval!r}")
        self._buffer_size = check_positive_int(buffer_size, "buffer_size", self.name)
        self._planned: list[str] | None = None

    @property
    def name(self) -> str:
        return f"DirectorySource({self._path!r})"

    def locations(self) -> tuple[str, ...]:
        return (self._path,)

    def list_files(self) -> list[str]:
        """The matching data files now, sorted (filesystem paths, without protocol)."""
        return matching_files(self._path, self._pattern)

    def splits(self) -> list[str]:
        if self._planned is None:
            fs, root = url_to_fs(self._path)
            if self._monitor_interval is None and not fs.isdir(root):
                raise FileNotFoundError(f"{self.name}: directory {root!r} does not exist "
                                        "(check the path; with monitor_interval it may appear later)")
            self._planned = self.list_files()
        return list(self._planned)

    def create_reader(self, splits: list, state: dict | None, *, subtask: int = 0,
                      parallelism: int = 1) -> SourceReader:
        if self._monitor_interval is not None and self._planned is None:
            raise RuntimeError(f"{self.name}: create_reader with monitor_interval needs the plan-time "
                               "file list; call splits() on the driver before shipping the source")
        return _DirectoryReader(self, list(splits), state, subtask, parallelism)


class _DirectoryReader(SourceReader):
    """Reads one file at a time; holds at most one open file and one read buffer."""

    def __init__(self, source: DirectorySource, splits: list[str], state: dict | None,
                 subtask: int, parallelism: int):
        self._src = source
        self._fs = url_to_fs(source._path)[0]
        self._mine = set(splits)
        self._planned = set(source._planned or splits)
        self._subtask, self._parallelism = subtask, parallelism
        state = state or {}
        self._offsets = {p: int(o) for p, o in state.get("files", {}).items() if self._owns(p)}
        self._done = {p for p in state.get("done", ()) if self._owns(p)}
        restored = sorted(p for p in self._offsets if p not in self._mine)
        self._queue = [p for p in splits + restored if p not in self._done]
        self._known = self._mine | self._done | set(self._offsets)
        self._last_listing = float("-inf")
        self._cur: str | None = None
        self._fh = None
        self._buf, self._at, self._pos, self._eof = b"", 0, 0, False

    def _owns(self, path: str) -> bool:
        if path in self._mine:
            return True
        if self._src._monitor_interval is None:
            return False
        return path not in self._planned and owner_of(path, self._parallelism) == self._subtask

    def poll(self, max_records: int) -> Poll:
        check_max_records(max_records, self._src.name)
        records: list = []
        finished_file = False
        while len(records) < max_records:
            if self._cur is None and not self._open_next():
                break
            item = self._next_line()
            if item is None:
                self._finish_file()
                finished_file = True
                if self._src._epoch_per_file:
                    break
                continue
            self._decode(item, records)
        if self._cur is not None and not finished_file and self._at_eof():
            self._finish_file()  # so the poll that returns a file's last line finishes it
            finished_file = True
        monitoring = self._src._monitor_interval is not None
        finished = not monitoring and self._cur is None and not self._queue
        return Poll(records, finished=finished,
                    request_epoch=self._src._epoch_per_file and finished_file,
                    idle=monitoring and not records and not finished_file)

    def _open_next(self) -> bool:
        if not self._queue:
            self._discover()
        if not self._queue:
            return False
        self._cur = self._queue.pop(0)
        self._pos = self._offsets.pop(self._cur, 0)
        self._fh = self._fs.open(self._cur, "rb")
        if self._pos:
            self._fh.seek(self._pos)
        self._buf, self._at, self._eof = b"", 0, False
        return True

    def _discover(self) -> None:
        interval = self._src._monitor_interval
        now = time.monotonic()
        if interval is None or now - self._last_listing < interval:
            return
        self._last_listing = now
        for path in self._src.list_files():
            if path not in self._known and self._owns(path):
                self._known.add(path)
                self._queue.append(path)

    def _fill(self) -> None:
        chunk = self._fh.read(self._src._buffer_size)
        if not chunk:
            self._eof = True
        else:
            self._buf = self._buf[self._at:] + chunk
            self._at = 0

    def _at_eof(self) -> bool:
        if self._at == len(self._buf) and not self._eof:
            self._fill()
        return self._eof and self._at == len(self._buf)

    def _next_line(self) -> tuple[bytes, int] | None:
        """The next line (without ``\\n``) and its start offset; ``None`` at end of file."""
        while True:
            i = self._buf.find(b"\n", self._at)
            if i >= 0:
                line, start = self._buf[self._at:i], self._pos
                self._pos += i + 1 - self._at
                self._at = i + 1
                return line, start
            if self._eof:
                if self._at == len(self._buf):
                    return None
                line, start = self._buf[self._at:], self._pos
                self._pos += len(line)
                self._at = len(self._buf)
                return line, start
            self._fill()

    def _decode(self, item: tuple[bytes, int], out: list) -> None:
        raw, start = item
        try:
            text = raw.decode(self._src._encoding)
        except UnicodeDecodeError as e:
            raise ValueError(f"{self._src.name}: cannot decode {self._cur} line "
                             f"{self._line_number(start)} as {self._src._encoding}: {e.reason}") from None
        if text.endswith("\r"):
            text = text[:-1]
        if self._src._format == "lines":
            out.append(text)
        elif text.strip():
            try:
                out.append(json.loads(text))
            except json.JSONDecodeError as e:
                raise ValueError(f"{self._src.name}: malformed JSON in {self._cur} line "
                                 f"{self._line_number(start)} (column {e.colno}): {e.msg}") from None

    def _line_number(self, offset: int) -> int:
        """1-based number of the line starting at ``offset`` (error path only: re-reads the file)."""
        count = 0
        with self._fs.open(self._cur, "rb") as f:
            while offset > 0:
                chunk = f.read(min(offset, 1 << 20))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                offset -= len(chunk)
        return count + 1

    def _finish_file(self) -> None:
        self._done.add(self._cur)
        self._close_file()

    def _close_file(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._cur, self._fh, self._buf, self._at = None, None, b"", 0

    def snapshot(self) -> dict:
        files = dict(self._offsets)
        if self._cur is not None:
            files[self._cur] = self._pos
        return {"files": files, "done": sorted(self._done)}

    def close(self) -> None:
        self._close_file()
