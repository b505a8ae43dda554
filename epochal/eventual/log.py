"""The persisted output queue of one CEC operator on fsspec (``file://`` and plain paths,
``memory://``, ``s3://`` — tested against moto on loopback): results and window checkpoints
in one log, in timestamp order (seed 003 §II.B: "If a persistence mechanism is used to write the output queue to stable
storage it should preserve timestamp order for all tuples produced by the operator"; "CEC
benefits": one storage for output and state).

Layout: a directory of immutable *segments* ``seg-<index>_<last ts>_<last seq>.ecl``, each the
frames (:mod:`epochal.eventual.records`) of one :meth:`OutputLog.flush`, in increasing
``index``. Frames are buffered in memory and flushed as one segment once the buffer holds
``chunk_bytes`` (256 KiB, the seed's read size) or when the caller asks; no file is ever
appended to or rewritten, so the same code fits object stores (one put per flush).

A crash can tear only the segment being written, and only its tail. Readers therefore parse
each segment forward and drop a torn tail (:func:`~epochal.eventual.records.decode_frame`);
segments written after a crash start clean. Nothing is repaired in place (a repair could
itself be torn). A frame that is damaged *and followed by data* is corruption, not a torn
tail: it raises :class:`~epochal.errors.CheckpointStorageError` naming the segment and byte
— never skipped, since skipping would lose records silently.

Reading backwards ("CEC challenges": the log is read "sequentially ... in large chunks"):
:meth:`OutputLog.frames_backward` reads one whole segment per I/O (at most about
``chunk_bytes``), newest segment first, and yields its frames newest first.

Truncation ("Extent of an EC"): :meth:`OutputLog.truncate_behind` deletes the segments whose
every frame is older than a position — the start of the extent, and not past what the
downstream reader has consumed (the caller passes the minimum of both).

Single writer: one operator instance owns a log directory; readers may be many.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import fsspec

from epochal.durable import fsync, fsync_dir
from epochal.errors import CheckpointStorageError
from epochal.eventual.records import Position, Record, Result, decode_frame, encode_frame

__all__ = ["OutputLog", "ResultReader", "Segment"]

CHUNK_BYTES = 256 * 1024
_PREFIX, _SUFFIX = "seg-", ".ecl"


class Segment:
    """One segment file: its ``index`` (write order) and the position of its last frame."""

    __slots__ = ("path", "index", "last")

    def __init__(self, path: str, index: int, last: Position):
        self.path, self.index, self.last = path, index, last

    @classmethod
    def parse(cls, path: str) -> "Segment | None":
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
            return None
        try:
            index, ts, seq = name[len(_PREFIX):-len(_SUFFIX)].split("_")
            return cls(path, int(index), Position(int(ts), int(seq)))
        except ValueError:
            return None

    def __repr__(self):
        return f"Segment({self.index}, last={tuple(self.last)})"


class OutputLog:
    """The output queue under ``url`` (a directory), written by one operator.

    Args:
        url: the log's directory (fsspec URL or plain path); created when missing.
        key: the job's signing key (``CheckpointConfig.signing_key``) or ``None``; frames are
            then fingerprinted with HMAC-SHA256 and only such frames are read.
        chunk_bytes: flush by itself once this many bytes are buffered.
        storage_options: keyword arguments for the fsspec file system.

    Metrics: :attr:`torn_frames` (torn tails dropped by the readers so far),
    :attr:`segments_written`, :attr:`bytes_written`.
    """

    def __init__(self, url: str, *, key: bytes | str | None = None, chunk_bytes: int = CHUNK_BYTES,
                 storage_options: Mapping | None = None):
        if chunk_bytes < 1:
            raise ValueError(f"OutputLog({url!r}): chunk_bytes must be >= 1, got {chunk_bytes}")
        self.url = url
        self._fs, self._root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        self._root = self._root.rstrip("/")
        self._fs.makedirs(self._root, exist_ok=True)
        self._key = key
        self.chunk_bytes = chunk_bytes
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._buffer_last: Position | None = None
        existing = self.segments()
        self._next_index = existing[-1].index + 1 if existing else 0
        self.torn_frames = 0
        self.segments_written = 0
        self.bytes_written = 0

    # -- writing ------------------------------------------------------------------------
    def append(self, records: Sequence[Record]) -> None:
        """Buffer ``records`` as one frame (encoded now); flush if the buffer is full.

        ``records`` must be in timestamp order and not older than what was appended before
        (the operator's output order); an empty sequence appends nothing."""
        if not records:
            return
        last = records[-1].t
        if self._buffer_last is not None and last < self._buffer_last:
            raise ValueError(f"OutputLog({self.url!r}): records at {tuple(last)} appended after "
                             f"{tuple(self._buffer_last)} (the log keeps timestamp order)")
        frame = encode_frame(records, self._key)
        self._buffer.append(frame)
        self._buffered += len(frame)
        self._buffer_last = last
        if self._buffered >= self.chunk_bytes:
            self.flush()

    def flush(self) -> None:
        """Write the buffered frames as one new segment and make it durable (local files are
        fsynced with their directory). Once it returns, every record appended so far is in
        stable storage. A no-op with nothing buffered.

        Raises:
            CheckpointStorageError: the write failed (the frames stay buffered; the segment,
                if partly written, is a torn tail for readers).
        """
        if not self._buffer:
            return
        last = self._buffer_last
        path = f"{self._root}/{_PREFIX}{self._next_index:012d}_{last.ts}_{last.seq}{_SUFFIX}"
        data = b"".join(self._buffer)
        try:
            with self._fs.open(path, "wb") as f:
                f.write(data)
                fsync(f)
            fsync_dir(self._fs, self._root)
        except OSError as exc:
            raise CheckpointStorageError(f"output log {self.url!r}: cannot write segment {path}: {exc}") from exc
        self._next_index += 1
        self._buffer.clear()
        self._buffered = 0
        self.segments_written += 1
        self.bytes_written += len(data)

    @property
    def buffered_bytes(self) -> int:
        """Bytes appended but not yet flushed (lost by a crash)."""
        return self._buffered

    # -- reading ------------------------------------------------------------------------
    def segments(self) -> list[Segment]:
        """The durable segments, oldest first."""
        try:
            names = self._fs.ls(self._root, detail=False)
        except FileNotFoundError:
            return []
        found = [s for s in (Segment.parse(p) for p in names) if s is not None]
        return sorted(found, key=lambda s: s.index)

    def read_segment(self, segment: Segment) -> list[list[Record]]:
        """The good frames of ``segment``, in order (one read; a torn tail dropped and counted).

        Raises:
            CheckpointStorageError: the segment cannot be read, or is corrupt (not merely torn).
        """
        return self.read_frames(segment)[0]

    def read_frames(self, segment: Segment, offset: int = 0) -> tuple[list[list[Record]], int, bool]:
        """``(frames, end, torn)``: the good frames of ``segment`` from byte ``offset``, the
        byte after the last of them, and whether a torn tail followed (see :meth:`read_segment`)."""
        try:
            data = self._fs.cat_file(segment.path)
        except OSError as exc:
            raise CheckpointStorageError(f"output log {self.url!r}: cannot read {segment.path}: {exc}") from exc
        frames = []
        while offset < len(data):
            records, end, why = decode_frame(data, offset, self._key)
            if why == "torn":
                self.torn_frames += 1
                return frames, offset, True
            if why:
                raise CheckpointStorageError(f"output log {self.url!r}: segment {segment.path} is corrupt: {why}")
            frames.append(records)
            offset = end
        return frames, offset, False

    def frames_after(self, index: int, offset: int) -> Iterator[tuple[int, int, int, list[Record]]]:
        """``(segment index, frame start, frame end, records)`` of every durable frame from byte
        ``offset`` of segment ``index`` on (later segments from their start), in log order. A
        torn tail ends its segment (it is final once a newer segment exists, and is read again
        from the same byte while it is the newest, as in :class:`ResultReader`)."""
        for segment in self.segments():
            if segment.index < index:
                continue
            start = offset if segment.index == index else 0
            try:
                data = self._fs.cat_file(segment.path)
            except OSError as exc:
                raise CheckpointStorageError(f"output log {self.url!r}: cannot read {segment.path}: {exc}") from exc
            while start < len(data):
                records, end, why = decode_frame(data, start, self._key)
                if why == "torn":
                    self.torn_frames += 1
                    break
                if why:
                    raise CheckpointStorageError(f"output log {self.url!r}: segment {segment.path} is corrupt: {why}")
                yield segment.index, start, end, records
                start = end

    def discard(self) -> None:
        """Delete every segment and side file: the log starts over (a new run of the job, not
        a recovery). Not for a log anyone may still recover from."""
        try:
            names = self._fs.ls(self._root, detail=False)
        except FileNotFoundError:
            names = []
        for path in names:
            self._fs.rm_file(path)
        self._next_index = 0
        self._buffer.clear()
        self._buffered = 0
        self._buffer_last = None

    def write_side_file(self, name: str, text: str) -> None:
        """Write a small file beside the segments (never read as a segment): e.g. a recovery
        report."""
        with self._fs.open(f"{self._root}/{name}", "w") as f:
            f.write(text)

    def remove_side_file(self, path: str) -> None:
        """Delete a file :meth:`side_files` listed."""
        self._fs.rm_file(path)

    def side_files(self, prefix: str) -> list[str]:
        """The paths of the files beside the segments whose name starts with ``prefix``, sorted."""
        try:
            names = self._fs.ls(self._root, detail=False)
        except FileNotFoundError:
            return []
        return sorted(p for p in names if p.rstrip("/").rsplit("/", 1)[-1].startswith(prefix))

    def frames_backward(self) -> Iterator[list[Record]]:
        """Every durable frame, newest first (each frame's records in their written order)."""
        for segment in reversed(self.segments()):
            yield from reversed(self.read_segment(segment))

    def records(self) -> Iterator[Record]:
        """Every durable record, oldest first."""
        for segment in self.segments():
            for frame in self.read_segment(segment):
                yield from frame

    def results(self) -> Iterator[Result]:
        """The downstream reader's view: the durable ``R`` records in order, control records
        skipped (seed 003, "CEC benefits": downstream operators "recognize them in their input
        streams and disregard them")."""
        return (r for r in self.records() if isinstance(r, Result))

    # -- truncation ---------------------------------------------------------------------
    def truncate_behind(self, position: Position, keep_from: int | None = None) -> list[Segment]:
        """Delete every segment whose last frame is older than ``position`` and whose index is
        below ``keep_from`` (the downstream :class:`ResultReader`'s :attr:`~ResultReader.index`;
        ``None``: no reader); return them. The newest segment is always kept: it holds the
        newest record, whose ``tc`` and ``N`` recovery starts from.

        Safe when ``position`` is at most the oldest footprint of the eventual checkpoint
        (recovery never reads further back). Call it right after :meth:`flush`, with the
        operator's :meth:`~epochal.eventual.operator_state.EventualWindows.extent_start`: only
        then is every footprint the operator knows of durable. Idempotent."""
        segments = self.segments()[:-1]
        gone = [s for s in segments if s.last < position and (keep_from is None or s.index < keep_from)]
        for s in gone:
            self._fs.rm_file(s.path)
        if gone:
            fsync_dir(self._fs, self._root)
        return gone


class ResultReader:
    """A downstream reader of one operator's log: the ``R`` records in order, each once,
    control records skipped (seed 003, "CEC benefits": downstream SPEs "recognize them in
    their input streams and disregard them").

    Its position (:attr:`index`, :attr:`offset`: the next segment and byte to read) is what a
    sink commits with its output; a reader built at a committed position continues after it.
    A segment that ends torn is re-read from the same byte on the next :meth:`poll` while it
    is the newest (its flush may still be under way); once a newer segment exists it is final
    (the writer starts a segment only after the previous flush returned, or after a crash)
    and the reader moves on. So a frame is never read twice nor skipped.
    """

    def __init__(self, log: OutputLog, index: int = 0, offset: int = 0):
        self.log, self.index, self.offset = log, index, offset

    def poll(self) -> list[Result]:
        """Every result made durable since the last poll, in log order."""
        out: list[Result] = []
        segments = [s for s in self.log.segments() if s.index >= self.index]
        for segment in segments:
            if segment.index != self.index:  # the previous one is final: a newer one exists
                self.index, self.offset = segment.index, 0
            frames, self.offset, _ = self.log.read_frames(segment, self.offset)
            out += [r for frame in frames for r in frame if isinstance(r, Result)]
        return out
