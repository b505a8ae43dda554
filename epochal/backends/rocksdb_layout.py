"""The key layout of epochal's RocksDB databases, and reading one back key group by key
group — shared by the backend (:mod:`epochal.backends.rocksdb`, which writes it) and the
restore of an incremental snapshot into another backend or key-group range
(:func:`epochal.backends.formats.incremental_to_portable`).

Keys are laid out **by key group**, so one key group's data is one contiguous key range::

    u16 key group | u16 state id | u32 len | canonical(key) [| canonical(map key)]

Values are pickled together with their original key objects (``(key, value)`` /
``(key, map_key, value)``). State names get ids stored under :data:`META` (after every key
group): the value is the kind (:data:`VALUE` or :data:`MAP`) followed by the name, so every
checkpoint directory describes itself.
"""
from __future__ import annotations

import pickle
import struct
from collections.abc import Iterator

from rocksdict import AccessType, Options, Rdict, ReadOptions

__all__ = ["HEAD", "MAP", "META", "U16", "VALUE", "read_sections", "scan"]

HEAD = struct.Struct(">HHI")  # key group, state id, len(canonical key)
U16 = struct.Struct(">H")  # a key group (first 2 bytes of a key) or a state id
META = b"\xff\xff"  # state-name table; sorts after every key group (kg < 2**15)
VALUE, MAP = "v", "m"


def scan(db: Rdict, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of ``db`` in ``[start, end)``, in key order.

    A generator on purpose: rocksdict's iterator does not keep its ``ReadOptions`` (and
    upper bound) alive; returning ``db.items(...)`` directly ended iterations early.
    """
    read_opts = ReadOptions()
    read_opts.set_iterate_upper_bound(end)
    yield from db.items(from_key=start, read_opt=read_opts)


def read_sections(path: str, key_groups: range | None = None) -> list[tuple[int, tuple[dict, dict]]]:
    """Read the database (a checkpoint directory) at ``path`` read-only, key group by key
    group, as the portable format's ``(kg, (values, maps))`` sections (only ``key_groups``,
    all when ``None``), in key-group order. Runs on the uploader thread (or at restore, on
    a downloaded incremental snapshot)."""
    db = Rdict(path, Options(raw_mode=True), access_type=AccessType.read_only(False))
    try:
        names: dict[bytes, tuple[str, str]] = {}
        for k, raw in db.items(from_key=META):
            text = raw.decode("utf-8", "surrogatepass")
            names[k[2:4]] = (text[0], text[1:])
        sections: list[tuple[int, tuple[dict, dict]]] = []
        kg = -1
        values: dict = {}
        maps: dict = {}
        lo, hi = (b"", META) if key_groups is None else (
            U16.pack(key_groups.start), U16.pack(key_groups.stop))
        for k, raw in scan(db, lo, hi):
            if U16.unpack_from(k)[0] != kg:
                if values or maps:
                    sections.append((kg, (values, maps)))
                kg, values, maps = U16.unpack_from(k)[0], {}, {}
            kind, state = names[k[2:4]]
            if kind == VALUE:
                key, value = pickle.loads(raw)
                values.setdefault(state, {})[key] = value
            else:
                key, mk, value = pickle.loads(raw)
                maps.setdefault(state, {}).setdefault(key, {})[mk] = value
        if values or maps:
            sections.append((kg, (values, maps)))
    finally:
        db.close()
    return sections
