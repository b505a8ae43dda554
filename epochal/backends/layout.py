"""The layout of a job's checkpoint directory, shared by everything that reads or writes it:
:mod:`epochal.backends.storage` (the reads and writes), :mod:`~epochal.backends.retention`
(what to delete), :mod:`~epochal.backends.verification` (is a checkpoint intact) and the
offline tools (:mod:`epochal.state`). Names, formats and pure functions; no I/O.

Layout under ``<url>/<job>/``::

    chk-0000000007/
        <task state files>      written by tasks' uploaders (write_state)
        _metadata               JSON, written LAST by the coordinator (write_metadata)
    shared/<task>/
        e<epoch>-<name>-<hash>.sst   incremental RocksDB snapshots' SST files (write_shared),
                                     referenced by the _metadata of one or more checkpoints
    _generation                 the last attempt generation claimed (next_generation)

Every path inside a checkpoint (in ``_metadata`` and in the task state files) is a
:class:`StateHandle` relative to the job root, so a directory holding ``chk-<n>/`` and the
``shared/`` files it references is a self-contained checkpoint wherever it lies. A
checkpoint is *complete* iff its ``_metadata`` exists and parses (:func:`parse_metadata`).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

__all__ = [
    "CHECKPOINT_FORMAT", "CHK_DIR", "FILE_NAME", "HASH_CHUNK", "INLINE_PATH", "METADATA_FILE", "SHARED_DIR",
    "SHARED_EPOCH",
    "StateHandle", "chk_name", "encode_document", "inline_bytes", "metadata_document", "mismatch", "parse_metadata",
    "referenced_bytes", "state_handles",
]

METADATA_FILE = "_metadata"
CHECKPOINT_FORMAT = "epochal-checkpoint"
CHECKPOINT_VERSION = 1
CHK_DIR = re.compile(r"^chk-(\d{10,})$")
SHARED_DIR = "shared"
#: a shared file's name starts with the epoch of its first upload
SHARED_EPOCH = re.compile(r"^e(\d{10,})-")
#: a plain file name (job names, state files, shared files, document path parts)
FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+-]*$")
HASH_CHUNK = 8 << 20  # bytes read at a time when verifying a state file


def chk_name(epoch: int) -> str:
    """The directory name of epoch ``epoch``'s checkpoint: ``chk-0000000007``."""
    return f"chk-{epoch:010d}"


#: path of a handle whose bytes are inline (:attr:`StateHandle.inline`), not in a file
INLINE_PATH = "inline"


@dataclass(frozen=True)
class StateHandle:
    """A state file of a checkpoint: ``path`` relative to the job root, its exact size and
    SHA-256 (hex). Goes into the checkpoint's ``_metadata`` (as a dict, see
    :meth:`to_dict` / :meth:`from_dict`); relative paths keep a checkpoint relocatable.

    Small state travels *inline* instead (issue 24; Flink's byte-stream handles below
    ``state.storage.fs.memory-threshold``): ``inline`` holds the bytes (base64), ``path`` is
    :data:`INLINE_PATH`, and no file exists — the task acknowledges without writing one, and
    the epoch's ``_metadata`` carries the state. Such a handle is not a file:
    :func:`state_handles` (retention, verification, savepoint copies) never lists it.
    """

    path: str
    size: int
    sha256: str
    inline: str | None = None

    @property
    def is_inline(self) -> bool:
        return self.inline is not None

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.inline is None:  # a file handle keeps exactly the three keys of format 1
            del d["inline"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "StateHandle":
        inline = d.get("inline")
        return cls(path=str(d["path"]), size=int(d["size"]), sha256=str(d["sha256"]),
                   inline=None if inline is None else str(inline))


def mismatch(handle: StateHandle, size: int, digest: Callable[[], str] | None) -> str:
    """How a file of ``size`` bytes (and SHA-256 ``digest()``, if given) differs from
    ``handle``; ``""`` if it does not. The digest is computed only when sizes match."""
    if size != handle.size:
        return f"size mismatch, expected {handle.size} bytes, found {size}"
    if digest is not None:
        found = digest()
        if found != handle.sha256:
            return f"sha256 mismatch, expected {handle.sha256}, found {found}"
    return ""


def state_handles(meta) -> list[StateHandle]:
    """Every state file referenced anywhere in checkpoint metadata: each mapping with
    exactly the fields of a file :class:`StateHandle` (how :meth:`StateHandle.to_dict`
    writes one; inline handles are not files and are not listed)."""
    found: list[StateHandle] = []
    stack = [meta]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if set(item) == {"path", "size", "sha256"}:
                found.append(StateHandle.from_dict(item))
            else:
                stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return sorted(set(found), key=lambda h: h.path)


def inline_bytes(meta) -> int:
    """Total size of the state carried inline in checkpoint metadata (:class:`StateHandle`)."""
    total, stack = 0, [meta]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if set(item) == {"path", "size", "sha256", "inline"}:
                total += int(item["size"])
            else:
                stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def referenced_bytes(meta) -> int:
    """Total size of the state a checkpoint's metadata references: the distinct state files
    (its own plus, for incremental snapshots, the shared files it reuses) and the state
    carried inline."""
    return sum(h.size for h in state_handles(meta)) + inline_bytes(meta)


def _json_default(obj):
    if isinstance(obj, StateHandle):
        return obj.to_dict()
    raise TypeError(f"checkpoint metadata value of type {type(obj).__name__} is not JSON-serializable")


def encode_document(doc: dict) -> bytes:
    """A JSON document of the checkpoint directory (``_metadata``, savepoint markers):
    :class:`StateHandle` values become dicts, keys sorted, compact (no indentation: an
    indented ``json.dumps`` runs Python's pure-Python encoder, which made a 1,000-task
    ``_metadata`` cost ~4x as much on the coordinator's loop thread; ``benchmarks/scale.py``).

    Raises:
        TypeError: ``doc`` holds a value JSON cannot encode.
    """
    return json.dumps(doc, default=_json_default, sort_keys=True, separators=(",", ":")).encode("utf-8")


def metadata_document(job: str, epoch: int, meta: dict) -> dict:
    """The ``_metadata`` document completing checkpoint ``epoch`` of ``job``."""
    return {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "job": job, "epoch": epoch, "meta": meta}


def parse_metadata(raw: bytes, epoch: int) -> tuple[dict | None, str]:
    """``(document, "")`` if ``raw`` is a valid ``_metadata`` document of ``epoch``, else
    ``(None, why it is not)``."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        return None, f"not valid JSON ({e})"
    if not isinstance(doc, dict) or doc.get("format") != CHECKPOINT_FORMAT:
        return None, f"not an {CHECKPOINT_FORMAT} document"
    if doc.get("epoch") != epoch:
        return None, f"written for epoch {doc.get('epoch')!r}, not {epoch}"
    if not isinstance(doc.get("meta"), dict):
        return None, "has no meta object"
    return doc, ""
