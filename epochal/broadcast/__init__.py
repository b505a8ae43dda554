"""Broadcast state: a stream of rules (configuration, thresholds, ...) that every subtask of
an operator reads, kept in checkpointed state stored once per epoch (Flink's broadcast
state pattern). ``stream.connect_broadcast(rules).process(name, fn)`` with a
:class:`BroadcastProcessFunction` (or :class:`KeyedBroadcastProcessFunction` on a keyed
stream). May import ``epochal.graph``, ``epochal.streams``, ``epochal.operators``,
``epochal.ttl``, ``epochal.time.units`` and ``epochal.errors``.
"""
from epochal.broadcast.functions import (BroadcastContext, BroadcastProcessFunction, KeyedBroadcastContext,
                                         KeyedBroadcastProcessFunction)
from epochal.broadcast.state import BroadcastState

__all__ = ["BroadcastContext", "BroadcastProcessFunction", "BroadcastState", "KeyedBroadcastContext",
           "KeyedBroadcastProcessFunction"]
