"""Pickling the user's objects between epochal's processes: records on channels, keyed
state, operator and sink state, loop logs and channel state.

User functions travel to the tasks with cloudpickle, which ships classes defined in the
driver's ``__main__`` (or any module the executors cannot import) *by value*. Instances of
such classes then exist in the task processes, but plain :mod:`pickle` pickles a class by
reference ("``__main__.Point``"), which no task can look up: crossing a channel or being
checkpointed would fail. So :func:`dumps` tries plain pickle — the C pickler, the fast path
for the usual records of builtins and importable classes — and only when it cannot pickle
an object falls back to cloudpickle for that one payload (a batch, a state section, a
log chunk), which pickles those classes by value. The output of either is read back with
plain :func:`pickle.loads` (cloudpickle writes standard pickles that reference
``cloudpickle`` itself; classes shipped by value are reconstructed once per process and
reused, so their identity holds across batches).

Cost: payloads of importable types pay nothing extra; a payload with a ``__main__`` class
pays one failed pickle attempt plus cloudpickle (``benchmarks/serde.py`` measures both).
"""
from __future__ import annotations

import pickle

import cloudpickle

__all__ = ["dump", "dumps", "loads"]

PROTOCOL = 5
_FALLBACK_ERRORS = (pickle.PicklingError, AttributeError, TypeError)

loads = pickle.loads


def dumps(obj, protocol: int = PROTOCOL) -> bytes:
    """Pickle ``obj``, falling back to cloudpickle for what plain pickle cannot do.

    Raises:
        pickle.PicklingError / TypeError: neither can pickle ``obj`` (the message of the
            plain pickler, which names the object's type).
    """
    try:
        return pickle.dumps(obj, protocol)
    except _FALLBACK_ERRORS as exc:
        try:
            return cloudpickle.dumps(obj, protocol)
        except Exception:
            raise exc from None


def dump(obj, file, protocol: int = PROTOCOL) -> None:
    """:func:`dumps` into an open binary ``file``."""
    file.write(dumps(obj, protocol))
