"""What the driver remembers of an attempt's epochs, in memory that does not grow with them.

A job that checkpoints every 50 ms completes 1.7 million epochs a day. The driver needs
three things from them: the recent ones in detail (``JobResult.completed_epochs``, the
benchmarks' per-epoch timings, the cause of the last abort), how many there were, and
the distribution of their durations and sizes (the live metrics' p50 / p99). So
:class:`EpochHistory` keeps

* the newest ``window`` completed and aborted epochs as given (Flink's checkpoint
  history, ``web.checkpoints.history``, keeps 10 for its UI);
* counts of every completed and aborted epoch;
* streaming :class:`~epochal.metrics.quantiles.Summary`\\ s of every completed epoch's
  ``duration_s`` and ``bytes`` (within 1 %), so percentiles cover the whole attempt without
  keeping or re-sorting its epochs.

Nothing else is kept, so the memory is bounded by ``window`` whatever the run's length.
Appends come from the coordinator thread and reads from the metrics thread: every method
takes the history's lock, and reads return copies.

>>> h = EpochHistory(window=2)
>>> for e in (1, 2, 3):
...     h.add_completed({"epoch": e, "duration_s": 0.1 * e, "bytes": 100})
>>> [e["epoch"] for e in h.completed], h.completed_count, h.latest["epoch"]
([2, 3], 3, 3)
"""
from __future__ import annotations

import collections
import threading

from epochal.metrics.quantiles import Summary

__all__ = ["DEFAULT_WINDOW", "EpochHistory"]

#: completed (and aborted) epochs kept in detail by default (CheckpointConfig.history)
DEFAULT_WINDOW = 1000


class EpochHistory:
    """The newest ``window`` completed and aborted epochs, and summaries of all of them
    (see the module docstring).

    Raises:
        ValueError: ``window`` < 1.
    """

    def __init__(self, window: int = DEFAULT_WINDOW):
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"history window must be an integer >= 1, got {window!r}")
        self.window = window
        self._lock = threading.Lock()
        self._completed: collections.deque = collections.deque(maxlen=window)
        self._aborted: collections.deque = collections.deque(maxlen=window)
        self._completed_count = 0
        self._aborted_count = 0
        self._durations = Summary()
        self._bytes = Summary()

    # -- writes (the coordinator thread) -------------------------------------------------
    def add_completed(self, entry: dict) -> None:
        """Record a completed epoch: ``entry`` (kept as given while among the newest
        ``window``) with ``duration_s`` and ``bytes`` counted in the summaries when present."""
        with self._lock:
            self._completed.append(entry)
            self._completed_count += 1
            if entry.get("duration_s") is not None:
                self._durations.add(entry["duration_s"])
            self._bytes.add(entry.get("bytes", 0) or 0)

    def add_aborted(self, entry: dict) -> None:
        """Record an aborted epoch (``epoch``, ``reason``, ``detail``)."""
        with self._lock:
            self._aborted.append(entry)
            self._aborted_count += 1

    # -- reads (any thread) --------------------------------------------------------------
    @property
    def completed(self) -> list[dict]:
        """The newest completed epochs, oldest first (at most ``window``; a copy)."""
        with self._lock:
            return list(self._completed)

    @property
    def aborted(self) -> list[dict]:
        """The newest aborted epochs, oldest first (at most ``window``; a copy)."""
        with self._lock:
            return list(self._aborted)

    @property
    def latest(self) -> dict | None:
        """The newest completed epoch's entry, or ``None``."""
        with self._lock:
            return self._completed[-1] if self._completed else None

    @property
    def latest_aborted(self) -> dict | None:
        with self._lock:
            return self._aborted[-1] if self._aborted else None

    @property
    def completed_count(self) -> int:
        """Every completed epoch recorded, including those no longer in the window."""
        return self._completed_count

    @property
    def aborted_count(self) -> int:
        return self._aborted_count

    def __len__(self) -> int:
        """Completed epochs in the window."""
        return len(self._completed)

    def summary(self) -> dict:
        """Counts and the duration / size distributions of every completed epoch:
        ``{"completed", "aborted", "duration_s": Summary.to_dict(), "bytes": ...}``."""
        with self._lock:
            return {"completed": self._completed_count, "aborted": self._aborted_count,
                    "duration_s": self._durations.to_dict(), "bytes": self._bytes.to_dict()}

    def quantile(self, what: str, q: float) -> float | None:
        """Percentile ``q`` (0..100) of every completed epoch's ``"duration_s"`` or ``"bytes"``."""
        summary = {"duration_s": self._durations, "bytes": self._bytes}[what]
        with self._lock:
            return summary.quantile(q)
