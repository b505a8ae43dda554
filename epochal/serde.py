"""Pickling the user's objects between epochal's processes: records on channels, keyed
state, operator and sink state, loop logs and channel state.

User functions travel to the tasks with cloudpickle, which ships classes defined in the
driver's ``__main__`` (or any module the executors cannot import) *by value*. Instances of
such classes then exist in the task processes, but plain :mod:`pickle` pickles a class by
reference ("``__main__.Point``"), which no task can look up: crossing a channel or being
checkpointed would fail.

So :func:`dumps` tries plain pickle first — the C pickler, the fast path for the usual
records of builtins and importable classes. When that fails, it pickles again with the C
pickler plus a ``reducer_override`` that writes a class that cannot be found by name
(``__main__``, a module registered with ``cloudpickle.register_pickle_by_value``, a class
defined inside a function) by value: one cloudpickle payload per class, cached per class,
embedded once per pickle, and rebuilt once per reading process (:func:`_load_class`). Its
*instances* stay on the C pickler, so a batch of 512 ``__main__`` dataclasses costs about
what importable ones do (``benchmarks/serde.py``); before, the whole batch went through
cloudpickle, whose per-object Python hook made it several times slower.

What the C pickler still cannot do (a lambda inside a record, a metaclass other than
``type``/``ABCMeta``) falls back to cloudpickle for that one payload. The output of either
path is read back with plain :func:`pickle.loads`: cloudpickle reconstructs a class shipped
by value once per process and reuses it (its class tracker), so identity and equality of
instances hold across batches.
"""
from __future__ import annotations

import abc
import io
import pickle
import sys
import weakref

import cloudpickle

__all__ = ["dump", "dumps", "loads"]

PROTOCOL = 5
_FALLBACK_ERRORS = (pickle.PicklingError, AttributeError, TypeError)

loads = pickle.loads

#: class → its cloudpickle payload (by value); weak, so classes of finished jobs can go
_BY_VALUE: "weakref.WeakKeyDictionary[type, bytes]" = weakref.WeakKeyDictionary()


def _importable(cls: type) -> bool:
    """True when unpickling ``sys.modules[cls.__module__].<qualname>`` in another process of
    the job finds ``cls``: not ``__main__`` (the tasks' ``__main__`` is not the driver's
    script), not registered with cloudpickle for by-value pickling, reachable by name."""
    module = getattr(cls, "__module__", None)
    if module in (None, "__main__", "__mp_main__") or module not in sys.modules:
        return False
    if cloudpickle.cloudpickle._is_registered_pickle_by_value(sys.modules[module]):
        return False
    obj = sys.modules[module]
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return obj is cls


_CLASS_TYPES = (type, abc.ABCMeta)
#: payload → class, in the reading process: a batch of a shipped class then costs a dict
#: lookup instead of rebuilding the class (its methods are functions shipped by value)
_LOADED: dict[bytes, type] = {}
_LOADED_MAX = 4096


def _load_class(payload: bytes) -> type:
    """Unpickle a class written by value by :class:`_Pickler` (once per payload and process).

    Called by :func:`pickle.loads` — so it must stay importable as ``epochal.serde._load_class``."""
    cls = _LOADED.get(payload)
    if cls is None:
        cls = loads(payload)
        if len(_LOADED) >= _LOADED_MAX:
            _LOADED.clear()
        _LOADED[payload] = cls
    return cls


class _Pickler(pickle.Pickler):
    """The C pickler plus :meth:`reducer_override` for classes that cannot be found by name."""

    def reducer_override(self, obj):
        """Called by the C pickler for every object that is not of a builtin container or
        scalar type; must be cheap (one type check) for everything but class objects."""
        if type(obj) in _CLASS_TYPES and not _importable(obj):
            payload = _BY_VALUE.get(obj)
            if payload is None:
                payload = cloudpickle.dumps(obj, PROTOCOL)
                _BY_VALUE[obj] = payload
            return _load_class, (payload,)
        return NotImplemented


def dumps(obj, protocol: int = PROTOCOL) -> bytes:
    """Pickle ``obj``: C pickler, classes that cannot be found by name by value; falling back
    to cloudpickle for what that cannot do.

    Raises:
        pickle.PicklingError / TypeError: neither can pickle ``obj`` (the message of the
            C pickler, which names the object's type).
    """
    try:
        return pickle.dumps(obj, protocol)  # the fast path: builtins and importable classes
    except _FALLBACK_ERRORS:
        pass
    buf = io.BytesIO()
    try:
        _Pickler(buf, protocol).dump(obj)
        return buf.getvalue()
    except _FALLBACK_ERRORS as exc:
        try:
            return cloudpickle.dumps(obj, protocol)
        except Exception:
            raise exc from None


def dump(obj, file, protocol: int = PROTOCOL) -> None:
    """:func:`dumps` into an open binary ``file``."""
    file.write(dumps(obj, protocol))
