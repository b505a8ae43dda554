"""The record a :class:`~epochal.connectors.kafka.source.KafkaSource` emits, and how a
:class:`~epochal.connectors.kafka.sink.KafkaSink` turns records into Kafka keys and values."""
from __future__ import annotations

import json
from typing import Any, NamedTuple


class KafkaRecord(NamedTuple):
    """One record read from Kafka.

    ``timestamp`` is Kafka's, in **milliseconds** since the epoch (create or log-append
    time, whichever the topic keeps); use it as event time with
    ``with_watermarks(..., timestamp=lambda r: r.timestamp, timestamp_unit="ms")``.
    ``value`` is what the source's ``deserializer`` returned for the raw bytes (the bytes
    themselves without one); ``key`` stays bytes (or None). ``headers`` is a tuple of
    ``(name, bytes)`` pairs, or None.

    A ``KafkaSink`` without a ``serializer`` writes a ``KafkaRecord`` back as its key and
    value (so a topic can be copied or filtered into another one as it is).
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: Any
    headers: tuple | None = None


def default_serializer(record: Any) -> bytes | None:
    """bytes as they are, str as UTF-8, None as a null value (a tombstone), a
    :class:`KafkaRecord`'s value by these rules, anything else as JSON."""
    if isinstance(record, KafkaRecord):
        record = record.value
    if record is None or isinstance(record, bytes):
        return record
    if isinstance(record, str):
        return record.encode("utf-8")
    if isinstance(record, (bytearray, memoryview)):
        return bytes(record)
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def to_key(value: Any) -> bytes | None:
    """A key function's result as Kafka key bytes: bytes, str (UTF-8), int, or None."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode("ascii")
    raise TypeError(f"a Kafka key must be bytes, str, int or None, got {type(value).__name__}")
