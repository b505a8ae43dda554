"""Lookup enrichment (epochal/lookup, epochal/connectors/postgres/lookup.py): the bounded
cache's eviction and refresh against a fake clock, and a job enriching records from a real
PostgreSQL table, its output against the table's rows (plain Python), then a row changed in
the table seen only once the refresh policy lets the cache re-read it."""
from __future__ import annotations

import collections

import pytest

import epochal as ep
from epochal.connectors.postgres.lookup import PostgresTable
from epochal.errors import ConfigError, PipelineDefinitionError
from epochal.lookup import Lookup, LookupCache
from epochal.lookup.cache import MISSING
from epochal.sinks import FileSink, read_committed

from pipelines import unique_dir

pytest_plugins = ["postgres_server"]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_cache_is_bounded_least_recently_used_first_out_and_refreshes_after_its_time():
    clock = Clock()
    cache = LookupCache(2, refresh_after=10, missing_after=1, clock=clock)
    cache.put("a", {"v": 1})
    cache.put("b", None)  # known missing
    assert cache.get("a") == {"v": 1} and cache.get("b") is None
    cache.put("c", {"v": 3})  # "a" was used least recently
    assert cache.get("a") is MISSING and len(cache) == 2 and cache.evictions == 1
    clock.now = 2  # a missing key is asked again after missing_after, a row after refresh_after
    assert cache.get("b") is MISSING and cache.get("c") == {"v": 3}
    clock.now = 12
    assert cache.get("c") is MISSING
    with pytest.raises(ValueError, match="max_entries"):
        LookupCache(0, 1)


def test_lookup_refuses_bad_arguments_naming_them():
    from epochal.lookup import LookupTable

    with pytest.raises(PipelineDefinitionError, match="LookupTable"):
        Lookup(object(), key=len)
    with pytest.raises(PipelineDefinitionError, match="how must be"):
        Lookup(LookupTable(), key=len, how="full")
    with pytest.raises(PipelineDefinitionError, match="refresh_after"):
        Lookup(LookupTable(), key=len, refresh_after="soon")


@pytest.mark.slow  # a PostgreSQL server and a job: ~25 s on the shared machine
def test_job_enriches_from_postgres_and_a_changed_row_is_seen_after_the_refresh(tmp_path, postgres):
    table = postgres.new_table("id bigint PRIMARY KEY, name text NOT NULL, city text")
    customers = {i: (f"name-{i}", None if i % 5 == 0 else f"city-{i % 3}") for i in range(40)}
    with postgres.connect(autocommit=True) as conn:
        for i, (name, city) in customers.items():
            conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (i, name, city))
    orders = [(n, n * 7 % 50) for n in range(300)]  # customers 40..49 do not exist

    flow = ep.Dataflow("lookup", parallelism=2)
    enriched = (flow.source("orders", ep.sources.CollectionSource(orders))
                .flat_map("enrich", Lookup(PostgresTable(postgres.dsn, table, "id", ["name", "city"]),
                                           key=lambda o: o[1], how="inner", max_entries=8,
                                           combine=lambda o, row: (o[0], row["name"], row["city"]))))
    out = unique_dir(tmp_path, "out")
    enriched.sink("out", FileSink(out))
    flow.run(runtime="local")
    expected = collections.Counter((n, *customers[c]) for n, c in orders if c in customers)
    assert collections.Counter(tuple(r) for r in read_committed(out)) == expected

    clock = Clock()  # the refresh policy, on the same table
    lookup = Lookup(PostgresTable(postgres.dsn, table, "id"), key=lambda k: k, refresh_after="30s")
    lookup.cache = LookupCache(10, 30, clock=clock)
    assert lookup(3) == [(3, {"id": 3, "name": "name-3", "city": "city-0"})]
    with postgres.connect(autocommit=True) as conn:
        conn.execute(f"UPDATE {table} SET name = 'renamed' WHERE id = 3")
    clock.now = 29
    assert lookup(3)[0][1]["name"] == "name-3"  # cached: outside the exactly-once cut, by design
    clock.now = 31
    assert lookup(3)[0][1]["name"] == "renamed"
    assert lookup(45) == [(45, None)]  # how="left": a missing key gives None
    with pytest.raises(ConfigError, match="no column"):
        PostgresTable(postgres.dsn, table, "nope").fetch([1])
