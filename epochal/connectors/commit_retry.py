"""Retrying a table commit that lost to concurrent commits, shared by the Delta and Iceberg sinks.

All subtasks of a table sink commit when the same checkpoint completes, so they race (on
Delta's next log version, on the Iceberg catalog's compare-and-swap) and all but one lose
each round. A commit that lost waits a random time up to a bound that doubles each attempt
(:func:`backoff`, "full jitter": contending subtasks spread out instead of colliding
again) and tries again, until :data:`COMMIT_DEADLINE_S` passed since its first attempt
(issue 36: a fixed 8 immediate attempts gave up at ~9 subtasks). The caller's loop::

    attempts = CommitAttempts()
    for attempt in attempts:
        ...                       # ask the table whether it holds the epoch; commit
        return                    # committed (or already held)
    raise ...(attempts.exhausted())
"""
from __future__ import annotations

import random
import time
from collections.abc import Iterator

#: how long one epoch's commit keeps trying after losing to concurrent commits
COMMIT_DEADLINE_S = 120.0
#: the first backoff bound and its cap (seconds): see :func:`backoff`
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.02, 0.5


def backoff(attempt: int, rng: random.Random = random._inst) -> float:
    """Seconds to wait before commit attempt ``attempt + 1``: uniform in ``[0, bound]`` with
    the bound doubling from :data:`BACKOFF_BASE_S` up to :data:`BACKOFF_CAP_S` ("full
    jitter"): subtasks that lost to each other spread out instead of colliding again."""
    return rng.uniform(0.0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1)))


class CommitAttempts:
    """The attempts of one epoch's commit, counted from when this object is made.

    Iterating yields the attempt numbers 1, 2, ...; before every attempt but the first it
    sleeps :func:`backoff`, and it ends (instead of sleeping) once more than
    :data:`COMMIT_DEADLINE_S` passed since the start. Single use, on the task thread."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.attempt = 0

    def __iter__(self) -> Iterator[int]:
        while True:
            if self.attempt:
                if self.elapsed() > COMMIT_DEADLINE_S:
                    return
                time.sleep(backoff(self.attempt))
            self.attempt += 1
            yield self.attempt

    def elapsed(self) -> float:
        """Seconds since the start (the first attempt)."""
        return time.monotonic() - self.started

    def exhausted(self) -> str:
        """The suffix of the error raised when the deadline ended the attempts."""
        return f" after {self.attempt} attempts in {COMMIT_DEADLINE_S:.0f} s"
