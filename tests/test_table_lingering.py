"""``epochal sinks lingering`` for the table sinks (issue 36), against real Delta (delta-rs)
and Iceberg (pyiceberg, SQL catalog on sqlite) tables: a job killed between a checkpoint's
completion and its commit leaves staged data files — its pending epoch's (promised: a
resume commits them) and a zombie's sealed epoch that no checkpoint holds. The command
lists both, ``--abort`` deletes only the unpromised one, and a resume is exact against the
plain-Python count. The Iceberg variant is ``slow`` (pyiceberg imports in every task)."""
from __future__ import annotations

import os

import pyarrow as pa
import pytest

import epochal as ep
from epochal.alignment.factory import SinkMode
from epochal.epochs.lineage import Lineage
from epochal.sinks import SinkContext, TwoPhaseCommitState
from epochal.testing import CrashDuringCommit

pytest.register_assert_rewrite("tables")
from tables import counts, oracle, read_delta, read_iceberg  # noqa: E402

pytest_plugins = ["tables"]

SCRIPT = '''
import pyarrow as pa

from epochal.sinks import DeltaSink, IcebergSink
from tables import EpochLines, keyed_count

SCHEMA = pa.schema([("word", pa.string()), ("n", pa.int64())])
SOURCE = EpochLines(per_split=60, per_epoch=20)
SINK = DeltaSink(URI, schema=SCHEMA) if KIND == "delta" else IcebergSink(CATALOG, "db.counts", schema=SCHEMA)
flow = keyed_count("linger", SOURCE, SINK)
'''


def staged_files(kind: str, uri: str, catalog: dict) -> tuple[str, set[str]]:
    """``(table root, relative paths of every epoch-staged parquet file there)``."""
    if kind == "delta":
        root = uri
    else:
        from pyiceberg.catalog import load_catalog

        root = load_catalog("default", **catalog).load_table("db.counts").location()[len("file://"):]
    found = set()
    for directory, _, names in os.walk(root):
        found |= {os.path.relpath(os.path.join(directory, n), root) for n in names
                  if n.startswith("part-") and "-e0" in n and n.endswith(".parquet")}
    return root, found


def referenced(kind: str, uri: str, catalog: dict) -> set[str]:
    """Relative paths the table's current version references."""
    if kind == "delta":
        from epochal.connectors.delta import client

        from deltalake import DeltaTable
        return client.referenced(DeltaTable(uri))
    from pyiceberg.catalog import load_catalog

    table = load_catalog("default", **catalog).load_table("db.counts")
    root = table.location() + "/"
    return {t.file.file_path[len(root):] for t in table.scan().plan_files()}


@pytest.mark.parametrize("kind", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_lingering_staged_files_are_listed_and_only_unpromised_ones_deleted(tmp_path, iceberg_catalog, kind):
    from epochal.cli import main
    from epochal.sinks import lingering
    from epochal.state.commands import load_dataflow

    uri = str(tmp_path / "table")
    script = tmp_path / "linger_job.py"
    script.write_text(f"KIND = {kind!r}\nURI = {uri!r}\nCATALOG = {iceberg_catalog!r}\n" + SCRIPT)
    flow = load_dataflow(f"{script}:flow")
    scope_source = flow.plan().nodes["lines"].payload
    config = ep.CheckpointConfig(interval=0.1, storage="file://" + str(tmp_path / "ckpt"))
    # 1. killed between checkpoint m's completion and sink subtask 0's commit of it, no restart left
    #    (m >= 2: every epoch from 2 on carries records, epoch 1 may be empty)
    with pytest.raises(ep.JobFailedError, match="disconnected without finishing"):
        flow.run(runtime="local", checkpoint=config, restart=ep.RestartStrategy(max_attempts=0),
                 faults=[CrashDuringCommit("out", subtask=0, epoch=2, how="exit", after_epoch=1)])
    point = ep.state.open_checkpoint(config.storage + "/linger")
    lineage = point.meta["lineage"]
    # 2. a zombie of that run (subtask 1, a later generation) seals an epoch no checkpoint holds
    sink = flow.plan().nodes["out"].payload
    zombie = sink.create_writer(SinkContext("out", subtask=1, parallelism=2, job="linger", generation=7,
                                            mode=SinkMode.TRANSACTIONAL, lineage=Lineage(lineage)))
    zombie.restore(TwoPhaseCommitState(epoch=point.epoch + 49))  # it got far; nothing pending (subtask 1: no cleanup)
    zombie.write_many([{"word": "stray", "n": 1}])
    zombie.snapshot(point.epoch + 50)
    zombie.durability_job(point.epoch + 50)()
    zombie.release()
    root, before = staged_files(kind, uri, iceberg_catalog)
    stray = {p for p in before if f"-e{point.epoch + 50:010d}-" in p}
    assert len(stray) == 1
    unreferenced = before - referenced(kind, uri, iceberg_catalog)
    # 3. listed: every unreferenced staged file; promised: the checkpoint's pending epoch (subtask 0's at least)
    found = lingering.find(flow, config.storage)
    assert {i.what for i in found} == unreferenced, found
    promised = {i.what for i in found if i.promised}
    pending = {p for p in unreferenced if f"-e{point.epoch:010d}-g000000-" in p}  # the checkpoint's, not committed
    assert promised == pending and any("-s0000-" in p for p in promised), f"the pending epoch is not promised: {found}"
    assert stray <= {i.what for i in found if not i.promised}
    # 4. --abort deletes all but the promised ones
    assert main(["sinks", "lingering", config.storage, "linger", "--dataflow", f"{script}:flow", "--abort"]) == 0
    _, after = staged_files(kind, uri, iceberg_catalog)
    assert after - referenced(kind, uri, iceberg_catalog) == promised
    assert {i.what for i in lingering.find(flow, config.storage)} == promised
    # 5. the resume commits the promised epoch: exact, and nothing lingers
    resumed = flow.run(runtime="local", resume=True, checkpoint=config)
    assert resumed.restored_from[0] == point.epoch
    rows = read_delta(uri) if kind == "delta" else read_iceberg(iceberg_catalog, "db.counts")
    assert counts(rows) == oracle(scope_source.lines())
    assert lingering.find(flow, config.storage) == []


def test_lingering_on_a_table_sink_without_a_table_or_checkpoint_finds_nothing(tmp_path):
    from epochal.sinks import DeltaSink
    from epochal.sinks.lingering import Promised

    sink = DeltaSink(str(tmp_path / "none"), schema=pa.schema([("word", pa.string())]))
    assert sink.lingering("job", "out", Promised()) == []
    sink.end_lingering("job", "out", [], Promised())
