"""Secure by default (issue 23): what a job exposes, and to whom, unless the user says
otherwise — the metrics endpoint, Spark's RPC on a cluster, checkpoints whose storage
others can write, savepoint requests from the storage, helper binaries in /tmp."""
from __future__ import annotations

import socket
import urllib.request

import pytest

import epochal as ep
from epochal.errors import ConfigError


def _external_address() -> str | None:
    """An address of this host other than loopback (None if it has none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: only picks the outgoing interface
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


class _Reporter:
    latest = {"job": "j", "state": "running", "records_in_per_s": 0.0, "records_out_per_s": 0.0,
              "last_completed_epoch": 3, "watermark": None, "restarts": [], "tasks": {}, "operators": {},
              "checkpoints": {"duration_s": {"p50": None, "p99": None}}}


def test_the_metrics_endpoint_binds_loopback_unless_told_otherwise():
    pytest.importorskip("prometheus_client")
    from epochal.metrics.prometheus import PrometheusExporter

    assert ep.MetricsConfig().prometheus_host == "127.0.0.1"
    exporter = PrometheusExporter(_Reporter(), 0)
    try:
        host, port = exporter.address
        assert host == "127.0.0.1"
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'epochal_last_completed_epoch{job="j"} 3.0' in text
        other = _external_address()
        if other is not None:  # not reachable on the host's network address
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()
    finally:
        exporter.close()
    exposed = PrometheusExporter(_Reporter(), 0, ep.MetricsConfig(prometheus_host="0.0.0.0").prometheus_host)
    try:
        assert exposed.address[0] == "0.0.0.0"
    finally:
        exposed.close()
    with pytest.raises(ConfigError, match="metrics.prometheus_host"):
        ep.MetricsConfig(prometheus_host="")
