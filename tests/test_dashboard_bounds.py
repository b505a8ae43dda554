"""The dashboard's server is bounded and keeps its token out of logs (issue 51 §5):

* 200 idle connections (connected, nothing sent) hold at most ``max_connections`` threads
  — the rest are closed at once — and after ``request_timeout`` the idle ones are dropped,
  so a real request is answered again;
* the address is logged without the token (the URL with it is ``server.url`` /
  ``JobHandle.ui_url``).
"""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.request

from epochal.ui.server import DashboardServer


def _poll(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(0.02)  # a poll pause, not a protocol step
    return True


def test_idle_connections_hold_a_bounded_number_of_threads_for_a_bounded_time():
    server = DashboardServer(lambda: {"ok": 1}, request_timeout=1.0, max_connections=8)
    before = threading.active_count()
    socks = []
    try:
        for _ in range(200):  # the fault: 200 idle, half-open requests
            socks.append(socket.create_connection(server.address, timeout=5))
        url = f"{server.base_url}api/state?token={server.token}"
        held = []

        def answered() -> bool:
            held.append(threading.active_count() - before)
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    return json.loads(r.read()) == {"ok": 1}
            except OSError:
                return False

        assert _poll(answered, 60), "the idle connections were never dropped: no request is answered"
        assert max(held) <= 8, f"200 idle connections held up to {max(held)} threads"
        assert server.refused > 0, "the connection cap never fired"
    finally:
        for s in socks:
            s.close()
        server.close()


def test_the_dashboard_url_with_its_token_is_not_logged(caplog):
    with caplog.at_level(logging.DEBUG, logger="epochal"):
        server = DashboardServer(lambda: {}, name="quiet")
    try:
        assert server.base_url in caplog.text and server.token not in caplog.text
        assert server.url == f"{server.base_url}?token={server.token}"
    finally:
        server.close()


def test_the_cli_takes_tokens_from_the_environment_or_a_file_never_argv(tmp_path, monkeypatch, capsys):
    """``epochal ui`` / ``epochal query``: ``--token`` is refused naming the two ways; a
    ``--token-file`` or ``$EPOCHAL_UI_TOKEN`` is what the served page then needs."""
    import argparse

    from epochal.cli import UI_TOKEN_ENV, main
    from epochal.query.commands import add_token_arguments, token_from

    assert main(["ui", str(tmp_path), "job", "--token", "sekrit-on-argv"]) == 2
    assert "process list" in capsys.readouterr().err
    assert main(["query", "127.0.0.1:1", "op", "state", "k", "--token", "sekrit-on-argv"]) == 2
    parser = argparse.ArgumentParser()
    add_token_arguments(parser, UI_TOKEN_ENV, "the token")
    path = tmp_path / "token"
    path.write_text("from-a-file\n")
    assert token_from(parser.parse_args(["--token-file", str(path)]), UI_TOKEN_ENV, "t") == "from-a-file"
    monkeypatch.setenv(UI_TOKEN_ENV, "from-the-env")
    assert token_from(parser.parse_args([]), UI_TOKEN_ENV, "t") == "from-the-env"
    path.write_text("")
    import pytest

    with pytest.raises(ValueError, match="is empty"):
        token_from(parser.parse_args(["--token-file", str(path)]), UI_TOKEN_ENV, "t")
