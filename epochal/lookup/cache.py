"""The bounded cache of a lookup (:mod:`epochal.lookup`): at most ``max_entries`` keys, least
recently used first out, each entry fresh for ``refresh_after`` seconds from when it was read
(then the next use reads the table again); keys the table lacks are cached too, as missing,
for ``missing_after`` seconds. One cache per task (never shared, never checkpointed)."""
from __future__ import annotations

import collections
import time
from typing import Any, Callable

__all__ = ["MISSING", "LookupCache"]

#: what :meth:`LookupCache.get` returns for a key it holds no fresh entry for
MISSING = object()


class LookupCache:
    """``key -> row`` (``None``: the table has no row for the key) with LRU eviction and
    expiry after write. Not thread-safe (one task thread uses it)."""

    def __init__(self, max_entries: int, refresh_after: float | None, missing_after: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive integer, got {max_entries!r}")
        self.max_entries, self.refresh_after, self.clock = max_entries, refresh_after, clock
        self.missing_after = refresh_after if missing_after is None else missing_after
        self._entries: collections.OrderedDict[Any, tuple[float, Any]] = collections.OrderedDict()
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key):
        """The fresh cached row of ``key`` (``None``: known missing), or :data:`MISSING`."""
        entry = self._entries.get(key)
        if entry is not None:
            read_at, row = entry
            ttl = self.missing_after if row is None else self.refresh_after
            if ttl is None or self.clock() - read_at < ttl:
                self._entries.move_to_end(key)
                self.hits += 1
                return row
            del self._entries[key]
        self.misses += 1
        return MISSING

    def put(self, key, row) -> None:
        """Remember ``row`` (``None``: the table has none) as read now; evicts the least
        recently used keys beyond ``max_entries``."""
        self._entries[key] = (self.clock(), row)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evictions += 1
