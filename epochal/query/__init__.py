"""Queryable state: ask a running job for keyed state (seed 004 §4.3.1).

State declared queryable (``ctx.value_state("balance", queryable=True)``, a map state, a
``reduce``'s accumulator, a window operator's open windows, the columnar aggregate's results:
:mod:`~epochal.query.readers`) is served by a query server in every task that holds it. Two
isolation levels:

* ``"read-committed"`` (default): the state as of the newest *completed* epoch. Each task
  keeps a few pinned versions (:class:`~epochal.query.versions.CommittedVersions`: a view
  pinned at every barrier, promoted when the epoch completes); a multi-key query reads
  every key at the same epoch across subtasks — the job's consistent cut.
* ``"read-uncommitted"``: the live state, read on the task thread through its mailbox
  (Flink's queryable state): lowest latency, no consistency across keys.

Modules: :mod:`~epochal.query.readers` (how each kind of state is read),
:mod:`~epochal.query.versions` (which version answers), :mod:`~epochal.query.protocol`
(messages, routing, epoch choice), :mod:`~epochal.query.server` (task side),
:mod:`~epochal.query.client` (:class:`QueryClient`, used by ``JobHandle.query``,
``epochal.state.QueryClient`` and ``epochal query``).
"""
from epochal.query.client import QueryClient, QueryResult
from epochal.query.protocol import ISOLATION_LEVELS, JobEnded, QueryError

__all__ = ["ISOLATION_LEVELS", "JobEnded", "QueryClient", "QueryError", "QueryResult"]
