"""The attempt's credentials, as the task thread holds them: what a component that opens its
own connection to the driver (a relay sink or source, :mod:`epochal.regions.relay`) proves.

The task binds them (:func:`bind`) on its own thread before it creates its operators and
its source reader; a component reads them (:func:`current`) when it is created, on that
thread, and keeps them. They are the attempt's connection key
(:func:`~epochal.runtime.transport.wire.derive_key`: the job secret and the attempt's
generation) and the task's generation — a zombie of an older attempt holds an older key,
so a server keyed per attempt refuses it. Never in a ``repr``, never on the wire.

:func:`purpose_key` turns the attempt key into the key of one purpose (a relay lane's
role), so a connection for one purpose proves nothing for another.
"""
from __future__ import annotations

import hashlib
import hmac
import threading
from dataclasses import dataclass, field

from epochal.errors import EpochalError

_local = threading.local()


@dataclass(frozen=True)
class Credentials:
    """An attempt's connection ``key`` and the holder's ``generation``."""

    key: bytes = field(repr=False)
    generation: int


def bind(key: bytes, generation: int) -> None:
    """Task thread, before its operators and reader are created: this attempt's credentials.
    Idempotent (a later bind replaces an earlier one)."""
    _local.credentials = Credentials(key, int(generation))


def current(where: str) -> Credentials:
    """The credentials the calling thread's task bound.

    Raises:
        EpochalError: none are bound (``where`` — the component — was created outside a task).
    """
    creds = getattr(_local, "credentials", None)
    if creds is None:
        raise EpochalError(f"{where}: no attempt credentials on this thread: it runs only inside an epochal "
                           "task (created by the task thread)")
    return creds


def purpose_key(key: bytes, purpose: str) -> bytes:
    """The key for ``purpose`` derived from an attempt key (HMAC-SHA256)."""
    return hmac.new(key, f"epochal-purpose:{purpose}".encode(), hashlib.sha256).digest()
