"""What a task does for queries of its queryable state (seed 004 §4.3.1, :mod:`epochal.query`).

* after its restore, :meth:`QuerySteps._serve_queries` pins the restored epoch (committed by
  definition) and starts the task's :class:`~epochal.query.server.QueryServer`;
* at every aligned barrier, :meth:`QuerySteps.pin_query_view` pins the epoch's cut (the
  versions keeper promotes it when the epoch completes, ``Task._drain_control``);
* a read-uncommitted lookup arrives from a query thread (:meth:`QuerySteps._read_live`) as
  a ``("query", ...)`` mailbox message and is answered on the task thread
  (:meth:`QuerySteps._answer_live`), which pickles the values before any other thread sees them.

A mixin of :class:`~epochal.runtime.task.task.Task`: the state it reads and changes is the
task's own; only ``_read_live`` runs on another thread (and touches only the mailbox).
"""
from __future__ import annotations

import threading

from epochal.query.server import UNALIGNED_REFUSAL, QueryServer, read_live
from epochal.query.handover import SidecarHandover
from epochal.query.versions import PinnedVersion


class QuerySteps:
    """The query side of :class:`~epochal.runtime.task.task.Task`."""

    def _serve_queries(self, restore: dict | None) -> None:
        """With queryable state: pin the restored epoch (committed by definition, before any
        replayed or new record), start the query server, register it with the coordinator
        (so queries reach this task only once its state is restored)."""
        if not self.queryable or self.backend is None or self.attempt.query_key is None:
            return
        unaligned = self.attempt.components.aligned_timeout == 0  # no epoch of this job is an aligned cut
        config = dict(key=self.query_key or self.attempt.query_key, host=self.bind_host, task=self.spec.id,
                      key_groups=self.spec.key_groups, registry=self.queryable,
                      committed_refused=UNALIGNED_REFUSAL if unaligned else None,
                      peer_timeout=self.attempt.peer_timeout, tls=self.attempt.query_tls)
        if self.backend.serves_queries_from_checkpoints:  # off the task's interpreter lock, once ready
            handover = SidecarHandover(config, self._read_live, self._register_queries)
            self.query_server = handover
            self.query_versions.close()
            self.query_versions = handover.versions
            if restore is not None:
                self.query_versions.restored(restore["epoch"], self._pin_version())
            handover.start()  # in-process answers until the sidecar is ready
            return
        if restore is not None:
            self.query_versions.restored(restore["epoch"], self._pin_version())
        if self.query_server is None:
            self.query_server = QueryServer(config.pop("key"), config.pop("host"), config.pop("task"),
                                            config.pop("key_groups"), config.pop("registry"), self.query_versions,
                                            self._read_live, **config)
            self._register_queries(self.query_server.address[1])

    def rekey_queries(self, key: bytes) -> None:
        """Task thread: the job's query token was revoked; the query server (and a later
        one) accepts only ``key``, its connections of the old token are dropped."""
        self.query_key = key
        if self.query_server is not None:
            self.query_server.rekey(key)

    def _register_queries(self, port: int) -> None:
        """Tell the coordinator where this task's queries go (task thread, or a sidecar's
        reader thread at its handover; the connection's sends are locked)."""
        self._send(("query_address", self.spec.id, (self.host, port)))

    def pin_query_view(self, epoch: int) -> None:
        """At barrier ``epoch`` (task thread, right after the backend's snapshot): pin the
        queryable state of the epoch's cut; it answers queries once the epoch completes.
        Not called for an unaligned snapshot (its records in flight are channel state, not
        in the keyed state): multi-key answers then use an older epoch every task holds."""
        if self.query_server is not None:
            self.query_versions.pinned(epoch, self._pin_version())

    def _pin_version(self) -> PinnedVersion:
        """Task thread: the backend states every reader needs, pinned, with the readers'
        marks of this instant (e.g. a window operator's watermark)."""
        readers = self.queryable.values()
        states = sorted({s for r in readers for s in r.states})
        whole_maps = self.backend.serves_queries_from_checkpoints or any(r.whole_maps for r in readers)
        view = self.backend.pin_view(states, whole_maps=whole_maps)
        return PinnedVersion(view, {name: r.mark() for name, r in self.queryable.items()})

    def _read_live(self, state: str, items: list, timeout: float = 5.0) -> bytes:
        """Query thread: a read-uncommitted lookup, run on the task thread via the mailbox
        (:meth:`_answer_live`); raises ``TimeoutError`` if the task does not get to it."""
        box = {"done": threading.Event()}
        with self.cv:
            self.control.append(("query", state, items, box))
            self.cv.notify_all()
        if not box["done"].wait(timeout):
            raise TimeoutError(f"task {self.spec.id} did not answer a live lookup within {timeout} s")
        if "error" in box:
            raise box["error"]
        return box["payload"]

    def _answer_live(self, msg: tuple) -> None:
        """Task thread: answer a ``("query", state, items, box)`` message."""
        box = msg[3]
        try:
            box["payload"] = read_live(self.backend, self.queryable[msg[1]], msg[2])
        except Exception as exc:
            box["error"] = exc
        box["done"].set()
