"""``epochal query``: look up queryable state of a running job from the command line.

    EPOCHAL_QUERY_TOKEN=... epochal query HOST:PORT accounts balance 3 --isolation read-uncommitted
    epochal query 127.0.0.1:40123 accounts balance a b --token-file ~/.job-token

The token comes from ``$EPOCHAL_QUERY_TOKEN`` or a file, never from the command line: argv
is in every user's process list (``--token`` is refused, naming the two ways).

Keys are parsed as JSON when they parse (``3`` is an int, ``'"3"'`` a string), else taken
as strings. Prints one JSON object: ``{"epoch": ..., "isolation": ..., "values": [[key, value], ...]}``
(values that are not JSON print as their ``repr``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from epochal.errors import EpochalError
from epochal.query.protocol import ISOLATION_LEVELS, READ_COMMITTED

TOKEN_ENV = "EPOCHAL_QUERY_TOKEN"


def add_parser(sub) -> None:
    p = sub.add_parser("query", help="look up queryable state of a running job (JobHandle.query_address)")
    p.add_argument("address", help="HOST:PORT of the job's query directory (JobHandle.query_address)")
    p.add_argument("operator", help="the keyed operator's name")
    p.add_argument("state", help="the state's name, declared queryable")
    p.add_argument("keys", nargs="+", help="keys to look up (JSON when they parse, else strings)")
    add_token_arguments(p, TOKEN_ENV, "the job's query token")
    p.add_argument("--isolation", choices=ISOLATION_LEVELS, default=READ_COMMITTED)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for an answer")


def add_token_arguments(parser, env: str, what: str) -> None:
    """``--token-file`` for ``parser``, and a refused ``--token`` (see :func:`token_from`)."""
    parser.add_argument("--token-file", default=None, help=f"a file holding {what} (default: ${env})")
    parser.add_argument("--token", default=None, help=argparse.SUPPRESS)


def token_from(args, env: str, command: str) -> str | None:
    """The token of ``args.token_file`` or ``$env`` (``None``: neither given).

    Raises:
        ValueError: ``--token`` was given (argv is visible to every user of the host), or
            the file cannot be read or is empty — naming the command and the setting.
    """
    if args.token is not None:
        raise ValueError(f"{command}: --token would put the secret in every user's process list; "
                         f"pass it in ${env} or in a file (--token-file)")
    if args.token_file is not None:
        try:
            with open(os.path.expanduser(args.token_file), encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ValueError(f"{command}: --token-file {args.token_file}: {exc.strerror or exc}") from None
        if not token:
            raise ValueError(f"{command}: --token-file {args.token_file} is empty")
        return token
    return os.environ.get(env) or None


def _key(text: str):
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return tuple(value) if isinstance(value, list) else value


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def run(args) -> int:
    from epochal.query.client import QueryClient

    try:
        token = token_from(args, TOKEN_ENV, "epochal query")
    except ValueError as exc:
        print(f"epochal query: error: {exc}", file=sys.stderr)
        return 2
    if not token:
        print(f"epochal query: error: no token (set ${TOKEN_ENV} or pass --token-file)", file=sys.stderr)
        return 2
    keys = [_key(k) for k in args.keys]
    try:
        with QueryClient(args.address, token, timeout=args.timeout) as client:
            result = client.query(args.operator, args.state, keys, isolation=args.isolation)
    except (EpochalError, OSError, ValueError) as exc:
        print(f"epochal query: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"epoch": result.epoch, "isolation": result.isolation,
                      "values": [[_jsonable(k), _jsonable(result.values[k])] for k in keys]}))
    return 0
