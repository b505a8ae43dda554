"""One driver per job and checkpoint storage: a lease in the storage (issue 36).

Two drivers running one job on one checkpoint storage at once — the same script started
twice, a ``resume=True`` while the first still runs — would restore the same checkpoints,
claim interleaved generations, delete each other's checkpoints by retention and race in every
sink. So a driver takes the job's **lease** before it looks at anything else: the document
``<root>/<job>/_lease`` naming it (host, process, start time), renewed every
:data:`RENEW_S` seconds while the job runs and deleted when it ends. A second driver finding
a lease renewed less than :data:`TIMEOUT_S` ago refuses to start, naming the holder; a lease
whose driver died (its process is gone from this host, or it stopped renewing) is taken over.
A driver that finds its lease taken by another (it stalled longer than the timeout) fails its
job rather than race.

External targets shared by *different* storages (two jobs — or two runs of one job — writing
one PostgreSQL table under one job and sink name) are guarded by the sink itself
(:meth:`epochal.sinks.base.Sink.hold`).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from epochal.errors import ConfigError

log = logging.getLogger("epochal")

#: seconds between renewals of a held lease
RENEW_S = 2.0
#: a lease not renewed for this long is stale: its driver is gone
TIMEOUT_S = 12.0

DOCUMENT = "_lease"


def _alive_here(doc: dict) -> bool | None:
    """Whether the holder's process is alive, if it runs on this host (None: elsewhere)."""
    if doc.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(doc.get("pid", -1)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return True


class JobLease:
    """The lease of one job in one checkpoint storage, held by this driver.

    :meth:`acquire` takes it (or raises ConfigError naming the holder); a daemon thread
    renews it; :meth:`release` deletes it. ``on_lost(reason)`` is called (once, on the
    renewing thread) if another driver took the lease over.
    """

    def __init__(self, storage, job: str):
        self.storage, self.job = storage, job
        self.owner = uuid.uuid4().hex
        self.doc = {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        self.on_lost = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def acquire(cls, storage, job: str) -> JobLease:
        """Take the job's lease in ``storage``.

        Raises:
            ConfigError: another driver holds it (naming its host, process and start).
        """
        lease = cls(storage, job)
        held = storage.read_document(DOCUMENT)
        if held is not None and held.get("owner") != lease.owner:
            age = time.time() - float(held.get("renewed", 0))
            alive = _alive_here(held)
            if age < TIMEOUT_S and alive is not False:
                started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(held.get("started", 0))))
                raise ConfigError(
                    f"job {job!r} is already running on checkpoint storage {storage.root_url}: the driver in process "
                    f"{held.get('pid')} on host {held.get('host')} (started {started}) holds its lease, renewed "
                    f"{age:.1f} s ago. Two drivers of one job would race in every sink: stop that one first (or, if "
                    f"it is gone, retry after {TIMEOUT_S:.0f} s, when its lease expires)")
            log.info("job %s: taking over the lease of a driver that is gone (process %s on %s, renewed %.1f s ago)",
                     job, held.get("pid"), held.get("host"), age)
        lease._write()
        back = storage.read_document(DOCUMENT)
        if back is None or back.get("owner") != lease.owner:  # another driver wrote at the same moment
            raise ConfigError(f"job {job!r}: another driver took the lease on {storage.root_url} at the same moment "
                              f"(process {back and back.get('pid')} on {back and back.get('host')}); stop one of them")
        return lease

    def _write(self) -> None:
        self.storage.write_document(DOCUMENT, dict(self.doc, renewed=time.time()))

    def start(self) -> JobLease:
        """Renew the lease every :data:`RENEW_S` seconds on a daemon thread until :meth:`release`."""
        self._thread = threading.Thread(target=self._renew, name=f"epochal-lease-{self.job}", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                held = self.storage.read_document(DOCUMENT)
                if held is not None and held.get("owner") != self.owner:
                    reason = (f"another driver (process {held.get('pid')} on {held.get('host')}) took over the lease of "
                              f"job {self.job!r}: this driver did not renew it for {TIMEOUT_S:.0f} s")
                    log.error("job %s: %s", self.job, reason)
                    if self.on_lost is not None:
                        self.on_lost(reason)
                    return
                self._write()
            except Exception as exc:  # a storage outage: try again; a lease older than the timeout is taken over
                log.warning("job %s: renewing the lease failed: %s", self.job, exc)

    def release(self) -> None:
        """Stop renewing and delete the lease (unless another driver holds it now). Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(RENEW_S + 5)
        try:
            held = self.storage.read_document(DOCUMENT)
            if held is not None and held.get("owner") == self.owner:
                self.storage.delete_document(DOCUMENT)
        except Exception as exc:
            log.warning("job %s: releasing the lease failed (it expires in %.0f s): %s", self.job, TIMEOUT_S, exc)
