"""Signed checkpoints: whoever can write the checkpoint storage cannot plant a checkpoint
that the job restores (and so unpickles in its executors).

A checkpoint's ``_metadata`` document names every file it consists of with its size and
SHA-256 (:class:`~epochal.backends.layout.StateHandle`): the task state files, the shared
files of incremental snapshots, and through the state files the loop logs and channel
state. So one HMAC-SHA256 over the document covers the whole checkpoint: a changed byte in
any file no longer matches its digest (checked on every read), and a changed digest, path
or epoch no longer matches the HMAC. The key (``CheckpointConfig.signing_key``) lives
with whoever runs the job — never in the storage; only the driver signs (when it writes
``_metadata``) and verifies (before it restores, or imports a savepoint).

The signature is one more field of the document, ``"signature": {"alg": "hmac-sha256",
"key_id": ..., "mac": ...}``, over the canonical JSON of every other field (sorted keys, no
spaces). ``key_id`` (the first 8 bytes of the key's SHA-256, hex) only tells "signed with
another key" apart from "changed"; it reveals nothing usable about the key.

>>> doc = {"format": "epochal-checkpoint", "epoch": 3, "meta": {"tasks": {}}}
>>> signed = sign(doc, b"0123456789abcdef")
>>> verify(signed, b"0123456789abcdef"), verify(doc, b"0123456789abcdef")
('', 'it is not signed')
>>> signed["meta"]["tasks"]["x"] = {"path": "planted", "size": 1, "sha256": "00"}
>>> verify(signed, b"0123456789abcdef")
'its signature does not match its contents (it was changed after it was signed)'
"""
from __future__ import annotations

import hashlib
import hmac
import json

__all__ = ["ALGORITHM", "MIN_KEY_BYTES", "derived_key", "key_bytes", "sign", "verify"]

ALGORITHM = "hmac-sha256"
SIGNATURE = "signature"
MIN_KEY_BYTES = 16


def key_bytes(key: bytes | str) -> bytes:
    """The key as bytes (a ``str`` is UTF-8 encoded).

    Raises:
        ValueError: not bytes/str, or shorter than 16 bytes.
    """
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, (bytes, bytearray)):
        raise ValueError(f"a signing key must be bytes or str, got {type(key).__name__}")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a signing key must have at least {MIN_KEY_BYTES} bytes, got {len(key)} "
                         "(e.g. secrets.token_bytes(32))")
    return bytes(key)


def derived_key(key: bytes | str | None, purpose: str) -> bytes | None:
    """A key for one ``purpose`` (e.g. ``"task-logs"``) derived from the job's signing key:
    HMAC-SHA256(key, "epochal/<purpose>"). Tasks get the derived key, never the signing key,
    so what they can sign cannot pass for a signed ``_metadata``. ``None`` for ``None``; pure."""
    if key is None:
        return None
    return hmac.new(key_bytes(key), f"epochal/{purpose}".encode(), hashlib.sha256).digest()


def _key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


def _canonical(document: dict) -> bytes:
    body = {k: v for k, v in document.items() if k != SIGNATURE}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def sign(document: dict, key: bytes | str) -> dict:
    """``document`` with its ``signature`` field (a new dict; the input is not changed).

    ``document`` must be JSON (what ``_metadata`` is); the signature covers every field
    except an existing ``signature``, which is replaced."""
    key = key_bytes(key)
    mac = hmac.new(key, _canonical(document), hashlib.sha256).hexdigest()
    return dict(document, **{SIGNATURE: {"alg": ALGORITHM, "key_id": _key_id(key), "mac": mac}})


def verify(document: dict, key: bytes | str) -> str:
    """``""`` when ``document`` carries a valid signature under ``key``, else why not
    (completing "the checkpoint ... : <reason>")."""
    key = key_bytes(key)
    sig = document.get(SIGNATURE)
    if not isinstance(sig, dict):
        return "it is not signed"
    if sig.get("alg") != ALGORITHM:
        return f"it is signed with an unknown algorithm {sig.get('alg')!r}"
    if sig.get("key_id") != _key_id(key):
        return "it is signed with another key"
    expected = hmac.new(key, _canonical(document), hashlib.sha256).hexdigest()
    if not isinstance(sig.get("mac"), str) or not hmac.compare_digest(sig["mac"], expected):
        return "its signature does not match its contents (it was changed after it was signed)"
    return ""
