"""Data frames within byte budgets, decided at the sender (``ChannelConfig.batch_bytes`` and
``max_frame_bytes``).

A batch is cut by records (``batch_size``) and by bytes: :class:`BatchSizer` learns an
outlet's encoded bytes per record from the frames it sent and shrinks the next batches so
they stay near ``batch_bytes``. Whatever the estimate, :func:`encode_within` guarantees the
hard limit: a batch whose frame exceeds ``max_frame_bytes`` is split in halves (an Arrow
batch by rows) until every frame fits, so a receiver never sees a frame over its limit
(``wire.MAX_FRAME``) and the sender never fails in the middle of a frame. What cannot be
sent is found and named, record by record, only on that rare path:

* :class:`RecordTooLarge` — one record alone encodes to more than ``max_frame_bytes``;
* :class:`Unencodable` — one record cannot be encoded at all (pickle refuses it).

The router turns both into a :class:`~epochal.errors.DataError` naming the operator and
the edge, or into a dead letter when the operator has them. Pure: no sockets, no config.
"""
from __future__ import annotations

from typing import Callable

__all__ = ["BatchSizer", "RecordTooLarge", "Unencodable", "encode_within"]


class RecordTooLarge(Exception):
    """One record (or one row of an Arrow batch) encodes to more than the frame limit."""

    def __init__(self, record, size: int, limit: int):
        self.record, self.size, self.limit = record, size, limit
        super().__init__(f"one record encodes to {size} bytes, over max_frame_bytes={limit}")


class Unencodable(Exception):
    """A record cannot be encoded for the wire; ``cause`` is the encoder's error."""

    def __init__(self, record, cause: BaseException):
        self.record, self.cause = record, cause
        super().__init__(f"{type(cause).__name__}: {cause}")


def encode_within(records: list, limit: int, encode: Callable[[list], bytes]) -> list[tuple[list, bytes]]:
    """``[(part, frame), ...]``: ``records`` in order, in parts whose frames (``encode(part)``)
    are at most ``limit`` bytes; a single part in the common case (one ``encode`` call).

    Raises:
        Unencodable: some record cannot be encoded (the first one, in order).
        RecordTooLarge: some single record (Arrow: single row) encodes to more than ``limit``.
    """
    try:
        frame = encode(records)
    except Exception as exc:
        raise _culprit(records, encode, exc) from exc
    if len(frame) <= limit:
        return [(records, frame)]
    if len(records) > 1:
        half = len(records) // 2
        return encode_within(records[:half], limit, encode) + encode_within(records[half:], limit, encode)
    record = records[0]
    rows = getattr(record, "num_rows", None)
    if rows is not None and rows > 1:  # one Arrow batch: by rows
        half = rows // 2
        return (encode_within([record.slice(0, half)], limit, encode)
                + encode_within([record.slice(half)], limit, encode))
    raise RecordTooLarge(record, len(frame), limit)


def _culprit(records: list, encode, exc: BaseException) -> Unencodable:
    """The first record that cannot be encoded on its own (``exc`` names the batch's error
    when each record alone encodes)."""
    for record in records:
        try:
            encode([record])
        except Exception as err:
            return Unencodable(record, err)
    return Unencodable(records[0] if records else None, exc)


class BatchSizer:
    """Records per batch for one outlet: ``batch_size``, fewer when its records are large,
    so that a batch encodes to about ``batch_bytes``.

    >>> s = BatchSizer(batch_size=512, batch_bytes=1 << 20)
    >>> s.size
    512
    >>> s.observe(records=10, nbytes=10 << 20)  # 1 MiB a record
    >>> s.size
    1
    """

    __slots__ = ("batch_size", "batch_bytes", "_per_record", "size")

    def __init__(self, batch_size: int, batch_bytes: int):
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self._per_record = 0.0  # encoded bytes per record, a moving average
        self.size = batch_size

    def observe(self, records: int, nbytes: int) -> None:
        """A frame of ``records`` records took ``nbytes``: update the estimate and the size."""
        if records <= 0:
            return
        sample = nbytes / records
        self._per_record = sample if not self._per_record else 0.5 * self._per_record + 0.5 * sample
        self.size = max(1, min(self.batch_size, int(self.batch_bytes // max(self._per_record, 1.0))))

    def observe_frames(self, parts: list[tuple[list, bytes]]) -> None:
        """Each ``(records, frame)`` of :func:`encode_within`."""
        for part, frame in parts:
            self.observe(len(part), len(frame))
