"""The caller's view of a running job (:class:`JobHandle`: wait, trigger, cancel,
savepoints, queries) and the build-time check of a drain request (:func:`check_drain`).

The handle only forwards to its :class:`~epochal.runtime.driver.attempts.JobDriver`, which
runs the attempts on its own thread; nothing here blocks that thread.
"""
from __future__ import annotations

import time

from epochal.errors import ConfigError
from epochal.query import QueryResult
from epochal.query.protocol import READ_COMMITTED
from epochal.runtime.driver.result import JobResult

__all__ = ["JobHandle", "check_drain"]

def check_drain(plan, checkpoint) -> None:
    """Refuse ``stop_with_savepoint(drain=True)`` where the end of event time could not
    precede the drain's barrier everywhere (:mod:`epochal.runtime.driver.savepoints`).

    Raises:
        ConfigError: unaligned checkpoints (``checkpoint.unaligned`` /
            ``checkpoint.aligned_timeout``: a barrier may overtake the watermark), or loops
            (their end of event time waits for the loop's quiescence)."""
    if checkpoint.unaligned or checkpoint.aligned_timeout is not None:
        key = "checkpoint.unaligned" if checkpoint.unaligned else "checkpoint.aligned_timeout"
        raise ConfigError(f"stop_with_savepoint(drain=True) needs aligned checkpoints, but {key} is set: an "
                          "unaligned barrier overtakes the end of event time, which would land after the "
                          "savepoint — stop without drain, or run the job with aligned checkpoints")
    if plan.loop_head_tasks:
        raise ConfigError(f"stop_with_savepoint(drain=True): job {plan.job!r} has loops, whose end of event time "
                          "waits for the loop to go quiet — stop without drain, or let the input end")


class JobHandle:
    """A running job: :meth:`wait` for its result, :meth:`trigger_epoch`, :meth:`cancel`,
    :meth:`savepoint`, :meth:`stop_with_savepoint`."""

    def __init__(self, driver):  # a JobDriver (not imported: attempts imports this module)
        self._driver = driver

    def trigger_epoch(self) -> None:
        """Ask for an epoch now (manual trigger; honours max_concurrent and min_pause).

        A request made before the job's coordinator exists (right after ``start``) is
        kept and delivered when it starts, so the first manual epoch is never lost."""
        self._driver.trigger_epoch()

    def cancel(self) -> None:
        self._driver.cancel()

    def metrics(self) -> dict:
        """The job's live metrics now: a progress event (:mod:`epochal.metrics.progress`)."""
        return self._driver.reporter.snapshot()

    @property
    def prometheus_address(self) -> tuple[str, int] | None:
        """``(host, port)`` of the Prometheus endpoint (``metrics.prometheus_port``), or None."""
        return self._driver.reporter.prometheus_address

    @property
    def ui_url(self) -> str | None:
        """The dashboard's address with its token (``metrics.ui``), or None."""
        return None if self._driver.dashboard is None else self._driver.dashboard.url

    def savepoint(self, url: str | None = None, timeout: float | None = None) -> str:
        """Take a savepoint: trigger an epoch and, once it completed, copy it to ``url``
        as a self-contained, relocatable savepoint that retention never deletes
        (:mod:`epochal.state.savepoint`). Blocks until it is written; returns its URL.

        Args:
            url: an empty or absent location (any fsspec URL); ``None``:
                ``<checkpoint root>/savepoints/sp-<epoch>-<random>``.
            timeout: seconds to wait at most.

        Raises:
            ConfigError: ``url`` is not empty, or lies inside the job's ``chk-*`` or
                ``shared`` directories (retention deletes there).
            SavepointError: its epoch was aborted, the job failed or finished first, or
                the copy failed (the job keeps running). TimeoutError: not within ``timeout``.
        """
        return self._driver.request_savepoint(url, stop=False).wait(timeout)

    def stop_with_savepoint(self, url: str | None = None, timeout: float | None = None, *,
                            drain: bool = False) -> str:
        """Take a savepoint (as :meth:`savepoint`), make sure every sink transaction up to
        its epoch is committed, and stop the job cleanly: no epoch after it is triggered,
        the tasks commit the savepoint's epoch, then finish (open transactions, holding
        records after the savepoint, are aborted). Blocks until the job has stopped;
        returns the savepoint's URL (also in :meth:`wait`'s ``JobResult.stopped_with_savepoint``).

        A job started with ``restore_from=url`` continues exactly where this one stopped.

        ``drain=True`` (Flink's ``stop --drain``): the sources stop reading and end event
        time before the savepoint's barrier, so every event-time window and timer fires and
        its output is committed with the savepoint's epoch — for a job you retire, not one
        you will resume: a job restored from a drained savepoint starts with every window
        of its keys fired (rows for them are late, or open a window again). Needs aligned
        checkpoints (the end of event time must not fall behind the barrier into channel
        state) and a job without loops (their end of event time waits for quiescence).

        Raises:
            As :meth:`savepoint`; if it fails the job keeps running (a failed attempt
            restarts it from its latest checkpoint) — a drain's abort fails the attempt
            (its sources stopped: it restarts from its latest checkpoint), a drain whose
            savepoint could not be copied stops all the same (the error names the
            checkpoint holding the drained state). The job's own failure, from :meth:`wait`.
            ConfigError: ``drain`` with unaligned checkpoints or loops.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        url = self._driver.request_savepoint(url, stop=True, drain=drain).wait(timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return url

    def wait(self, timeout: float | None = None, status: bool = False) -> JobResult:
        """Block until the job ends (or ``timeout``) and return its result; ``status``:
        rewrite a one-line live status on standard error meanwhile."""
        if status:
            from epochal.metrics.reporter import StatusLine

            line = StatusLine()
            deadline = None if timeout is None else time.monotonic() + timeout
            try:
                while self._driver.thread.is_alive() and (deadline is None or time.monotonic() < deadline):
                    self._driver.thread.join(0.5)
                    line.show(self.metrics())
            finally:
                line.end()
        self._driver.thread.join(timeout)
        if self._driver.thread.is_alive():
            raise TimeoutError(f"job {self._driver.plan.job!r} still running after {timeout} s")
        if self._driver.error is not None:
            raise self._driver.error
        return self._driver.result

    def query(self, operator: str, state: str, keys, *, isolation: str = READ_COMMITTED,
              timeout: float | None = None, pickled_values: bool = False) -> QueryResult:
        """Look up queryable state of the running job (seed 004 §4.3.1; :mod:`epochal.query`).

        ``keys``: a ``list`` of keys, or one key. ``isolation``: ``"read-committed"`` (the
        state as of the newest completed epoch, every key at the same epoch) or
        ``"read-uncommitted"`` (live state, no consistency across keys). Returns a
        :class:`~epochal.query.QueryResult` (``values``, ``epoch``, ``value``). Waits (up to
        ``timeout``, default 30 s) while the job starts or restarts. Values travel as data
        (str, int, float, bool, None, bytes, tuple, list, dict, set, windows);
        ``pickled_values=True`` for instances of your own classes (unpickled here).

        Raises:
            QueryError: the state is not declared queryable, unknown operator, bad
                isolation, or no answer within ``timeout``.
        """
        return self._driver.query_client().query(operator, state, keys, isolation=isolation, timeout=timeout,
                                                 pickled_values=pickled_values)

    @property
    def query_address(self) -> tuple[str, int]:
        """``(host, port)`` of the job's query directory, for ``QueryClient`` / ``epochal query``."""
        return self._driver.query_directory.address

    @property
    def query_token(self) -> str:
        """The secret a query client must present (give it only to who may read the state)."""
        return self._driver.query_token

    def revoke_query_token(self) -> str:
        """Revoke the query token and return its successor: from now on the query directory
        and every task's query server refuse the old token, and connections made with it
        are dropped (docs/security.md). Give the new one only to who may still read."""
        return self._driver.revoke_query_token()

    @property
    def query_tls(self):
        """An encrypted job's query certificate and key (:class:`~epochal.runtime.transport.tls.TLSMaterial`,
        picklable), which a ``QueryClient(address, token, tls=...)`` needs; ``None`` unencrypted."""
        return self._driver.query_tls

    @property
    def running(self) -> bool:
        """Whether the job still runs (:meth:`wait` would block)."""
        return self._driver.thread.is_alive()

    @property
    def completed_epochs(self) -> list[dict]:
        server = self._driver.server
        return list(server.completed) if server is not None else []
