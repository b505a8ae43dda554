"""A RocksDB task's query sidecar: read-committed lookups served by another process, off
the task's interpreter lock (seed 004 §4.3.1; docs/queryable-state.md "Cost"). On by
default for RocksDB; opt out with ``BackendSpec("rocksdb", {"query_sidecar": False})``.

Why: a task with RocksDB state calls into rocksdict at every barrier — the snapshot's
checkpoint (hard links and manifest syncs: 10–30 ms on a loaded disk) and the uploader's
read-only open of it (4–6 ms) — and rocksdict holds the interpreter lock through both. A
query thread of the task process waited them out: point-lookup p99 of 13–30 ms measured
at 100k records/s, where the heap backend answers in 1.4–4.5 ms. The sidecar is a child process of the task with its own
interpreter: it serves the task's query port, opens each pinned version — the barrier's own
snapshot checkpoint, shared (:meth:`~epochal.backends.rocksdb.RocksDBStateBackend.pin_view`)
— read-only (:class:`~epochal.backends.views.CheckpointView`), and answers read-committed
lookups without ever waiting for the task. Until the child is ready the task answers
in-process and then hands over (:mod:`epochal.query.handover`).

Parent side (:class:`QuerySidecar`, task thread; one reader thread for the child's
messages) and child side (:func:`serve`, started by :data:`_BOOT`) talk over a socket pair
of pickled messages:

* parent → child: ``("pinned", epoch, token, path, marks)``, ``("restored", ...)`` (same),
  ``("completed", epoch)``, ``("aborted", epoch)``, ``("live-answer", rid, payload, error)``;
  ``("handover",)`` once (:mod:`epochal.query.handover`);
* child → parent: ``("address", port)`` once (it listens), ``("ready", port)`` in answer to
  ``"handover"`` (everything sent before it is taken in), ``("release", token)`` when a version left
  the child's held set (the parent then lets the checkpoint go), ``("live", rid, name,
  items)`` for a read-uncommitted lookup, which the parent runs through the task's mailbox.

The child exits when the socket pair closes (the task ended, or was killed): it never
outlives its task. The child's :class:`~epochal.query.server.QueryServer` is the same as
the in-process one; only the views differ.
"""
from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection

import cloudpickle

from epochal.query.versions import CommittedVersions, PinnedVersion

log = logging.getLogger("epochal")

#: the child's start: ``epochal``, ``epochal.backends``, ``epochal.query`` and ``epochal.windows``
#: (the query codec names its Window types) as bare packages,
#: so that their ``__init__`` (the whole library: numpy, pyarrow — 0.5 s of CPU, seconds of
#: wall time on a loaded machine, while queries wait) is not run; the modules the child
#: uses, and those of the readers it unpickles, are imported as usual
_BOOT = """
import importlib.util, sys, types
for name in ("epochal", "epochal.backends", "epochal.query", "epochal.windows"):
    spec = importlib.util.find_spec(name)
    package = types.ModuleType(name)
    package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
    sys.modules[name] = package
from epochal.query.sidecar import serve
serve(int(sys.argv[1]))
"""


class QuerySidecar:
    """The task's handle on its sidecar: the ``versions`` keeper the task feeds (same
    methods as :class:`~epochal.query.versions.CommittedVersions`) and the server's
    ``address`` / :meth:`close`. Built on the task thread, after the restore.

    The task does not wait for the child's interpreter to start (0.3–3 s under load): the
    versions it pins meanwhile queue in the socket pair; ``on_address(port)`` is called
    (on the reader thread) once the child listens, and ``on_ready(port)`` once the child
    has taken in everything sent before :meth:`hand_over` (:mod:`epochal.query.handover`).

    Args:
        config: what the child's :class:`~epochal.query.server.QueryServer` needs
            (``key, host, task, key_groups, registry, peer_timeout, tls, committed_refused``).
        live_read: the task's ``live_read(name, items) -> bytes`` (any thread).
        on_address: ``on_address(port)``, the child listens (reader thread).
        on_ready: ``on_ready(port)``, the child answered :meth:`hand_over` (reader thread).
    """

    def __init__(self, config: dict, live_read, on_address, on_ready=None):
        ours, theirs = socket.socketpair()
        self._conn = Connection(os.dup(ours.fileno()))
        ours.close()
        self._live_read = live_read
        self._send_lock = threading.Lock()
        self._held: dict[int, PinnedVersion] = {}  # token -> the task-side view (its checkpoint)
        self._lock = threading.Lock()
        self._tokens = itertools.count()
        self._closed = False
        self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self._on_address, self._on_ready, self.task = on_address, on_ready, config["task"]
        self._send(("config", cloudpickle.dumps(config)))
        self.versions = _Versions(self)
        self._reader = threading.Thread(target=self._read, name=f"query-sidecar-{self.task}", daemon=True)
        self._reader.start()

    def _send(self, msg) -> None:
        with self._send_lock:
            try:
                self._conn.send(msg)
            except OSError:  # the child is gone: the task learns it from its queries' errors
                pass

    def rekey(self, key: bytes) -> None:
        """The query token was revoked: the child's server accepts only ``key`` (any thread)."""
        self._send(("rekey", key))

    def hand_over(self) -> None:
        """Ask the child to answer ``("ready", port)`` once it has taken in every message
        sent before this one (any thread; the caller orders it after its pins)."""
        self._send(("handover",))

    def _pin(self, kind: str, epoch: int, version: PinnedVersion) -> None:
        token = next(self._tokens)
        with self._lock:
            if self._closed:
                version.release()
                return
            self._held[token] = version
        self._send((kind, epoch, token, version.view.checkpoint, version.marks))

    def _read(self) -> None:
        """Reader thread: the child's releases and live lookups, until it goes."""
        try:
            while True:
                msg = self._conn.recv()
                if msg[0] in ("address", "ready"):
                    callback = self._on_address if msg[0] == "address" else self._on_ready
                    try:
                        if callback is not None:
                            callback(msg[1])
                    except Exception:  # the task is ending (its coordinator connection closed)
                        log.warning("task %s: registering its query sidecar failed", self.task, exc_info=True)
                elif msg[0] == "error":
                    log.error("task %s: its query sidecar did not start: %s", self.task, msg[1])
                elif msg[0] == "release":
                    with self._lock:
                        version = self._held.pop(msg[1], None)
                    if version is not None:
                        version.release()
                elif msg[0] == "live":
                    threading.Thread(target=self._answer_live, args=msg[1:], daemon=True).start()
        except (EOFError, OSError):
            pass
        finally:
            self._release_all()

    def _answer_live(self, rid: int, name: str, items: list) -> None:
        try:
            self._send(("live-answer", rid, self._live_read(name, items), None))
        except Exception as exc:  # TimeoutError (the task is busy) or the reader's error
            self._send(("live-answer", rid, None, exc))

    def _release_all(self) -> None:
        with self._lock:
            self._closed = True
            held, self._held = list(self._held.values()), {}
        for version in held:
            version.release()

    def close(self) -> None:
        """Stop the child (it keeps nothing: terminated, not asked), release every
        version (the reader thread's releases too, before returning). Idempotent."""
        try:
            self._conn.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._release_all()
        if threading.current_thread() is not self._reader:  # it may be releasing what it popped
            self._reader.join(5)


class _Versions:
    """What the task calls on its versions keeper, forwarded to the child."""

    def __init__(self, sidecar: QuerySidecar):
        self._sidecar = sidecar

    def pinned(self, epoch: int, version: PinnedVersion) -> None:
        self._sidecar._pin("pinned", epoch, version)

    def restored(self, epoch: int, version: PinnedVersion) -> None:
        self._sidecar._pin("restored", epoch, version)

    def completed(self, epoch: int) -> None:
        self._sidecar._send(("completed", epoch))

    def aborted(self, epoch: int) -> None:
        self._sidecar._send(("aborted", epoch))

    def close(self) -> None:
        self._sidecar.close()


# ---------------------------------------------------------------------------- child side
def serve(fd: int) -> None:
    """The child: serve the task's queries until the socket pair closes."""
    from epochal.backends.views import CheckpointView
    from epochal.query.server import QueryServer

    conn = Connection(fd)
    send_lock = threading.Lock()

    def send(msg) -> None:
        with send_lock:
            conn.send(msg)

    config = cloudpickle.loads(conn.recv()[1])
    versions = CommittedVersions()
    waiting: dict[int, dict] = {}
    rids = itertools.count()

    def live_read(name: str, items: list) -> bytes:
        rid = next(rids)
        box = waiting[rid] = {"done": threading.Event()}
        send(("live", rid, name, items))
        try:
            if not box["done"].wait(10.0):
                raise TimeoutError(f"task {config['task']} did not answer a live lookup within 10 s")
        finally:
            waiting.pop(rid, None)
        if box["error"] is not None:
            raise box["error"]
        return box["payload"]

    try:
        server = QueryServer(config["key"], config["host"], config["task"], config["key_groups"], config["registry"],
                             versions, live_read, peer_timeout=config["peer_timeout"], tls=config["tls"],
                             committed_refused=config["committed_refused"])
    except Exception as exc:
        send(("error", f"{type(exc).__name__}: {exc}"))
        return
    def version(token: int, path: str, marks: dict) -> PinnedVersion:
        def released() -> None:
            try:
                send(("release", token))
            except OSError:
                pass
        return PinnedVersion(CheckpointView(path, released), marks)

    try:
        send(("address", server.address[1]))
        while True:
            msg = conn.recv()
            kind = msg[0]
            if kind in ("pinned", "restored"):
                try:
                    pinned = version(*msg[2:])
                except Exception:  # this version cannot be read: never served, its checkpoint goes
                    traceback.print_exc()
                    send(("release", msg[2]))
                    continue
                (versions.pinned if kind == "pinned" else versions.restored)(msg[1], pinned)
            elif kind == "completed":
                versions.completed(msg[1])
            elif kind == "aborted":
                versions.aborted(msg[1])
            elif kind == "rekey":  # the query token was revoked
                server.rekey(msg[1])
            elif kind == "handover":  # every earlier message is taken in
                send(("ready", server.address[1]))
            elif kind == "live-answer":
                box = waiting.get(msg[1])
                if box is not None:
                    box["payload"], box["error"] = msg[2], msg[3]
                    box["done"].set()
    except (EOFError, OSError):
        pass
    finally:
        server.close()
        versions.close()
        os._exit(0)  # the server's threads are daemons; nothing else to wait for


