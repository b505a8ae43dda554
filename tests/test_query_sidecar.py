"""RocksDB read-committed lookups served by a sidecar process per task (RocksDB's default;
``BackendSpec("rocksdb", {"query_sidecar": False})`` opts out, :mod:`epochal.query.sidecar`;
the handover from in-process answers: ``test_query_handover``).

* a :class:`~epochal.backends.views.CheckpointView` — what the sidecar reads — answers as the
  task's own pinned view of the same instant, and not after its release;
* the bank of ``test_queryable_state`` with a task process SIGKILLed once answers flow
  (local runtime; on Spark: slow): every read-committed answer equals the plain-Python
  oracle of its epoch, answers come after the restart too, and sidecar processes were
  running while the job answered (none outlives the job on Spark).
"""
from __future__ import annotations

import os
import signal
import time
import uuid

import cloudpickle
import pytest

import epochal as ep
from epochal.backends.choice import BackendSpec
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.backends.views import CheckpointView, ViewReleased

import test_queryable_state
from test_queryable_state import Reader, bank, check_reads

cloudpickle.register_pickle_by_value(test_queryable_state)  # its Accounts run in the tasks

SIDECAR = BackendSpec("rocksdb")  # the sidecar is on by default


def sidecars() -> int:
    """Sidecar processes running on this machine now (their command line names the module)."""
    n = 0
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                n += b"from epochal.query.sidecar import serve" in f.read()
        except OSError:
            pass
    return n


def test_a_checkpoint_view_reads_as_the_tasks_pinned_view(tmp_path):
    backend = RocksDBStateBackend(range(0, 4), path=str(tmp_path))
    try:
        backend.put("op/v", 1, "a", 10)
        backend.put("op/v", 2, ("t", 1), 20)
        backend.map_put("op/m", 1, "a", "x", 1)
        backend.map_put("op/m", 1, "a", "y", 2)
        pinned = backend.pin_view(["op/v", "op/m"], whole_maps=True)
        backend.put("op/v", 1, "a", 11)  # after the pin: in neither view
        backend.map_put("op/m", 1, "a", "z", 3)
        released = []
        view = CheckpointView(pinned.checkpoint, lambda: released.append(True))
        for kg, key in [(1, "a"), (2, ("t", 1)), (1, "absent"), (3, "a")]:
            assert view.get("op/v", kg, key, "d") == pinned.get("op/v", kg, key, "d")
        assert view.get("op/v", 1, "a") == 10 and view.get("never", 1, "a", "d") == "d"
        assert view.map_items("op/m", 1, "a") == pinned.map_items("op/m", 1, "a") == {"x": 1, "y": 2}
        assert view.map_items("op/m", 1, "b") == {} and view.map_items("never", 1, "a") == {}
        view.release()
        view.release()  # idempotent
        assert released == [True]
        with pytest.raises(ViewReleased):
            view.get("op/v", 1, "a")
        pinned.release()
    finally:
        backend.close()


def sigkill_while_answering(handle, pids, storage: str, job: str, wait: float) -> None:
    """Once answers of three epochs flowed, SIGKILL a task process of ``accounts`` (named in
    ``pids``) from outside; then: sidecars served while the job answered, the kill landed
    mid-run, every read-committed answer equals the oracle of its epoch, and answers came
    after the restart too."""
    reader = Reader(handle)
    reader.start()
    deadline = time.monotonic() + 120
    while len({e for e, _ in reader.committed}) < 3 and reader.is_alive() and time.monotonic() < deadline:
        reader.stop.wait(0.05)
    running = sidecars()  # answers flow: the sidecars of both accounts subtasks serve them
    victims = sorted(pids.iterdir())
    assert victims and handle.running, "no task process to kill before the job ended"
    os.kill(int(victims[0].name.split(".")[0]), signal.SIGKILL)
    killed_after = max(e for e, _ in reader.committed)
    result = handle.wait(wait)
    reader.stop.set()
    reader.join(60)
    assert running >= 2, f"{running} sidecar processes while the job answered queries (want >= 2)"
    assert result.attempts >= 2, f"the SIGKILL did not land mid-run: {result.failures}"
    epochs = check_reads(reader, storage, job)
    assert max(epochs) > max(killed_after, result.restored_from[-1]), (
        f"no read after the restart (killed after epoch {killed_after}, read {sorted(epochs)})")


def test_sidecars_answer_read_committed_through_a_sigkill(tmp_path):
    """Local runtime: once answers flow (three epochs read), a task process of ``accounts``
    — and so its sidecar's socket pair — is SIGKILLed from outside; every read-committed
    answer equals the oracle of its epoch, and the new attempt's sidecars answer too."""
    job = f"bank-{uuid.uuid4().hex[:8]}"
    storage = f"file://{tmp_path}/ckpt"
    pids = tmp_path / "pids"
    pids.mkdir()
    flow = bank(job, str(tmp_path / "out"), per_split=20000, rate=2500.0, pid_dir=str(pids))
    handle = flow.start(runtime="local", backend=SIDECAR,
                        checkpoint=ep.CheckpointConfig(interval=0.05, storage=storage, retained=100_000))
    sigkill_while_answering(handle, pids, storage, job, 120)


@pytest.mark.slow
def test_sidecars_on_spark_through_an_external_sigkill(tmp_path, spark):
    """Embedded Spark: a task process of ``accounts`` (and so its sidecar's socket pair)
    SIGKILLed from outside mid-run; every read-committed answer equals the oracle of its
    epoch, and answers come after the restart too (the new attempt's sidecars)."""
    job = f"bank-{uuid.uuid4().hex[:8]}"
    storage = f"file://{tmp_path}/ckpt"
    pids = tmp_path / "pids"
    pids.mkdir()
    flow = bank(job, str(tmp_path / "out"), per_split=12000, rate=2000.0, pid_dir=str(pids))
    handle = flow.start(runtime="spark", spark=spark, backend=SIDECAR,
                        checkpoint=ep.CheckpointConfig(interval=0.05, storage=storage, retained=100_000))
    sigkill_while_answering(handle, pids, storage, job, 240)
    deadline = time.monotonic() + 20
    while sidecars() and time.monotonic() < deadline:  # the tasks' teardown stops them
        time.sleep(0.1)
    assert sidecars() == 0, f"{sidecars()} sidecar processes outlived their job"
