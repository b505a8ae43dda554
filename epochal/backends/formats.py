"""What a task's keyed snapshot is in checkpoint storage, and how any form of it becomes
the portable format — the layer below every backend (base, heap, rocksdb) and every
snapshot mechanism (forked, incremental), which all import it and nothing above it.

**The portable format** (version 1), organised by key group so that a restore — possibly
with a different key-group range after rescaling (seed 004 §4.2.2) — unpickles only the
groups it owns::

    b"EPKS" | u16 version | u32 n | n × (u32 key group, u64 section length) | n sections
    section = pickle((values, maps))
    values  = {state: {key: value}}            # value state
    maps    = {state: {key: {map_key: value}}} # map state

**Descriptors.** A task state's ``keyed`` entry is either those bytes inline, or a
descriptor (a dict) standing for them:

* ``"epochal-keyed-file"`` — portable bytes in their own state file, written by a forked
  child (:mod:`epochal.backends.forked`);
* ``"epochal-rocksdb-incremental"`` — the files of a RocksDB checkpoint, partly shared
  with earlier epochs (:mod:`epochal.backends.incremental`), read back key group by key
  group (:mod:`epochal.backends.rocksdb_layout`).

:func:`to_portable` turns any of them into portable bytes, so any backend restores any
backend's snapshots. Snapshots are read only from the job's own checkpoint storage
(checksummed, see :mod:`epochal.backends.storage`); unpickling untrusted bytes is never done.
"""
from __future__ import annotations

import io
import os
import pickle
import shutil
import struct
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, BinaryIO

from epochal import serde
from epochal.backends.layout import StateHandle
from epochal.errors import CheckpointStorageError

__all__ = [
    "FORKED_FORMAT",
    "FORMAT_VERSION",
    "INCREMENTAL_FORMAT",
    "Section",
    "decode_snapshot",
    "download_incremental",
    "encode_snapshot",
    "is_forked_descriptor",
    "is_incremental_descriptor",
    "read_forked_descriptor",
    "to_portable",
    "write_snapshot",
]

MAGIC = b"EPKS"
FORMAT_VERSION = 1
_HEAD = struct.Struct(">4sHI")
_INDEX = struct.Struct(">IQ")

Section = tuple[Mapping[str, Mapping[Any, Any]], Mapping[str, Mapping[Any, Mapping[Any, Any]]]]


def write_snapshot(out: BinaryIO, sections: Iterable[tuple[int, Section]]) -> int:
    """Stream ``(kg, (values, maps))`` pairs (any order, each kg at most once) into the
    seekable binary file ``out`` in the snapshot format; return the bytes written.

    Empty sections are skipped. Sections are pickled one at a time, so the peak memory is
    one section, not the whole snapshot. Never mutates its input.
    """
    sections = [(kg, s) for kg, s in sorted(sections, key=lambda s: s[0]) if s[0] or s[1]]
    start = out.tell()
    out.write(_HEAD.pack(MAGIC, FORMAT_VERSION, len(sections)))
    index_at = out.tell()
    out.write(bytes(_INDEX.size * len(sections)))  # filled in once the lengths are known
    index = []
    for kg, (values, maps) in sections:
        body = serde.dumps((values, maps), protocol=pickle.HIGHEST_PROTOCOL)
        out.write(body)
        index.append(_INDEX.pack(kg, len(body)))
    end = out.tell()
    out.seek(index_at)
    out.write(b"".join(index))
    out.seek(end)
    return end - start


def encode_snapshot(sections: Iterable[tuple[int, Section]]) -> bytes:
    """The bytes :func:`write_snapshot` would write for ``sections``."""
    buf = io.BytesIO()
    write_snapshot(buf, sections)
    return buf.getvalue()


def decode_snapshot(blob: bytes, key_groups: range | None = None) -> Iterator[tuple[int, Section]]:
    """Yield ``(kg, (values, maps))`` for the key groups of ``blob`` inside ``key_groups``
    (all when ``None``); sections outside are skipped without unpickling them.

    Raises:
        CheckpointStorageError: ``blob`` is not an epochal keyed-state snapshot, has an
            unknown format version, or is truncated.
    """
    view = memoryview(blob)
    if len(view) < _HEAD.size:
        raise CheckpointStorageError(f"keyed-state snapshot truncated: {len(view)} bytes, no header")
    magic, version, n = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise CheckpointStorageError(
            f"not an epochal keyed-state snapshot: magic {bytes(magic)!r}, expected {MAGIC!r}"
        )
    if version != FORMAT_VERSION:
        raise CheckpointStorageError(
            f"keyed-state snapshot format version {version} is not supported "
            f"(this epochal reads version {FORMAT_VERSION})"
        )
    offset = _HEAD.size + n * _INDEX.size
    if len(view) < offset:
        raise CheckpointStorageError("keyed-state snapshot truncated inside its key-group index")
    for i in range(n):
        kg, length = _INDEX.unpack_from(view, _HEAD.size + i * _INDEX.size)
        end = offset + length
        if end > len(view):
            raise CheckpointStorageError(f"keyed-state snapshot truncated inside key group {kg}")
        if key_groups is None or kg in key_groups:
            yield kg, pickle.loads(view[offset:end])
        offset = end


# ------------------------------------------------------------------------ descriptors

FORKED_FORMAT = "epochal-keyed-file"
FORKED_VERSION = 1
INCREMENTAL_FORMAT = "epochal-rocksdb-incremental"
INCREMENTAL_VERSION = 1


def is_forked_descriptor(item) -> bool:
    """Whether a task state's ``keyed`` entry is a forked-snapshot descriptor."""
    return isinstance(item, Mapping) and item.get("format") == FORKED_FORMAT


def is_incremental_descriptor(item) -> bool:
    """Whether a task state's ``keyed`` entry is an incremental descriptor (not bytes)."""
    return isinstance(item, Mapping) and item.get("format") == INCREMENTAL_FORMAT


def read_forked_descriptor(desc: Mapping, storage) -> bytes:
    """The snapshot bytes ``desc`` references, verified (size and SHA-256) on read."""
    if desc.get("version") != FORKED_VERSION:
        raise CheckpointStorageError(
            f"keyed-state file descriptor version {desc.get('version')!r} is not supported "
            f"(this epochal reads version {FORKED_VERSION})")
    return storage.read_state(StateHandle.from_dict(desc["handle"]))


def download_incremental(desc: Mapping, storage, directory: str) -> None:
    """Write every file of incremental descriptor ``desc`` into (new or empty)
    ``directory``, verifying each file's size and SHA-256 (:meth:`CheckpointStorage.read_state`)."""
    if desc.get("version") != INCREMENTAL_VERSION:
        raise CheckpointStorageError(
            f"incremental RocksDB snapshot version {desc.get('version')!r} is not supported "
            f"(this epochal reads version {INCREMENTAL_VERSION})")
    os.makedirs(directory, exist_ok=True)
    for name, handle in desc["files"]:
        if os.path.basename(name) != name or name.startswith("."):
            raise CheckpointStorageError(f"incremental RocksDB snapshot names a bad file {name!r}")
        data = storage.read_state(StateHandle.from_dict(handle))
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def incremental_to_portable(desc: Mapping, storage, key_groups: range | None = None) -> bytes:
    """The portable snapshot bytes of incremental descriptor ``desc``'s database, only the
    key groups in ``key_groups`` (all when ``None``): download it to a temporary directory
    and read it key group by key group."""
    from epochal.backends.rocksdb_layout import read_sections  # needs rocksdict: only here

    directory = tempfile.mkdtemp(prefix="epochal-restore-")
    try:
        download_incremental(desc, storage, directory)
        return encode_snapshot(read_sections(directory, key_groups))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def to_portable(item: bytes | Mapping, storage, key_groups: range | None = None) -> bytes:
    """What an old task's snapshot produced — portable bytes, a forked-snapshot descriptor
    or an incremental RocksDB descriptor — as portable bytes (an incremental database only
    for ``key_groups``, all when ``None``)."""
    if is_forked_descriptor(item):
        return read_forked_descriptor(item, storage)
    if isinstance(item, Mapping):
        return incremental_to_portable(item, storage, key_groups)
    return item
