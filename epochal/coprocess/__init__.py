"""Two-input functions: ``a.connect(b).process(name, CoProcessFunction)`` and, keyed,
``a.key_by(f).connect(b.key_by(g)).process(name, KeyedCoProcessFunction)`` (Flink's
``connect`` + ``CoProcessFunction`` / ``KeyedCoProcessFunction``).

The two streams are ordinary input edges of one node, so their channels are ordinary
input channels of one task: barriers align over both (seed 004 Alg. 6), unaligned
snapshots record both, the task's event time is the minimum over both. The task tells the
operator which logical input a batch came from (:meth:`RuntimeOperator.select_input`);
keyed state and timers are shared by both sides of a key and move with its key group.
The joins (:mod:`epochal.joins`) are keyed two-input functions.
"""
from epochal.coprocess.functions import CoContext, CoProcessFunction, KeyedCoProcessFunction

__all__ = ["CoContext", "CoProcessFunction", "KeyedCoProcessFunction"]
