"""A real, throw-away PostgreSQL server for tests and benchmarks (DESIGN.md "Facts").

Load it as a plugin (``pytest_plugins = ["postgres_server"]``) for the session fixture
``postgres``, or call :func:`start_server`. The server runs as the ``postgres`` user
(``initdb`` refuses root) on a free loopback port, with its data and socket directories in
a fresh temporary directory, and is stopped (and its files removed) at the end. Tests skip,
saying why, only where the PostgreSQL binaries or the ``postgres`` user are missing.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid

import pytest


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def cannot_start_server() -> str | None:
    if _bindir() is None:
        return "the PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "there is no 'postgres' user to run the server as"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        return "starting a server as the postgres user needs root (or running as postgres)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(*cmd: str) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        cmd = ("runuser", "-u", "postgres", "--", *cmd)
    return subprocess.run(cmd, capture_output=True, text=True)


class Server:
    """A running server: ``dsn`` (database ``postgres``, user ``postgres``, no password)."""

    def __init__(self, root: str, port: int):
        self.root, self.port = root, port
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def connect(self, autocommit: bool = True):
        import psycopg

        return psycopg.connect(self.dsn, autocommit=autocommit)

    def execute(self, sql: str, params=None) -> list:
        with self.connect() as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def new_table(self, columns: str, name: str | None = None) -> str:
        """Create a table ``(columns)`` with a fresh name; return the name."""
        name = name or f"t_{uuid.uuid4().hex[:10]}"
        self.execute(f"CREATE TABLE {name} ({columns})")
        return name

    def prepared(self) -> list[str]:
        return [r[0] for r in self.execute("SELECT gid FROM pg_prepared_xacts ORDER BY gid")]

    def stop(self) -> None:
        _as_postgres(os.path.join(_bindir(), "pg_ctl"), "-D", os.path.join(self.root, "data"), "-m", "immediate",
                     "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def start_server(max_prepared_transactions: int = 64, settings: dict | None = None) -> Server:
    """initdb + pg_ctl start on a free port (retried if another process takes the port)."""
    bindir = _bindir()
    root = tempfile.mkdtemp(prefix="epochal-pg-")
    os.chmod(root, 0o755)
    data, sock = os.path.join(root, "data"), os.path.join(root, "sock")
    os.makedirs(sock)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    init = _as_postgres(os.path.join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
    if init.returncode:
        raise RuntimeError(f"initdb failed: {init.stderr[-2000:]}")
    opts = {"listen_addresses": "127.0.0.1", "max_prepared_transactions": max_prepared_transactions,
            "unix_socket_directories": sock, "max_connections": 200, **(settings or {})}
    for _ in range(5):
        port = _free_port()
        options = " ".join(f"-c {k}={v}" for k, v in {"port": port, **opts}.items())
        start = _as_postgres(os.path.join(bindir, "pg_ctl"), "-D", data, "-o", options, "-l",
                             os.path.join(root, "server.log"), "-w", "-t", "60", "start")
        if start.returncode == 0:
            return Server(root, port)
        time.sleep(0.1)
    log = open(os.path.join(root, "server.log")).read()[-2000:] if os.path.exists(os.path.join(root, "server.log")) else ""
    raise RuntimeError(f"the PostgreSQL server did not start: {start.stderr[-1000:]} {log}")


@pytest.fixture(scope="session")
def postgres():
    why = cannot_start_server()
    if why:
        pytest.skip(why)
    server = start_server()
    yield server
    server.stop()
