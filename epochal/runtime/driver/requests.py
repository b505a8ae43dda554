"""Savepoints of a running job requested from another process, through checkpoint storage.

``epochal savepoint trigger <storage> <job>`` (any host that can write the job's
checkpoint storage) publishes a request document; the job's driver looks for requests
every ``CheckpointConfig.requests_poll`` seconds, takes each one as if
``JobHandle.savepoint(url)`` / ``stop_with_savepoint(url)`` had been called in the driver,
and publishes the outcome next to it; the command waits for that answer and prints the
savepoint's URL::

    <storage>/<job>/_requests/sp-<id>.json        {"url", "stop", "drain", "requested"}   ← the command
    <storage>/<job>/_requests/sp-<id>.taken.json  {"taken"}                       ← the driver, first
    <storage>/<job>/_requests/sp-<id>.done.json   {"url", "epoch"} or {"error"}   ← the driver, last

The storage is the channel (like Flink's REST endpoint, but without a listening socket to
secure): whoever may write a job's checkpoints may ask for its savepoints — but not make the
driver write anywhere else: a requested location must lie under the job's own
``<storage>/<job>/savepoints/`` or a prefix of ``CheckpointConfig.savepoint_targets``
(:func:`target_allowed`, after normalising the path), else the request is answered with an
error and nothing is written. A driver takes a
request once (``taken`` is written before the savepoint starts, and a request with a
``taken`` or ``done`` document is never taken again, so a restarted driver with
``resume=True`` does not repeat it). The command deletes the three documents once it has
read the answer; when nobody answers within its timeout it withdraws the request, unless
a driver has taken it meanwhile.
"""
from __future__ import annotations

import logging
import posixpath
import threading
import time
import uuid

import fsspec

from epochal.errors import EpochalError

__all__ = ["RequestWatcher", "submit", "taken", "target_allowed", "wait_answer", "withdraw"]

log = logging.getLogger("epochal")
DIR = "_requests"
#: seconds the job's end waits for a request's answer (written at once once the tracker closed)
SERVE_JOIN_S = 60.0


def _location(url: str) -> tuple[str, str]:
    """``(protocol, normalised absolute path)`` of ``url`` (``..`` and ``//`` resolved)."""
    fs, path = fsspec.core.url_to_fs(url)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return {"local": "file"}.get(protocol, protocol), posixpath.normpath("/" + path.lstrip("/"))


def target_allowed(url: str, prefixes) -> bool:
    """Whether savepoint location ``url`` lies under one of ``prefixes`` (URLs or local
    paths), compared on protocol and normalised path: ``s3://b/job/savepoints/../../x`` is
    not under ``s3://b/job/savepoints``. An unparseable URL is not allowed."""
    try:
        protocol, path = _location(url)
    except Exception:
        return False
    for prefix in prefixes:
        try:
            p_protocol, p_path = _location(prefix)
        except Exception:
            continue
        if protocol == p_protocol and (path == p_path or path.startswith(p_path.rstrip("/") + "/")):
            return True
    return False


def _rel(rid: str, suffix: str = "") -> str:
    return f"{DIR}/{rid}{suffix}.json"


def submit(storage, url: str | None, stop: bool, drain: bool = False) -> str:
    """Publish a savepoint request for the job whose checkpoints ``storage`` holds (``drain``:
    a stop that ends event time first); returns its id (for :func:`wait_answer`)."""
    rid = f"sp-{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:8]}"
    storage.write_document(_rel(rid), {"url": url, "stop": bool(stop), "drain": bool(stop and drain),
                                       "requested": time.time()})
    return rid


def wait_answer(storage, rid: str, timeout: float, poll: float = 0.5) -> dict | None:
    """The driver's answer to request ``rid`` (``{"url", "epoch"}`` or ``{"error"}``), or
    ``None`` if it did not come within ``timeout`` seconds. Deletes the request's documents
    once answered."""
    deadline = time.monotonic() + timeout
    while True:
        answer = storage.read_document(_rel(rid, ".done"))
        if answer is not None:
            withdraw(storage, rid)
            return answer
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll)


def taken(storage, rid: str) -> bool:
    """Whether a driver has taken request ``rid`` (its answer may still be coming)."""
    return storage.read_document(_rel(rid, ".taken")) is not None


def withdraw(storage, rid: str) -> None:
    """Delete request ``rid``'s documents (idempotent)."""
    for suffix in ("", ".taken", ".done"):
        try:
            storage.fs.rm_file(f"{storage.root}/{_rel(rid, suffix)}")
        except FileNotFoundError:
            pass
        except Exception as exc:  # best effort: an orphan request is answered or ignored
            log.debug("could not delete %s: %s", _rel(rid, suffix), exc)


class RequestWatcher:
    """The driver's side: a daemon thread polling ``<job root>/_requests`` every ``poll``
    seconds and handing each new request to ``take(url, stop, drain)`` (the driver's
    ``request_savepoint``, which returns a
    :class:`~epochal.runtime.driver.savepoints.SavepointRequest`); one short thread per request
    waits for it and publishes the answer. A failing listing or document is logged and
    retried at the next poll; it never affects the job."""

    def __init__(self, storage, take, poll: float, job: str, targets=()):
        self.storage = storage
        #: where requested savepoints may go: the job's savepoints/ and CheckpointConfig.savepoint_targets
        self.targets = (storage.file_url("savepoints"), *targets)
        self.take = take
        self.poll = poll
        self.job = job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"epochal-requests-{job}", daemon=True)
        self._lock = threading.Lock()
        self._serving: list[threading.Thread] = []  # one per request taken (joined by close)

    def start(self) -> "RequestWatcher":
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop polling, then wait for the poll thread and for every request's answer to
        be written: nothing of the watcher writes into the storage after it returns. Called
        by the driver at the job's end, after the job's savepoint tracker closed (every
        request then ends: its copy finished or it failed, so its answer follows at once).
        Idempotent."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            serving, self._serving = self._serving, []
        for thread in serving:
            thread.join(SERVE_JOIN_S)  # a guard only: the closed tracker ends every request at once
            if thread.is_alive():
                log.warning("job %s: the answer of savepoint request %s is still pending at the job's end",
                            self.job, thread.name.removeprefix("epochal-request-"))

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._scan()
            except Exception as exc:  # noqa: BLE001 - storage hiccups must not end the watcher
                log.warning("job %s: cannot read savepoint requests in %s: %s", self.job,
                            self.storage.file_url(DIR), exc)

    def _scan(self) -> None:
        fs, root = self.storage.fs, f"{self.storage.root}/{DIR}"
        fs.invalidate_cache(root)
        try:
            names = [n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(root, detail=False)]
        except FileNotFoundError:
            return
        present = set(names)
        for name in sorted(names):
            if not name.startswith("sp-") or not name.endswith(".json") or name.count(".") != 1:
                continue  # answers, claims and temporary files
            rid = name[: -len(".json")]
            if f"{rid}.taken.json" in present or f"{rid}.done.json" in present:
                continue
            request = self.storage.read_document(_rel(rid))
            if request is None:  # withdrawn meanwhile
                continue
            self.storage.write_document(_rel(rid, ".taken"), {"taken": time.time()})
            log.info("job %s: savepoint requested from outside the driver (%s%s)", self.job,
                     request.get("url") or "default location", ", then stop" if request.get("stop") else "")
            serve = threading.Thread(target=self._serve, args=(rid, request), name=f"epochal-request-{rid}",
                                     daemon=True)
            with self._lock:  # started under the lock: close() never joins one not yet started
                serve.start()
                self._serving = [t for t in self._serving if t.is_alive()] + [serve]

    def _serve(self, rid: str, request: dict) -> None:
        url = request.get("url")
        try:
            if url is not None and not (isinstance(url, str) and target_allowed(url, self.targets)):
                log.warning("job %s: refused a savepoint request to %r from the storage: not under %s", self.job, url,
                            " or ".join(self.targets))
                raise ValueError(
                    f"savepoint location {url!r} is not allowed for requests through the checkpoint storage: "
                    f"it must lie under {' or '.join(self.targets)} (add a prefix to the job's "
                    "CheckpointConfig.savepoint_targets to allow another one)")
            pending = self.take(url, bool(request.get("stop")), bool(request.get("drain")))
            url = pending.wait()
            answer = {"url": url, "epoch": pending.epoch}
        except (EpochalError, ValueError, OSError) as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            self.storage.write_document(_rel(rid, ".done"), answer)
        except Exception as exc:  # noqa: BLE001
            log.warning("job %s: cannot answer savepoint request %s: %s", self.job, rid, exc)
