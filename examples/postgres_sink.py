"""Exactly-once into PostgreSQL: a running word count written through prepared transactions.

Each epoch's rows go into the table in one transaction per sink subtask, ``PREPARE``d at the
checkpoint barrier and ``COMMIT PREPARED`` once the checkpoint completed (the DBMS row of
the two-phase-commit table in Carbone's thesis). An injected fault kills a sink task after
a checkpoint completed and before its commit; the restarted job commits that prepared
transaction and rolls back everything else it finds prepared. At the end the table is
read back with psycopg and checked against a plain-Python count, and
``pg_prepared_xacts`` must be empty.

With no ``--dsn`` it starts a throw-away server (``initdb`` + ``pg_ctl`` as the ``postgres``
user, which needs root, as tests/postgres_server.py does).

    python examples/postgres_sink.py [--dsn postgresql://user@host/db] [--lines 8000] [--no-crash]
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import time
import uuid

import epochal as ep
from epochal.sinks import PostgresSink
from epochal.testing import CrashDuringCommit

WORDS = "table row column prepare commit rollback epoch barrier snapshot vacuum index".split()


class WordCount(ep.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, word, value):
        self.count.update(self.count.value() + 1)
        yield {"word": word, "n": self.count.value()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn")
    parser.add_argument("--lines", type=int, default=8000)
    parser.add_argument("--no-crash", action="store_true")
    parser.add_argument("--runtime", default=os.environ.get("EPOCHAL_RUNTIME", "spark"))
    args = parser.parse_args()

    server = None
    if args.dsn is None:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from postgres_server import cannot_start_server, start_server

        if cannot_start_server():
            raise SystemExit(f"cannot start a server ({cannot_start_server()}); pass --dsn")
        server = start_server()
        args.dsn = server.dsn
    import psycopg

    try:
        table = f"word_counts_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {table} (word text NOT NULL, n bigint NOT NULL)")
        rng = random.Random(3)
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(args.lines)]

        # --8<-- [start:graph]
        flow = ep.Dataflow("postgres-wordcount", parallelism=2)
        (flow.source("lines", ep.sources.CollectionSource(lines, num_splits=4))
             .flat_map("split", str.split)
             .key_by(lambda word: word)
             .process("count", WordCount())
             .sink("counts", PostgresSink(args.dsn, table)))
        # --8<-- [end:graph]
        faults = [] if args.no_crash else [CrashDuringCommit("counts", subtask=0, epoch=1, how="exit", after_epoch=1)]
        t0 = time.monotonic()
        result = flow.run(checkpoint=ep.CheckpointConfig(interval="100ms",
                                                         storage="file://" + tempfile.mkdtemp(prefix="epochal-pg-")),
                          runtime=args.runtime, faults=faults)
        elapsed = time.monotonic() - t0

        with psycopg.connect(args.dsn, autocommit=True) as conn:
            got = collections.Counter(conn.execute(f"SELECT word, n FROM {table}").fetchall())
            prepared = conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
        words = collections.Counter(w for line in lines for w in line.split())
        expected = collections.Counter((w, k) for w, c in words.items() for k in range(1, c + 1))
        print(f"\nepochal PostgreSQL word count ({result.runtime}, exactly-once) in {elapsed:.1f} s, "
              f"{result.attempts} attempt(s)")
        for failure in result.failures:
            print(f"  recovered from: {failure.splitlines()[0]}")
        print(f"  {sum(got.values())} rows in {table}; prepared transactions left: {len(prepared)}")
        exact = got == expected and not prepared
        print(f"  table equals a plain-Python count, each row once: {'yes' if exact else 'NO'}")
        if not exact:
            raise SystemExit("exactly-once violated")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
