"""Lookup enrichment from a real Delta table (epochal/connectors/delta/lookup.py): a job's
output against the table's rows joined in plain Python, then a new table version seen once
the refresh policy lets the cache re-read the key, and the errors naming the table."""
from __future__ import annotations

import collections

import pyarrow as pa
import pytest

import epochal as ep
from epochal.connectors.delta.lookup import DeltaLookupTable
from epochal.errors import ConfigError, DataError
from epochal.lookup import Lookup, LookupCache
from epochal.sinks import FileSink, read_committed

from pipelines import unique_dir

deltalake = pytest.importorskip("deltalake")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _customers(customers: dict) -> pa.Table:
    ids = sorted(customers)
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [customers[i][0] for i in ids],
                     "city": [customers[i][1] for i in ids]})


def test_job_enriches_from_a_delta_table_and_a_new_version_is_seen_after_the_refresh(tmp_path):
    uri = str(tmp_path / "customers")
    customers = {i: (f"name-{i}", None if i % 5 == 0 else f"city-{i % 3}") for i in range(40)}
    deltalake.write_deltalake(uri, _customers(customers))
    orders = [(n, n * 7 % 50) for n in range(300)]  # customers 40..49 do not exist

    flow = ep.Dataflow("delta-lookup", parallelism=2)
    enriched = (flow.source("orders", ep.sources.CollectionSource(orders))
                .flat_map("enrich", Lookup(DeltaLookupTable(uri, "id", ["name", "city"]),
                                           key=lambda o: o[1], how="inner", max_entries=8,
                                           combine=lambda o, row: (o[0], row["name"], row["city"]))))
    out = unique_dir(tmp_path, "out")
    enriched.sink("out", FileSink(out))
    flow.run(runtime="local")
    expected = collections.Counter((n, *customers[c]) for n, c in orders if c in customers)
    assert collections.Counter(tuple(r) for r in read_committed(out)) == expected

    clock = Clock()  # the refresh policy, on the same table
    lookup = Lookup(DeltaLookupTable(uri, "id"), key=lambda k: k, refresh_after="30s")
    lookup.cache = LookupCache(10, 30, clock=clock)
    assert lookup(3) == [(3, {"id": 3, "name": "name-3", "city": "city-0"})]
    deltalake.write_deltalake(uri, _customers({**customers, 3: ("renamed", "city-0")}), mode="overwrite")
    clock.now = 29
    assert lookup(3)[0][1]["name"] == "name-3"  # cached: outside the exactly-once cut, by design
    clock.now = 31
    assert lookup(3)[0][1]["name"] == "renamed"  # the table's new version
    assert lookup(45) == [(45, None)]  # how="left": a missing key gives None


def test_errors_name_the_table_and_the_problem(tmp_path):
    uri = str(tmp_path / "dup")
    deltalake.write_deltalake(uri, pa.table({"id": [1, 1, 2], "v": ["a", "b", "c"]}))
    with pytest.raises(DataError, match=r"DeltaLookupTable\(.*dup'\): key 1 has more than one row"):
        DeltaLookupTable(uri, "id").fetch([1, 2])
    assert DeltaLookupTable(uri, "id", ["v"]).fetch([2]) == {2: {"v": "c"}}
    with pytest.raises(ConfigError, match="no column 'nope' in the table"):
        DeltaLookupTable(uri, "nope").fetch([1])
    with pytest.raises(ConfigError, match="no Delta table"):
        DeltaLookupTable(str(tmp_path / "none"), "id").fetch([1])
    with pytest.raises(ConfigError, match="key_column must be a column name"):
        DeltaLookupTable(uri, "")
