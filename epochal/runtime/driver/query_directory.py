"""The driver's query directory: tells query clients where each operator's key groups are
served (seed 004 §4.3.1: "the query client asks the JobManager for the location of the
operator instance holding the state partition for the queried key").

One per job, for the whole job (its address outlives restarts). Bound where the
coordinator binds (loopback on local runs), authenticated with the job's query key
(:func:`epochal.query.protocol.query_key`), speaking data-only tagged JSON (never pickle:
the token lets a client read, nothing more), inside TLS pinned to the job's query
certificate when the job is encrypted (on a cluster, by default); answers ``("routes",)`` with the current
attempt's routes, or ``None`` while no attempt runs. Tasks register their query servers
with the coordinator after restoring their state (``("query_address", task, address)``).
"""
from __future__ import annotations

from collections.abc import Callable

from epochal.query.protocol import CODEC
from epochal.runtime.transport import wire


def routes_of(plan, generation: int, addresses: dict) -> dict:
    """The routes message body for ``plan`` given the registered ``{task: (host, port)}``."""
    operators: dict[str, list] = {}
    expected: dict[str, int] = {}
    for spec in plan.tasks:
        for op in spec.chain:
            expected[op] = expected.get(op, 0) + 1
        address = addresses.get(spec.id)
        if address is None:
            continue
        for op in spec.chain:
            operators.setdefault(op, []).append((spec.id, spec.key_groups.start, spec.key_groups.stop, tuple(address)))
    return {"generation": generation, "max_parallelism": plan.max_parallelism, "operators": operators,
            "expected": expected}


class QueryDirectory:
    """Serves ``routes()`` (a dict, or ``None``) to authenticated query clients."""

    def __init__(self, key: bytes, host: str, routes: Callable[[], dict | None], advertised_host: str | None = None,
                 tls=None):
        self._routes = routes
        self._answering = wire.Answering(self._answer, codec=CODEC, name="query directory")
        self.server = wire.Server(key, self._answering.serve, host=host, name="query-directory", tls=tls)
        self.address = (advertised_host or host, self.server.address[1])

    def _answer(self, msg):
        ok = type(msg) is tuple and msg[:1] == ("routes",)
        return ("routes", self._routes()) if ok else ("error", None, "unknown request")

    def rekey(self, key: bytes) -> None:
        """The query token was revoked: only ``key`` is accepted from now on, and the
        connections authenticated with the old one are dropped. Idempotent."""
        self.server.key = key
        self._answering.drop()

    def close(self) -> None:
        self.server.close()
        self._answering.close()
