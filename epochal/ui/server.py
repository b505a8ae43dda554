"""The dashboard's HTTP server: one page, its script and style, and a small JSON API.

Routes (``MetricsConfig.ui``; :class:`DashboardServer`):

* ``GET /`` — the page (``static/index.html``); ``GET /static/<file>`` its script and style.
  Static files carry no job data and need no token;
* ``GET /api/state`` — everything the page shows (:meth:`epochal.ui.model.DashboardModel.view`);
  the page polls it;
* ``GET /api/checkpoint?epoch=N`` — one checkpoint's page: every task's acknowledgement
  (:meth:`epochal.ui.model.DashboardModel.checkpoint`); 404 when the dashboard keeps none;
* ``POST /api/savepoint`` with ``{"stop": false}`` or ``{"stop": true}`` (and
  ``"drain": true``: end event time first, :meth:`JobHandle.stop_with_savepoint`) — take a
  savepoint (and stop the job with it); answers ``{"url": ...}`` once it is written, or
  ``{"error": ...}`` (HTTP 409).

Every ``/api`` call needs the job's token: in the ``X-Epochal-Token`` header, or — for GET
only — as ``?token=``. The actions accept the header only, which a page of another origin
cannot set without a CORS preflight this server never grants, so a link cannot trigger a
savepoint. The server binds the loopback interface by default (``MetricsConfig.ui_host``).
Its address is logged without the token; the URL with it is ``JobHandle.ui_url`` and is
printed on the terminal (stderr, when it is one) — never to a log, which others may read.

Bounded (issue 51): each connection's socket times out after :data:`REQUEST_TIMEOUT`
seconds without progress, and at most :data:`MAX_CONNECTIONS` are served at once (one
thread each); a connection beyond that is closed at once. So idle or half-sent requests
cost a bounded number of threads, for a bounded time.
"""
from __future__ import annotations

import hmac
import json
import logging
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from epochal.errors import ConfigError

__all__ = ["DashboardServer"]

log = logging.getLogger("epochal")

_STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "application/javascript; charset=utf-8",
           "format.js": "application/javascript; charset=utf-8", "drilldown.js": "application/javascript; charset=utf-8",
           "style.css": "text/css; charset=utf-8"}
#: how long an action waits for its savepoint before answering
ACTION_TIMEOUT = 300.0
#: seconds a connection may stay silent (reading its request, or between keep-alive requests)
REQUEST_TIMEOUT = 10.0
#: connections served at once; one beyond is closed at once
MAX_CONNECTIONS = 32


class _BoundedServer(ThreadingHTTPServer):
    """A :class:`ThreadingHTTPServer` with at most ``max_connections`` handler threads."""

    daemon_threads = True
    request_queue_size = 128  # accepted promptly (and refused at once beyond the cap), not left in SYN retries

    def __init__(self, address, handler, max_connections: int):
        self._slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _static(name: str) -> bytes:
    return resources.files("epochal.ui").joinpath("static", name).read_bytes()


class DashboardServer:
    """Serves one job's dashboard on ``host:port`` (``port`` 0: any free port) until
    :meth:`close`.

    Args:
        view: returns the ``/api/state`` document (a JSON-able dict).
        savepoint: ``savepoint(stop: bool, timeout: float) -> url``, blocking until the
            savepoint is written; ``None``: the actions are off (a read-only view).
        token: the secret every ``/api`` call must present; ``None``: a random one.
        request_timeout, max_connections: the bounds of the module docstring.
        checkpoint: ``checkpoint(epoch) -> dict | None``, one checkpoint's page; ``None``: none kept.

    Raises:
        ConfigError: ``host:port`` cannot be bound.
    """

    def __init__(self, view, savepoint=None, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 name: str = "job", request_timeout: float = REQUEST_TIMEOUT, max_connections: int = MAX_CONNECTIONS,
                 checkpoint=None):
        self.token = token or secrets.token_urlsafe(24)
        self._view = view
        self._checkpoint = checkpoint
        self._savepoint = savepoint
        handler = type("Handler", (_Handler,), {"dashboard": self, "timeout": request_timeout})
        try:
            self._server = _BoundedServer((host, port), handler, max_connections)
        except OSError as exc:
            raise ConfigError(f"metrics.ui_host / ui_port: cannot serve the dashboard on {host}:{port}: {exc}") from exc
        self.address = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"epochal-ui-{name}", daemon=True)
        self._thread.start()
        log.info("job %s: dashboard at %s (its token: JobHandle.ui_url)", name, self.base_url)
        if sys.stderr.isatty():  # the token goes to the terminal only, never to a log
            print(f"epochal: dashboard of job {name}: {self.url}", file=sys.stderr, flush=True)

    @property
    def refused(self) -> int:
        """Connections closed at once because :data:`MAX_CONNECTIONS` were being served."""
        return self._server.refused

    @property
    def base_url(self) -> str:
        """The page's address without the token (what may be logged)."""
        host, port = self.address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/"

    @property
    def url(self) -> str:
        """The page's address with the token (what to open in a browser)."""
        return f"{self.base_url}?token={self.token}"

    def authorised(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.token.encode())

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    dashboard: DashboardServer
    server_version = "epochal"

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        log.debug("dashboard: " + format, *args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, doc) -> None:
        self._send(status, json.dumps(doc, default=str, allow_nan=False).encode(), "application/json")

    def do_GET(self):  # noqa: N802 - http.server's name
        parts = urlsplit(self.path)
        if parts.path in ("/", "/index.html"):
            return self._send(200, _static("index.html"), _STATIC["index.html"])
        if parts.path.startswith("/static/") and parts.path[len("/static/"):] in _STATIC:
            name = parts.path[len("/static/"):]
            return self._send(200, _static(name), _STATIC[name])
        if parts.path in ("/api/state", "/api/checkpoint"):
            query = parse_qs(parts.query)
            token = self.headers.get("X-Epochal-Token") or (query.get("token") or [None])[0]
            if not self.dashboard.authorised(token):
                return self._json(401, {"error": "missing or wrong token (open the URL the driver logged)"})
            try:
                if parts.path == "/api/checkpoint":
                    return self._checkpoint_page(query)
                return self._json(200, _finite(self.dashboard._view()))
            except Exception as exc:  # the page shows it; the job never notices
                log.exception("dashboard: building the page's state failed")
                return self._json(500, {"error": f"{type(exc).__name__}: {exc}"})
        return self._json(404, {"error": f"no such page: {parts.path}"})

    def _checkpoint_page(self, query: dict) -> None:
        try:
            epoch = int((query.get("epoch") or [""])[0])
        except ValueError:
            return self._json(400, {"error": "/api/checkpoint needs ?epoch=<an integer>"})
        page = self.dashboard._checkpoint(epoch) if self.dashboard._checkpoint is not None else None
        if page is None:
            return self._json(404, {"error": f"this dashboard keeps no acknowledgements of epoch {epoch}"})
        return self._json(200, _finite(page))

    def do_POST(self):  # noqa: N802
        parts = urlsplit(self.path)
        if parts.path != "/api/savepoint":
            return self._json(404, {"error": f"no such action: {parts.path}"})
        if not self.dashboard.authorised(self.headers.get("X-Epochal-Token")):
            return self._json(401, {"error": "actions need the token in the X-Epochal-Token header"})
        if self.dashboard._savepoint is None:
            return self._json(405, {"error": "this dashboard is read-only (a job started elsewhere)"})
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(min(length, 4096)) or b"{}")
            stop, drain = body.get("stop", False), body.get("drain", False)
            for name, value in (("stop", stop), ("drain", drain)):
                if not isinstance(value, bool):
                    raise ValueError(f"{name!r} must be true or false, got {value!r}")
            if drain and not stop:
                raise ValueError("'drain' ends event time before stopping: it needs 'stop': true")
        except (ValueError, AttributeError) as exc:
            return self._json(400, {"error": f"bad request body: {exc}"})
        log.info("dashboard: savepoint requested%s", " (then drain and stop)" if drain else " (then stop)" if stop else "")
        try:
            url = self.dashboard._savepoint(stop, ACTION_TIMEOUT, drain)
        except Exception as exc:
            return self._json(409, {"error": f"{type(exc).__name__}: {exc}"})
        return self._json(200, {"url": url, "stop": stop, "drain": drain})


def _finite(doc):
    """``doc`` with infinite and NaN floats as ``None`` (JSON has no such numbers)."""
    if isinstance(doc, float):
        return doc if doc == doc and doc not in (float("inf"), float("-inf")) else None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite(v) for v in doc]
    return doc
