"""Broadcast state: one dict per operator that every subtask holds identically.

Every subtask of a broadcast operator receives every broadcast element (a BROADCAST edge)
between the same epoch barriers, and applies it with the same deterministic
``process_broadcast_element``; so at every epoch cut all subtasks hold the same broadcast
state (seed 004 §3.4: the cut is consistent per channel, and a broadcast channel carries
the same prefix to every subtask). It is therefore stored **once per epoch**: subtask 0's
snapshot carries the entries, the others a marker; on restore — at the same or another
parallelism — every subtask takes subtask 0's entries (:meth:`BroadcastSnapshot.rescale`),
so a rescale 2 → 3 hands the state to the new subtask too. Unaligned checkpoints cut each
subtask's broadcast channel at its own position, so there every subtask stores its copy and
restores its own (a rescale of in-flight broadcast records is refused anyway).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BroadcastElement", "BroadcastSnapshot", "BroadcastState"]


class BroadcastElement:
    """A record of the broadcast input, tagged on its way to the operator (the operator
    reads both inputs as one stream of records and tells them apart by this wrapper)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        return (BroadcastElement, (self.value,))

    def __repr__(self):
        return f"BroadcastElement({self.value!r})"


class BroadcastState:
    """The broadcast state as a function sees it: a mapping, writable only inside
    ``process_broadcast_element`` (in ``process_element`` it is read-only, as in Flink:
    a write there would make subtasks diverge). Values are treated as immutable: ``put`` a
    new value instead of mutating one in place.
    """

    __slots__ = ("_data", "_writable", "_operator")

    def __init__(self, operator: str):
        self._data: dict = {}
        self._writable = False
        self._operator = operator

    # ------------------------------------------------------------------- reading
    def get(self, key, default=None):
        return self._data.get(key, default)

    def __getitem__(self, key):
        return self._data[key]

    def __contains__(self, key) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self):
        return iter(list(self._data))

    def items(self) -> list:
        return list(self._data.items())

    def keys(self) -> list:
        return list(self._data)

    def values(self) -> list:
        return list(self._data.values())

    # ------------------------------------------------------------------- writing
    def _check(self, what: str) -> None:
        if not self._writable:
            raise TypeError(f"operator {self._operator!r}: broadcast state is read-only in process_element "
                            f"({what}); change it in process_broadcast_element, which every subtask runs alike")

    def put(self, key, value) -> None:
        self._check(f"put({key!r})")
        self._data[key] = value

    def __setitem__(self, key, value) -> None:
        self.put(key, value)

    def remove(self, key) -> None:
        self._check(f"remove({key!r})")
        self._data.pop(key, None)

    def clear(self) -> None:
        self._check("clear()")
        self._data.clear()


@dataclass(frozen=True)
class BroadcastSnapshot:
    """The operator state a broadcast operator's subtask stores at a barrier:
    ``entries`` on subtask 0 (a copy of the dict), ``None`` on the others — except with
    unaligned checkpoints, where every subtask stores its own (see
    :mod:`epochal.broadcast.operator`)."""

    entries: dict | None
    subtask: int

    #: restored from every old subtask's state at any parallelism (epochal.runtime.task.restore)
    shared_by_all_subtasks = True

    @classmethod
    def rescale(cls, states: dict[int, Any], subtask: int, parallelism: int) -> "BroadcastSnapshot":
        """Every new subtask gets the entries: its own old subtask's if that stored them
        (unaligned checkpoints), else subtask 0's."""
        own = states.get(subtask)
        if own is not None and own.entries is not None:
            return cls(dict(own.entries), subtask)
        for s in states.values():
            if s is not None and s.entries is not None:
                return cls(dict(s.entries), subtask)
        return cls({}, subtask)
