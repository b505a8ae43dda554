"""Epoch barriers: the markers that separate epochs on every channel (seed 004, Alg. 5/6).

"Epoch" always means the checkpoint id (a positive integer, strictly increasing per job),
never event time.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Barrier:
    """Marker ⊙_n for epoch ``epoch``, injected by sources (Alg. 5) and forwarded by every
    task once it has snapshotted epoch ``epoch`` (Alg. 6).

    ``timestamp`` is the coordinator's wall-clock trigger time (``time.time()``), used only
    for metrics (alignment and end-to-end checkpoint durations).
    """

    epoch: int
    timestamp: float = 0.0
