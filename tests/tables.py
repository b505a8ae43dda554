"""Test helpers for the table connectors (Delta Lake, Iceberg): throw-away tables, readers
independent of epochal, a gated input and the keyed running count the oracle tests share.

Load it from a test module with ``pytest_plugins = ["tables"]`` (fixtures ``iceberg_catalog``).

* :func:`read_delta` reads a Delta table the way the issue asks for — ``pyarrow.dataset``
  over the committed files ``DeltaTable.file_uris()`` lists (``to_pyarrow_table()`` aborted
  the interpreter at exit here, delta-rs issue 2184) — never through epochal.
* :func:`read_iceberg` reads an Iceberg table with pyiceberg's own scan.
* :class:`EpochLines` feeds a few lines per split into every epoch: a fault that waits for
  a completed checkpoint always finds records left and a non-empty transaction, however
  loaded the machine, so no timing decides whether (and how) it fires.
"""
from __future__ import annotations

import collections
import time

import cloudpickle
import pytest

import epochal as ep
from epochal.sources.base import Poll, Source, SourceReader

from pipelines import line


def read_delta(uri: str, storage_options: dict | None = None, filesystem=None) -> list[dict]:
    """Every row of the Delta table's current version, read with pyarrow over its files.

    ``filesystem``: a pyarrow or fsspec file system for the files (default: delta-rs's own,
    from ``storage_options``). Pass one for a store served from this very process (the moto
    server): delta-rs's file handler keeps the GIL while it waits for the network, which
    would block the server's thread.
    """
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs
    from deltalake import DeltaTable
    from deltalake.fs import DeltaStorageHandler

    dt = DeltaTable(uri, storage_options=storage_options)
    root = uri.rstrip("/")
    files = [u[len(root) + 1:] if u.startswith(root) else u for u in dt.file_uris()]
    if not files:
        return []
    if filesystem is None:
        filesystem = pafs.PyFileSystem(DeltaStorageHandler(uri, storage_options))
    else:
        base = root.split("://", 1)[-1]
        files = [f"{base}/{f}" for f in files]
    partitions = list(dt.metadata().partition_columns)
    dataset = ds.dataset(files, filesystem=filesystem, format="parquet",
                         partitioning="hive" if partitions else None,
                         partition_base_dir=(root.split("://", 1)[-1] if "://" in root else "") if partitions else None)
    return dataset.to_table().to_pylist()


def delta_files(uri: str, storage_options: dict | None = None) -> list[str]:
    """The committed files of the table's current version (full URIs)."""
    from deltalake import DeltaTable

    return DeltaTable(uri, storage_options=storage_options).file_uris()


def read_iceberg(catalog: dict, identifier: str) -> list[dict]:
    """Every row of the Iceberg table's current snapshot, read with pyiceberg's scan."""
    from pyiceberg.catalog import load_catalog

    props = dict(catalog)
    table = load_catalog(props.pop("name", "default"), **props).load_table(identifier)
    return table.scan().to_arrow().to_pylist()


@pytest.fixture
def iceberg_catalog(tmp_path) -> dict:
    """Properties of a fresh SQL catalog on sqlite, with its warehouse on local disk."""
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/warehouse"}


# ------------------------------------------------------------------ the keyed running count


class EpochLines(Source):
    """``per_split`` lines per split (:func:`pipelines.line`), at most ``per_epoch`` of them
    per split between two barriers: every epoch until the input is exhausted carries
    records, however fast or slow the machine — so a fault at epoch 2 always meets a
    non-empty transaction, and with ``max_concurrent=1`` the records of epoch ``n + 1``
    flow only after epoch ``n - 1`` completed. State: ``{str(split): next line}``."""

    def __init__(self, splits: int = 4, per_split: int = 300, per_epoch: int = 40):
        self.n, self.per_split, self.per_epoch = splits, per_split, per_epoch

    def splits(self) -> list[int]:
        return list(range(self.n))

    def create_reader(self, splits, state, *, subtask=0, parallelism=1) -> SourceReader:
        return _EpochReader(self, list(splits), state or {})

    def lines(self) -> list[str]:
        return [line(s, i) for s in range(self.n) for i in range(self.per_split)]


class _EpochReader(SourceReader):
    def __init__(self, src: EpochLines, splits: list[int], state: dict):
        self.src, self.splits = src, splits
        self.offsets = {s: int(state.get(str(s), 0)) for s in splits}
        self.budget = dict.fromkeys(splits, src.per_epoch)
        self.turn = 0

    def poll(self, max_records: int) -> Poll:
        end = self.src.per_split
        for step in range(len(self.splits)):
            s = self.splits[(self.turn + step) % len(self.splits)]
            start = self.offsets[s]
            k = min(max_records, 20, end - start, self.budget[s])
            if k <= 0:
                continue
            self.offsets[s] = start + k
            self.budget[s] -= k
            self.turn = (self.turn + step + 1) % len(self.splits)
            return Poll([line(s, i) for i in range(start, start + k)], split=s)
        done = all(o >= end for o in self.offsets.values())
        if not done:
            time.sleep(0.002)
        return Poll([], finished=done, idle=not done)

    def snapshot(self) -> dict:
        self.budget = dict.fromkeys(self.splits, self.src.per_epoch)  # a barrier: the next epoch's share
        return {str(s): o for s, o in self.offsets.items()}


class Count(ep.KeyedProcessFunction):
    """Running count per word: emits ``{"word": w, "n": k}``."""

    def open(self, ctx):
        self.n = ctx.value_state("n", default=0)

    def process(self, word, value):
        n = self.n.value() + 1
        self.n.update(n)
        yield {"word": word, "n": n}


def keyed_count(name: str, source, sink, parallelism: int = 2) -> ep.Dataflow:
    """lines → words → running count per word → ``sink``."""
    flow = ep.Dataflow(name, parallelism=parallelism)
    (flow.source("lines", source)
         .flat_map("split", str.split)
         .key_by(lambda w: w)
         .process("count", Count())
         .sink("out", sink))
    return flow


def oracle(lines) -> collections.Counter:
    """Plain Python: the running counts of ``lines`` as a multiset of (word, n)."""
    words = collections.Counter(w for text in lines for w in text.split())
    return collections.Counter((w, k) for w, c in words.items() for k in range(1, c + 1))


def counts(rows) -> collections.Counter:
    return collections.Counter((r["word"], r["n"]) for r in rows)


def checkpoint(tmp_path, interval: float = 0.1) -> ep.CheckpointConfig:
    return ep.CheckpointConfig(interval=interval, storage="file://" + str(tmp_path / "ckpt"))


cloudpickle.register_pickle_by_value(__import__(__name__))
