"""Read an operator's keyed state out of a checkpoint or savepoint, without running the job.

:func:`read` returns one row per entry as a ``pyarrow.Table``:

==========  ============  ==========================================================
column      type          content
==========  ============  ==========================================================
key         see below     the key (what the operator's ``key_by`` function returned)
key_group   int32         the key's key group (``0 .. max_parallelism - 1``)
state       string        the state's name (``ctx.value_state("n")`` → ``"n"``; a
                          ``reduce`` keeps its accumulator as ``"acc"``)
map_key     see below     the user map key of a map-state entry; null for value state
value       see below     the value
==========  ============  ==========================================================

``key``, ``map_key`` and ``value`` are converted by ``encoding``:

* ``"auto"`` (default): a typed Arrow column when pyarrow converts every value of the
  column to one type (ints, floats, strings, bytes, bools, datetimes; lists and tuples
  become lists, dicts become structs), otherwise ``"pickle"``;
* ``"pickle"``: binary, each cell the value pickled (``pickle.loads`` gives it back; a null
  map key of value state stays null); the field's metadata is ``{"encoding": "pickle"}``;
* ``"repr"``: string, each cell ``repr(value)``.

The schema's metadata ``"state_kinds"`` (JSON) tells which states are value and which map
states. Rows come in key-group order. Heap snapshots (inline or forked files) are decoded
directly; a RocksDB snapshot (full or incremental) is downloaded, checksums verified, to
a temporary directory and read key group by key group — both through the backends' own
portable snapshot format (:func:`epochal.backends.formats.decode_snapshot`).

    >>> import epochal.state
    >>> epochal.state.read("file:///tmp/sp-1", "count").to_pylist()[:1]  # doctest: +SKIP
    [{'key': 'alpha', 'key_group': 3, 'state': 'acc', 'map_key': None, 'value': ...}]
"""
from __future__ import annotations

import json

from collections.abc import Iterator

import pyarrow as pa

from epochal import serde
from epochal.backends.formats import (decode_snapshot, incremental_to_portable, is_forked_descriptor,
                                      is_incremental_descriptor, read_forked_descriptor)
from epochal.errors import CheckpointStorageError, ConfigError
from epochal.state.location import Checkpoint, open_checkpoint
from epochal.ttl.reading import KeyGroupTtl

__all__ = ["ENCODINGS", "keyed_entries", "read", "to_table"]

ENCODINGS = ("auto", "pickle", "repr")
_PICKLED = {b"encoding": b"pickle"}


def _checkpoint(url_or_checkpoint) -> Checkpoint:
    return url_or_checkpoint if isinstance(url_or_checkpoint, Checkpoint) else open_checkpoint(url_or_checkpoint)


def _keyed_operator(ckpt: Checkpoint, operator: str) -> list[str]:
    """The tasks holding ``operator``'s keyed state; errors name what is there instead."""
    from epochal.runtime.driver.compatibility import KEYED_KINDS

    ops = ckpt.operators
    if operator not in ops:
        raise ConfigError(f"{ckpt.kind} {ckpt.url} (epoch {ckpt.epoch}) has no operator {operator!r}; its operators: "
                          + ", ".join(f"{n} ({i.get('kind')})" for n, i in sorted(ops.items())))
    if ops[operator].get("kind") not in KEYED_KINDS:
        raise ConfigError(f"operator {operator!r} is a {ops[operator].get('kind')}: it has no keyed state (keyed "
                          f"operators: {', '.join(sorted(n for n, i in ops.items() if i.get('kind') in KEYED_KINDS))})")
    return ckpt.tasks_of(operator)


def _portable(item, ckpt: Checkpoint) -> bytes:
    """A task's keyed snapshot as portable bytes (heap inline, forked file or RocksDB)."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if is_forked_descriptor(item):
        return read_forked_descriptor(item, ckpt.storage)
    if is_incremental_descriptor(item):
        return incremental_to_portable(item, ckpt.storage)
    raise CheckpointStorageError(f"{ckpt.kind} {ckpt.url}: unknown keyed snapshot of type {type(item).__name__}")


def keyed_entries(url_or_checkpoint, operator: str, state: str | None = None) -> Iterator[tuple]:
    """Yield ``(key, key_group, state, kind, map_key, value)`` of ``operator``'s keyed
    state (``kind``: ``"value"`` or ``"map"``; ``map_key`` ``None`` for value state), in
    key-group order; only state ``state`` if given.

    Raises:
        ConfigError: no such operator, or it keeps no keyed state (the message lists the
            operators that do).
        CheckpointStorageError: a file is missing or corrupt (named).
    """
    ckpt = _checkpoint(url_or_checkpoint)
    prefix = f"{operator}/"
    for task in _keyed_operator(ckpt, operator):
        item = ckpt.task_state(task).get("keyed")
        if item is None:
            continue
        try:
            for kg, (values, maps) in decode_snapshot(_portable(item, ckpt)):
                ttl = KeyGroupTtl(values, prefix)  # expired entries are never returned
                hidden = ttl.hidden_keys()  # nor any entry of a key that expired as a whole
                for name, entries in values.items():
                    name = _COLUMNAR_BLOCKS.get(name[len(prefix):], name[len(prefix):]) if name.startswith(prefix) \
                        else None
                    if name is not None and not ttl.is_meta(name) and (state is None or name == state):
                        rows, gone = _entries(entries), hidden
                        if ttl.judges_panes(name):  # a columnar window's keys, by wall clock at read time
                            rows = list(rows)
                            gone = hidden | ttl.expired_pane_keys(name, rows)
                        for key, value in rows:
                            if gone and key in gone:
                                continue
                            live, value = ttl.live(name, value)
                            if live:
                                yield key, kg, name, "value", None, value
                for name, entries in maps.items():
                    if name.startswith(prefix) and (state is None or name[len(prefix):] == state):
                        short = name[len(prefix):]
                        timers = short.startswith(_TIMERS)  # keyed by time, the key in the map key
                        for key, inner in entries.items():
                            if hidden and not timers and key in hidden:
                                continue
                            for mk, value in inner.items():
                                if hidden and timers and mk in hidden:
                                    continue
                                live, value = ttl.live(short, value)
                                if live:
                                    yield key, kg, short, "map", mk, value
        except CheckpointStorageError as exc:
            raise CheckpointStorageError(f"keyed state of task {task} in {ckpt.kind} {ckpt.url}: {exc}") from exc


#: timer queues (epochal.time.timers: ``"$timers.<domain>"``) are map states keyed by the
#: encoded time, the user key in the map key
_TIMERS = "$timers."

#: a columnar aggregate on the heap keeps one block of keys per key group ("blocks") where
#: RocksDB keeps one entry per key ("acc"): both read as "acc", one row per key
_COLUMNAR_BLOCKS = {"blocks": "acc"}


def _entries(entries: dict):
    for key, value in entries.items():
        if type(value).__name__ == "KeyBlock":  # epochal.columnar.state.KeyBlock
            yield from value.entries()
        else:
            yield key, value


def _column(name: str, values: list, encoding: str, absent: list[bool]) -> tuple[pa.Field, pa.Array]:
    """One of key / map_key / value; ``absent[i]``: row ``i`` has no such value (null)."""
    if encoding == "auto":
        try:
            arr = pa.array(values)
            if arr.type != pa.null():
                return pa.field(name, arr.type), arr
            encoding = "repr"  # nothing but None (no map state): a string column of nulls
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            encoding = "pickle"
    if encoding == "repr":
        cells = [None if a else repr(v) for v, a in zip(values, absent)]
        return pa.field(name, pa.string()), pa.array(cells, pa.string())
    cells = [None if a else serde.dumps(v) for v, a in zip(values, absent)]
    return pa.field(name, pa.binary(), metadata=_PICKLED), pa.array(cells, pa.binary())


def to_table(rows: list[tuple], encoding: str = "auto") -> pa.Table:
    """The :func:`read` table of ``(key, key_group, state, kind, map_key, value)`` rows."""
    if encoding not in ENCODINGS:
        raise ConfigError(f"encoding: expected one of {', '.join(ENCODINGS)}, got {encoding!r}")
    keys, kgs, states, kinds, map_keys, values = (list(c) for c in zip(*rows)) if rows else ([],) * 6
    present = [False] * len(rows)
    fields, arrays = zip(
        _column("key", keys, encoding, present),
        (pa.field("key_group", pa.int32()), pa.array(kgs, pa.int32())),
        (pa.field("state", pa.string()), pa.array(states, pa.string())),
        _column("map_key", map_keys, encoding, [k == "value" for k in kinds]),
        _column("value", values, encoding, present),
    )
    meta = {"state_kinds": json.dumps(dict(zip(states, kinds)), sort_keys=True)}
    return pa.Table.from_arrays(list(arrays), schema=pa.schema(list(fields), metadata=meta))


def read(url, operator: str, *, state: str | None = None, limit: int | None = None,
         encoding: str = "auto") -> pa.Table:
    """``operator``'s keyed state in the checkpoint or savepoint ``url`` (see the module
    docstring for the columns and ``encoding``), at most ``limit`` rows, only state
    ``state`` if given. ``url`` may also be an opened :class:`~epochal.state.location.Checkpoint`.

    Raises:
        ConfigError: no such operator or it keeps no keyed state, or a bad argument.
        CheckpointStorageError: nothing restorable at ``url``, or a file is missing or
            corrupt (the message names the file).
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ConfigError(f"limit: expected an integer >= 0 or None, got {limit!r}")
    if encoding not in ENCODINGS:
        raise ConfigError(f"encoding: expected one of {', '.join(ENCODINGS)}, got {encoding!r}")
    rows = []
    for row in keyed_entries(url, operator, state):
        if limit is not None and len(rows) >= limit:
            break
        rows.append(row)
    return to_table(rows, encoding)
