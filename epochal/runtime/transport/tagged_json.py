"""A data-only message encoding: JSON with tags for the Python types JSON lacks.

For connections whose peer holds a capability that must not run code — a query token
(:mod:`epochal.query`): decoding builds plain data and never calls a constructor named by
the sender, so a hostile frame can at most be refused (:class:`NotData`), never executed.

The encoding of a value ``v`` (:func:`encode` → a JSON-native tree, :func:`decode` back):

* ``str``, ``int``, ``bool``, ``None`` and finite ``float`` as themselves; ``list`` as an array;
* every other type is a one-member JSON object whose name is the tag:
  ``{"$t": [...]}`` tuple, ``{"$d": [[k, v], ...]}`` dict (any hashable keys, in order),
  ``{"$b": "<base64>"}`` bytes, ``{"$f": "nan" | "inf" | "-inf"}`` a non-finite float,
  ``{"$s": [...]}`` set, ``{"$z": [...]}`` frozenset; with a :class:`Codec` naming them,
  ``{"$n": [name, [fields...]]}`` an instance of one of its ``NamedTuple`` classes.

Anything else (a dataclass, a numpy scalar, a datetime, ...) is refused at encode time
with :class:`NotData` naming the type and where it sits; a caller that must move such
values does so explicitly (a query client opting into pickled values for its own job).
``bool`` stays ``bool`` and ``int`` subclasses other than ``bool`` are refused, so a value
decodes to the same type it had. Pure functions, thread-safe.
"""
from __future__ import annotations

import base64
import binascii
import json
import math

#: refuse trees nested deeper than this (a decoder's stack, not a data shape anyone uses)
MAX_DEPTH = 200


class NotData(ValueError):
    """A value that has no data-only encoding, or bytes that are not one (the message
    says which type or which part)."""


class Encoded:
    """A tree already encoded (:func:`encode`): embedded as it is by :func:`encode`/:func:`dumps`
    (lets a server check a part — values read from state — before building the reply)."""

    __slots__ = ("tree",)

    def __init__(self, tree):
        self.tree = tree


class Codec:
    """The encoding with ``named``: the ``NamedTuple`` classes (and only those) that travel
    by name, ``{"$n": [name, [fields...]]}``; a name not in it is refused, so decoding
    builds nothing but tuples of data. Immutable, thread-safe."""

    def __init__(self, named=(), lenient: bool = False):
        #: encode subclasses of the data types (an ``OrderedDict``, a ``str`` enum, a numpy
        #: scalar's ``item()``) as their plain type; decoding is as strict either way. For
        #: control messages (:data:`~epochal.runtime.transport.wire.CONTROL`), whose fields are
        #: counters and names an author may hold in such types
        self.lenient = lenient
        self._by_name = {cls.__name__: cls for cls in named}
        self._by_class = {cls: cls.__name__ for cls in named}
        if len(self._by_name) != len(self._by_class):
            raise ValueError("named: two classes share a name")

    def encode(self, value, where: str = "value", _depth: int = 0):
        """The JSON-native tree of ``value``. Raises :class:`NotData` for an unsupported type."""
        if _depth > MAX_DEPTH:
            raise NotData(f"{where}: nested deeper than {MAX_DEPTH}")
        t = type(value)
        if value is None or t is str or t is bool or t is int:
            return value
        if t is float:
            if math.isfinite(value):
                return value
            return {"$f": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if t is Encoded:
            return value.tree
        d = _depth + 1
        if t is list:
            return [self.encode(v, where, d) for v in value]
        if t is tuple:
            return {"$t": [self.encode(v, where, d) for v in value]}
        if t is dict:
            return {"$d": [[self.encode(k, where, d), self.encode(v, where, d)] for k, v in value.items()]}
        if t is bytes or t is bytearray:
            return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
        if t is set or t is frozenset:
            return {"$s" if t is set else "$z": [self.encode(v, where, d) for v in value]}
        name = self._by_class.get(t)
        if name is not None:
            return {"$n": [name, [self.encode(v, where, d) for v in value]]}
        if self.lenient:
            plain = _plain(value)
            if plain is not _NONE:
                return self.encode(plain, where, _depth)
        raise NotData(f"{where}: a {t.__module__}.{t.__qualname__} has no data-only encoding "
                      "(str, int, float, bool, None, bytes, tuple, list, dict, set, frozenset"
                      + "".join(f", {n}" for n in self._by_name) + ")")

    def decode(self, tree, _depth: int = 0):
        """The value of a tree made by :meth:`encode`. Raises :class:`NotData` for anything else."""
        if _depth > MAX_DEPTH:
            raise NotData(f"nested deeper than {MAX_DEPTH}")
        t = type(tree)
        if tree is None or t is str or t is bool or t is int or t is float:
            return tree
        d = _depth + 1
        if t is list:
            return [self.decode(v, d) for v in tree]
        if t is not dict or len(tree) != 1:
            raise NotData(f"a JSON object must have exactly one tag member, got {sorted(tree)[:5] if t is dict else t}")
        (tag, body), = tree.items()
        try:
            if tag == "$t":
                return tuple(self.decode(v, d) for v in _array(body, tag))
            if tag == "$d":
                out = {}
                for pair in _array(body, tag):
                    if type(pair) is not list or len(pair) != 2:
                        raise NotData("a $d member must be a [key, value] pair")
                    out[self.decode(pair[0], d)] = self.decode(pair[1], d)
                return out
            if tag == "$b":
                if type(body) is not str:
                    raise NotData("$b must hold a base64 string")
                return base64.b64decode(body, validate=True)
            if tag == "$f":
                if body not in ("nan", "inf", "-inf"):
                    raise NotData(f"$f must be 'nan', 'inf' or '-inf', got {body!r:.40}")
                return float(body)
            if tag in ("$s", "$z"):
                items = [self.decode(v, d) for v in _array(body, tag)]
                return set(items) if tag == "$s" else frozenset(items)
            if tag == "$n":
                if type(body) is not list or len(body) != 2 or type(body[0]) is not str:
                    raise NotData("$n must hold [name, [fields...]]")
                cls = self._by_name.get(body[0])
                if cls is None:
                    raise NotData(f"$n: {body[0]!r:.60} is not a data type of this connection")
                fields = [self.decode(v, d) for v in _array(body[1], tag)]
                if len(fields) != len(cls._fields):
                    raise NotData(f"$n: {body[0]} has {len(cls._fields)} fields, got {len(fields)}")
                return cls(*fields)
        except TypeError as exc:  # an unhashable dict key or set member
            raise NotData(f"{tag}: {exc}") from None
        except binascii.Error as exc:
            raise NotData(f"$b: {exc}") from None
        raise NotData(f"unknown tag {tag!r:.40}")

    def dumps(self, value, where: str = "value") -> bytes:
        """``value`` as UTF-8 JSON bytes (a frame payload). Raises :class:`NotData`."""
        return json.dumps(self.encode(value, where), separators=(",", ":"), allow_nan=False).encode()

    def loads(self, payload: bytes):
        """The value of a frame payload made by :meth:`dumps`; never runs code of the sender.

        Raises:
            NotData: the payload is not UTF-8 JSON of this encoding (a pickle, a truncated or
                over-deep frame, an unknown tag or name, an unhashable key, ...).
        """
        try:
            tree = json.loads(bytes(payload).decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise NotData(f"not a data-only (JSON) message: {type(exc).__name__}: {exc}"[:300]) from None
        try:
            return self.decode(tree)
        except RecursionError:
            raise NotData(f"nested deeper than {MAX_DEPTH}") from None


_NONE = object()
_BASES = (bool, int, float, str, bytes, tuple, list, dict, set, frozenset)


def _plain(value):
    """``value`` as the plain data type it subclasses (or a numpy scalar's ``item()``);
    ``_NONE`` when it is neither."""
    for base in _BASES:
        if isinstance(value, base):
            return str.__str__(value) if base is str else base(value)  # a str enum: its value
    item = getattr(value, "item", None)
    if type(value).__module__ == "numpy" and callable(item):
        plain = item()
        if type(plain) in _BASES:
            return plain
    return _NONE


class NativeCodec(Codec):
    """The encoding for control messages, cheaper on the hot path (an epoch's acks): a dict
    whose keys are all ``str`` not starting with ``$`` is a plain JSON object (no ``$d``),
    decoded by the JSON parser itself with a hook for the tags; a dict with any other key is
    a ``$d``, so a plain object never looks like a tag (one that does is refused). No named
    types; lenient when encoding. The same guarantee: decoding builds data, never runs code."""

    def __init__(self):
        super().__init__(lenient=True)

    def encode(self, value, where: str = "value", _depth: int = 0):
        t = type(value)
        if t is str or t is int or value is None or t is bool:
            return value
        if t is float and value - value == 0:  # finite (inf - inf and nan - nan are nan)
            return value
        if _depth > MAX_DEPTH:
            raise NotData(f"{where}: nested deeper than {MAX_DEPTH}")
        d, enc = _depth + 1, self.encode
        if t is dict:
            out = {}
            for k, v in value.items():
                if type(k) is not str or k[:1] == "$":
                    break
                out[k] = enc(v, where, d)
            else:
                return out
        elif t is tuple:
            return {"$t": [enc(v, where, d) for v in value]}
        elif t is list:
            return [enc(v, where, d) for v in value]
        return super().encode(value, where, _depth)

    def dumps(self, value, where: str = "value") -> bytes:
        return _ENCODER.encode(self.encode(value, where)).encode()

    def loads(self, payload: bytes):
        try:
            return _DECODER.decode(bytes(payload).decode("utf-8"))
        except NotData:
            raise
        except RecursionError:
            raise NotData(f"nested deeper than {MAX_DEPTH}") from None
        except (UnicodeDecodeError, ValueError, TypeError) as exc:
            raise NotData(f"not a data-only (JSON) message: {type(exc).__name__}: {exc}"[:300]) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON (non-finite floats travel as $f)")


#: built once (json.dumps/loads with options build a new one per call: most of a small message's cost)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _untag(obj: dict):
    """The JSON parser's hook (innermost objects first) of :class:`NativeCodec`."""
    if len(obj) != 1:
        for k in obj:
            if k[:1] == "$":
                raise NotData("a plain object's member names must not start with '$'")
        return obj
    for tag, body in obj.items():
        if tag[:1] != "$":
            return obj
        if tag == "$t":
            return tuple(_array(body, tag))
        if tag == "$d":
            out = {}
            for pair in _array(body, tag):
                if type(pair) is not list or len(pair) != 2:
                    raise NotData("a $d member must be a [key, value] pair")
                out[pair[0]] = pair[1]  # an unhashable key: TypeError, refused by loads
            return out
        if tag in ("$s", "$z"):
            return set(_array(body, tag)) if tag == "$s" else frozenset(_array(body, tag))
        if tag in ("$b", "$f"):
            return PLAIN.decode(obj)
        raise NotData(f"unknown tag {tag!r:.40}")


_DECODER = json.JSONDecoder(object_hook=_untag, parse_constant=_no_constant)


def _array(body, tag: str) -> list:
    if type(body) is not list:
        raise NotData(f"{tag} must hold an array")
    return body


#: the encoding without named types
PLAIN = Codec()
encode, decode, dumps, loads = PLAIN.encode, PLAIN.decode, PLAIN.dumps, PLAIN.loads

