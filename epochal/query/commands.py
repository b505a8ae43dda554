"""``epochal query``: look up queryable state of a running job from the command line.

    epochal query 127.0.0.1:40123 accounts balance a b --token $TOKEN
    EPOCHAL_QUERY_TOKEN=... epochal query HOST:PORT accounts balance 3 --isolation read-uncommitted

Keys are parsed as JSON when they parse (``3`` is an int, ``'"3"'`` a string), else taken
as strings. Prints one JSON object: ``{"epoch": ..., "isolation": ..., "values": [[key, value], ...]}``
(values that are not JSON print as their ``repr``).
"""
from __future__ import annotations

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
    p.add_argument("--token", default=None, help=f"the job's query token (default: ${TOKEN_ENV})")
    p.add_argument("--isolation", choices=ISOLATION_LEVELS, default=READ_COMMITTED)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for an answer")


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

    token = args.token or os.environ.get(TOKEN_ENV)
    if not token:
        print(f"epochal query: error: no token (pass --token or set {TOKEN_ENV})", file=sys.stderr)
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
