"""No password or token in a connector's failure cause or in any log line (issue 51 §5):
the one redaction helper (:mod:`epochal.connectors.redaction`) against hand-written
expectations, and a real run of a PostgreSQL sink whose DSN is malformed — the real
psycopg parser quotes a fragment of it — with every log line captured and grepped."""
from __future__ import annotations

import logging

import pytest

import epochal as ep
from epochal.connectors.redaction import MASK, config_secrets, dsn_secrets, redact, redact_dsn
from epochal.errors import ConfigError


@pytest.mark.parametrize("dsn, shown, hidden", [
    ("host=db port=5432 user=app password=pa55word dbname=prod", ["db", "5432", "app", "prod"], ["pa55word"]),
    ("host=db password='with space' user=app", ["db", "app"], ["with space"]),
    ("host=db password=hunter2 secret user=app", ["db", "app"], ["hunter2", "secret"]),  # malformed
    ("postgresql://app:pa55word@db:5432/prod?sslmode=require&password=other", ["app", "db:5432/prod"],
     ["pa55word", "other"]),
])
def test_dsn_secrets_are_masked_and_the_rest_stays(dsn, shown, hidden):
    out = redact_dsn(dsn)
    assert all(s in out for s in shown) and not any(h in out for h in hidden) and MASK in out


def test_client_config_secrets_are_the_values_of_secret_keys():
    config = {"bootstrap.servers": "k:9092", "sasl.password": "kafka-pw", "ssl.key.password": "key-pw",
              "sasl.username": "alice", "aws_secret_access_key": "AKIAxyz", "client.id": "c1", "token": "tok-123"}
    found = set(config_secrets(config))
    assert {"kafka-pw", "key-pw", "AKIAxyz", "tok-123"} <= found and not {"k:9092", "c1"} & found
    assert redact("auth failed for kafka-pw at k:9092", found) == f"auth failed for {MASK} at k:9092"


def test_a_run_with_a_malformed_dsn_shows_no_password_anywhere(tmp_path, caplog):
    pytest.importorskip("psycopg")
    from epochal.sinks import PostgresSink

    secrets = ["hunter2", "c0rrect-horse"]
    dsn = f"host=127.0.0.1 port=1 user=app password={secrets[0]} {secrets[1]} dbname=x"  # a stray word: malformed
    flow = ep.Dataflow("redacted")
    flow.source("s", ep.sources.CollectionSource([1, 2])).sink("pg", PostgresSink(dsn, "t"))
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(ConfigError) as failure:
            flow.run(runtime="local", checkpoint=ep.CheckpointConfig(storage=f"file://{tmp_path}/c"))
    cause = str(failure.value)
    assert "sink 'pg'" in cause and "cannot connect to PostgreSQL" in cause  # the fault fired, named
    assert "connection info string" in cause  # the parser's own message, quoting a fragment
    for secret in secrets:
        assert secret not in cause, f"the failure cause shows {secret!r}: {cause}"
        assert secret not in caplog.text, f"a log line shows {secret!r}"
    assert dsn_secrets(dsn) and redact(dsn, dsn_secrets(dsn)).count(MASK) >= 2
