"""Secrets out of error messages: one helper for every connector (issue 51 §5).

A connector's failure cause travels far — logs, the dashboard, ``JobFailedError`` — so
any text that may quote a connection string or a client configuration goes through
:func:`redact` with the secrets of what the connector was given: :func:`dsn_secrets` for a
libpq-style DSN or URL (its password, and every fragment a parser could quote from a
malformed one), :func:`config_secrets` for a client configuration (the values of keys that
name a password, secret, token, key or credential). Each secret found in the text becomes
``***``. Pure functions, idempotent.

    >>> redact('missing "=" after "s3cret" in connection info string',
    ...        dsn_secrets("host=db password=pa55 s3cret"))
    'missing "=" after "***" in connection info string'
    >>> redact_dsn("postgresql://app:pa55word@db:5432/prod")
    'postgresql://app:***@db:5432/prod'
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import parse_qsl, urlsplit

__all__ = ["MASK", "config_secrets", "dsn_secrets", "redact", "redact_dsn"]

MASK = "***"
#: configuration keys whose values are secrets (matched anywhere in the key, any case)
SECRET_KEY = re.compile(r"pass|secret|token|credential|private|api[._-]?key|access[._-]?key|auth|sasl\.|\bkey\b",
                        re.IGNORECASE)
#: DSN keys whose values are shown in messages (where the server is, who connects)
_SAFE_KEYS = frozenset({"host", "hostaddr", "port", "dbname", "user", "sslmode", "connect_timeout",
                        "application_name", "target_session_attrs", "options", "client_encoding"})
_PAIR = re.compile(r"""(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)""")
#: shorter secrets are not searched for (they would mask unrelated characters)
MIN_SECRET = 3


def dsn_secrets(dsn) -> list[str]:
    """The fragments of ``dsn`` (a libpq ``key=value`` string or a URL) that must not be
    shown: the password and other secret values, and every word not part of a
    ``safe_key=value`` pair (a malformed DSN's parser may quote any of them)."""
    if not isinstance(dsn, str):
        return []
    found: list[str] = []
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
            if parts.password:
                found.append(parts.password)
            found += [v for k, v in parse_qsl(parts.query) if k not in _SAFE_KEYS]
        except ValueError:  # malformed: every fragment after the scheme may be quoted
            found += re.split(r"[/:@?&=\s]+", dsn.split("://", 1)[1])
        return _usable(found)
    rest = dsn
    for key, value in _PAIR.findall(dsn):
        if key.lower() not in _SAFE_KEYS:
            found += [value, value.strip("'")]
        rest = rest.replace(f"{key}={value}", " ", 1)
    found += rest.split()  # words outside any pair: a malformed DSN's fragments
    return _usable(found)


def config_secrets(config: Mapping | None) -> list[str]:
    """The values of ``config`` whose keys name a secret (``sasl.password``, ``ssl.key.password``,
    ``aws_secret_access_key``, ``token``, ...), as strings."""
    if not isinstance(config, Mapping):
        return []
    return _usable(str(v) for k, v in config.items() if v is not None and SECRET_KEY.search(str(k)))


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by :data:`MASK` (longest first)."""
    text = str(text)
    for secret in sorted(set(secrets), key=len, reverse=True):
        if len(secret) >= MIN_SECRET:
            text = text.replace(secret, MASK)
    return text


def redact_dsn(dsn: str) -> str:
    """``dsn`` fit to show: its secrets masked (:func:`dsn_secrets`)."""
    return redact(dsn, dsn_secrets(dsn))


def _usable(values: Iterable[str]) -> list[str]:
    return [v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET]
