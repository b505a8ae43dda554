"""Queryable state of a running job (seed 004 §4.3.1, issue 33).

The system tests query a bank: ``N`` accounts of ``INITIAL`` each, a keyed operator
applying transfers. A transfer record is split into a debit and a credit by a ``flat_map``
chained to the source: both halves come out of one ``process_batch`` call, before the task
can look at its mailbox again, so no barrier can fall between them — every epoch's cut
holds both halves of a transfer or neither. The two halves go to two keys, usually two
subtasks. So:

* a read-committed answer (every account, read at one epoch on every subtask) must sum to
  ``N * INITIAL`` — and more: equal the plain-Python oracle after exactly the transfers the
  epoch's checkpoint says its sources had read (``list_source_offsets`` of ``chk-<epoch>``);
  a read of two subtasks at different epochs, or of live state, fails that unless by luck
  the missing transfers cancel out, which the oracle comparison rules out;
* read-uncommitted answers (live state, no common cut) are shown to break the sum at least
  once, so the test can tell the two levels apart.
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid

import pytest

import epochal as ep
from epochal.backends.choice import BackendSpec
from epochal.backends.heap import HeapStateBackend
from epochal.backends.rocksdb import RocksDBStateBackend
from epochal.query import JobEnded, QueryClient, QueryError
from epochal.query.protocol import common_epoch
from epochal.query.versions import CommittedVersions, VersionGone

N = 16
INITIAL = 1000
TOTAL = N * INITIAL
SPLITS = 2


def transfer(split: int, i: int) -> tuple[int, int, int]:
    """Transfer ``i`` of ``split``: (from, to, amount), a pure function of its position."""
    r = random.Random(split * 1_000_003 + i)
    a = r.randrange(N)
    return a, (a + 1 + r.randrange(N - 1)) % N, r.randrange(1, 100)


def transfers_from(split: int, offset: int):
    i = offset
    while True:
        yield transfer(split, i)
        i += 1


def legs(t):
    """Debit and credit of one transfer: returned together, so no barrier falls between them."""
    return [(t[0], -t[2]), (t[1], t[2])]


class Accounts(ep.KeyedProcessFunction):
    """Applies legs to balances; with ``pid_dir`` it leaves its pid there (for an external kill)."""

    def __init__(self, pid_dir: str | None = None):
        self.pid_dir = pid_dir

    def open(self, ctx):
        self.balance = ctx.value_state("balance", default=INITIAL, queryable=True)
        self.history = ctx.map_state("history", queryable=True)
        if self.pid_dir:
            with open(os.path.join(self.pid_dir, f"{os.getpid()}.pid"), "w") as f:
                f.write(str(ctx.subtask))

    def process(self, key, leg):
        self.balance.update(self.balance.value() + leg[1])
        self.history.put("last", leg[1])


def oracle(offsets: dict, memo: dict | None = None) -> dict:
    """Balances after the first ``offsets[split]`` transfers of every split (plain Python);
    ``memo`` caches the transfers across calls."""
    memo = {} if memo is None else memo
    balances = dict.fromkeys(range(N), INITIAL)
    for split, n in offsets.items():
        done = memo.setdefault(int(split), [])
        done.extend(transfer(int(split), i) for i in range(len(done), n))
        for a, b, amount in done[:n]:
            balances[a] -= amount
            balances[b] += amount
    return balances


def bank(name: str, out: str, per_split: int, rate: float, pid_dir: str | None = None,
         accounts_parallelism: int = 2) -> ep.Dataflow:
    flow = ep.Dataflow(name, parallelism=2)
    source = ep.sources.GeneratorSource(transfers_from, num_splits=SPLITS, limit=per_split, records_per_second=rate)
    (flow.source("transfers", source)
         .flat_map("legs", legs)
         .key_by(lambda leg: leg[0])
         .process("accounts", Accounts(pid_dir), parallelism=accounts_parallelism)
         .sink("out", ep.sinks.FileSink(out)))
    return flow


class Reader(threading.Thread):
    """Multi-key lookups of every account while the job runs, alternating isolation levels."""

    def __init__(self, handle):
        super().__init__(daemon=True)
        self.handle = handle
        self.committed: list[tuple[int, dict]] = []
        self.uncommitted: list[dict] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self):
        accounts = list(range(N))
        try:
            while not self.stop.is_set():
                r = self.handle.query("accounts", "balance", accounts, timeout=60)
                assert r.isolation == "read-committed" and r.epoch is not None
                self.committed.append((r.epoch, r.values))
                u = self.handle.query("accounts", "balance", accounts, isolation="read-uncommitted", timeout=60)
                assert u.epoch is None
                self.uncommitted.append(u.values)
        except JobEnded:  # only the job's end may stop the reader
            pass
        except BaseException as exc:
            self.error = exc


def check_reads(reader: Reader, storage: str, job: str) -> set[int]:
    """Every read-committed answer equals the oracle of its epoch; read-uncommitted broke the sum."""
    assert reader.error is None, f"the reader failed: {reader.error!r}"
    epochs = {e for e, _ in reader.committed}
    assert len(epochs) >= 3, f"too few epochs read: {sorted(epochs)}"
    print(f"{len(reader.committed)} read-committed answers over {len(epochs)} epochs; "
          f"{sum(sum(v.values()) != TOTAL for v in reader.uncommitted)} of {len(reader.uncommitted)} "
          "read-uncommitted answers broke the sum")
    offsets = {}
    for epoch in sorted(epochs):
        merged = {}
        for entry in ep.state.list_source_offsets(f"{storage}/{job}/chk-{epoch}"):
            merged.update(entry["offsets"])
        assert set(merged) == {str(s) for s in range(SPLITS)}, merged
        offsets[epoch] = merged
    memo = {}
    expected = {epoch: oracle(o, memo) for epoch, o in offsets.items()}
    for epoch, values in reader.committed:
        assert sum(values.values()) == TOTAL, f"epoch {epoch}: read-committed sum {sum(values.values())} != {TOTAL}"
        assert values == expected[epoch], f"epoch {epoch}: read-committed answer differs from the oracle"
    assert any(sum(v.values()) != TOTAL for v in reader.uncommitted), (
        f"none of {len(reader.uncommitted)} read-uncommitted answers broke the sum: the test cannot tell the "
        "isolation levels apart")
    return epochs


# ---------------------------------------------------------------------- pure parts
def test_committed_versions_promote_on_completion_and_keep_the_newest():
    released = []

    class View:
        def __init__(self, name):
            self.name = name

        def release(self):
            released.append(self.name)

    v = CommittedVersions(keep=2)
    with pytest.raises(VersionGone, match="no completed epoch"):
        v.acquire(None)
    v.restored(3, View("r3"))
    v.pinned(4, View("p4"))
    v.pinned(5, View("p5"))
    assert v.acquire(None)[:2] == (3, v.acquire(3)[1]) and v.held == [3]  # pending views answer nothing
    v.aborted(4)
    assert released == ["p4"]
    v.completed(5)
    assert v.acquire(None)[0] == 5 and v.held == [3, 5]
    v.pinned(6, View("p6"))
    v.pinned(7, View("p7"))
    v.completed(7)  # 6 never completed: its abort is on its way; 7 covers it
    assert v.held == [5, 7] and released == ["p4", "p6", "r3"]
    with pytest.raises(VersionGone, match="epoch 3 is not held"):
        v.acquire(3)
    v.close()
    assert sorted(released) == ["p4", "p5", "p6", "p7", "r3"]
    v.pinned(8, View("late"))  # after close: released at once
    assert released[-1] == "late"


def test_common_epoch_is_the_newest_shared_one():
    assert common_epoch([[3, 4, 5], [4, 5, 6], [2, 3, 4, 5]]) == 5
    assert common_epoch([[3, 4], [5, 6]]) is None


@pytest.mark.parametrize("make", [HeapStateBackend, RocksDBStateBackend], ids=["heap", "rocksdb"])
def test_a_pinned_view_never_sees_later_writes(make):
    backend = make(range(0, 8))
    try:
        backend.put("op/balance", 1, "a", [1])
        backend.put("op/balance", 2, "b", 10)
        view = backend.pin_view(["op/balance"])
        acc = backend.get("op/balance", 1, "a")
        acc.append(2)  # in place, then put back (the backend contract)
        backend.put("op/balance", 1, "a", acc)
        backend.put("op/balance", 2, "b", 11)
        backend.put("op/balance", 3, "c", 5)
        backend.delete("op/balance", 2, "b")
        got = {}
        reader = threading.Thread(target=lambda: got.update(
            a=view.get("op/balance", 1, "a"), b=view.get("op/balance", 2, "b"), c=view.get("op/balance", 3, "c", "-")))
        reader.start()
        reader.join()
        assert got == {"a": [1], "b": 10, "c": "-"}
        assert backend.get("op/balance", 1, "a") == [1, 2] and not backend.contains("op/balance", 2, "b")
        view.release()
        view.release()  # idempotent
    finally:
        backend.close()


# ---------------------------------------------------------------------- system tests
@pytest.mark.parametrize("backend", ["heap", "rocksdb", pytest.param(BackendSpec("rocksdb", {"query_sidecar": False}),
                                                              id="rocksdb-in-process")])
def test_read_committed_answers_equal_the_oracle_of_their_epoch(tmp_path, backend):
    """Local runtime, a crash of an ``accounts`` subtask mid-run: every read-committed
    answer (before, during and after the restart) equals the oracle of its epoch."""
    job = f"bank-{uuid.uuid4().hex[:8]}"
    storage = f"file://{tmp_path}/ckpt"
    flow = bank(job, str(tmp_path / "out"), per_split=5000, rate=2500.0)
    handle = flow.start(runtime="local", backend=backend,
                        checkpoint=ep.CheckpointConfig(interval=0.05, storage=storage, retained=100_000),
                        faults=[ep.testing.CrashAtRecord("accounts", subtask=1, record=3000, after_epoch=3)])
    reader = Reader(handle)
    reader.start()
    result = handle.wait(120)
    reader.stop.set()
    reader.join(60)
    assert result.attempts == 2, f"the crash did not fire mid-run: {result.failures}"
    restored = result.restored_from[1]
    epochs = check_reads(reader, storage, job)
    assert min(epochs) < restored < max(epochs), (
        f"reads did not span the restart (restored epoch {restored}, read {sorted(epochs)})")


def test_query_errors_tokens_and_the_command_line(tmp_path, capsys):
    """Point lookups, map state, the CLI, and what the query API refuses."""
    from epochal.cli import main

    job = f"bank-{uuid.uuid4().hex[:8]}"
    flow = bank(job, str(tmp_path / "out"), per_split=100_000, rate=500.0)
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, storage=f"file://{tmp_path}/c"))
    try:
        point = handle.query("accounts", "balance", 3, timeout=60)
        assert point.keys == [3] and isinstance(point.value, int) and point.epoch >= 1
        history = handle.query("accounts", "history", [0, 1])
        assert set(history.values) == {0, 1} and all(isinstance(m, dict) for m in history.values.values())
        host, port = handle.query_address
        assert host == "127.0.0.1"  # loopback on a local run
        with QueryClient(f"{host}:{port}", handle.query_token) as client:
            many = client.query("accounts", "balance", list(range(N)))
            assert sum(many.values.values()) == TOTAL
            with pytest.raises(QueryError, match="no queryable state 'nope'.*queryable: \\['balance', 'history'\\]"):
                client.query("accounts", "nope", 1)
            with pytest.raises(QueryError, match="isolation"):
                client.query("accounts", "balance", 1, isolation="serializable")
            with pytest.raises(QueryError, match="not answered within"):
                client.query("no-such-operator", "balance", 1, timeout=0.3)
        with pytest.raises(QueryError, match="refused the token"):
            QueryClient((host, port), "wrong-token").query("accounts", "balance", 1)
        token_file = tmp_path / "token"
        token_file.write_text(handle.query_token + "\n")
        assert main(["query", f"{host}:{port}", "accounts", "balance", "1", "2", "--token-file", str(token_file)]) == 0
        out = capsys.readouterr().out
        import json

        answer = json.loads(out)
        assert answer["isolation"] == "read-committed" and [k for k, _ in answer["values"]] == [1, 2]
        token_file.write_text("bad")
        assert main(["query", f"{host}:{port}", "accounts", "balance", "1", "--token-file", str(token_file)]) == 1
        # a token on the command line is refused: argv is in every user's process list
        assert main(["query", f"{host}:{port}", "accounts", "balance", "1", "--token", handle.query_token]) == 2
        assert "process list" in capsys.readouterr().err
    finally:
        handle.cancel()
        with pytest.raises(ep.JobFailedError):
            handle.wait(60)
    with pytest.raises(JobEnded):
        QueryClient((host, port), handle.query_token).query("accounts", "balance", 1, timeout=5)


@pytest.mark.parametrize("backend", ["rocksdb"])
def test_read_committed_on_spark_through_an_external_sigkill(tmp_path, spark, backend):
    """Embedded Spark: a task process of ``accounts`` SIGKILLed from outside mid-run; every
    read-committed answer, before and after, equals the oracle of its epoch."""
    job = f"bank-{uuid.uuid4().hex[:8]}"
    storage = f"file://{tmp_path}/ckpt"
    pids = tmp_path / "pids"
    pids.mkdir()
    flow = bank(job, str(tmp_path / "out"), per_split=8000, rate=2000.0, pid_dir=str(pids))
    handle = flow.start(runtime="spark", spark=spark, backend=backend,
                        checkpoint=ep.CheckpointConfig(interval=0.05, storage=storage, retained=100_000))
    reader = Reader(handle)
    reader.start()
    deadline = time.monotonic() + 120
    while len({e for e, _ in reader.committed}) < 3 and reader.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    victims = sorted(pids.iterdir())
    assert victims and handle.running, "no task process to kill before the job ended"
    os.kill(int(victims[0].name.split(".")[0]), signal.SIGKILL)
    killed_after = max(e for e, _ in reader.committed)
    result = handle.wait(240)
    reader.stop.set()
    reader.join(60)
    assert result.attempts >= 2, f"the SIGKILL did not land mid-run: {result.failures}"
    epochs = check_reads(reader, storage, job)
    assert max(epochs) > max(killed_after, result.restored_from[-1]), (
        f"no read after the restart (killed after epoch {killed_after}, read {sorted(epochs)})")


def test_an_encrypted_job_serves_queries_in_pinned_tls(tmp_path):
    """With encryption (a cluster's default) the query connections are TLS pinned to the
    job's query certificate: the handle's client passes it, a client without it is refused."""
    job = f"bank-{uuid.uuid4().hex[:8]}"
    flow = bank(job, str(tmp_path / "out"), per_split=100_000, rate=500.0)
    handle = flow.start(runtime="local", channels=ep.ChannelConfig(encryption=True),
                        checkpoint=ep.CheckpointConfig(interval=0.05, storage=f"file://{tmp_path}/c"))
    try:
        assert handle.query_tls is not None
        assert sum(handle.query("accounts", "balance", list(range(N)), timeout=60).values.values()) == TOTAL
        with pytest.raises(QueryError, match="refused"):
            QueryClient(handle.query_address, handle.query_token).query("accounts", "balance", 1, timeout=1)
    finally:
        handle.cancel()
        with pytest.raises(ep.JobFailedError):
            handle.wait(60)


def test_an_always_unaligned_job_refuses_read_committed(tmp_path):
    """Unaligned cuts keep an epoch's in-flight records as channel state, outside the keyed
    state: a job whose every checkpoint is unaligned says so instead of serving them."""
    job = f"bank-{uuid.uuid4().hex[:8]}"
    flow = bank(job, str(tmp_path / "out"), per_split=100_000, rate=500.0)
    handle = flow.start(runtime="local", checkpoint=ep.CheckpointConfig(interval=0.05, unaligned=True,
                                                                        storage=f"file://{tmp_path}/c"))
    try:
        live = handle.query("accounts", "balance", list(range(N)), isolation="read-uncommitted", timeout=60)
        assert set(live.values) == set(range(N))
        with pytest.raises(QueryError, match="read-committed needs aligned checkpoints"):
            handle.query("accounts", "balance", 1)
    finally:
        handle.cancel()
        with pytest.raises(ep.JobFailedError):
            handle.wait(60)


def test_routes_follow_a_rescale_and_answer_from_the_restored_epoch(tmp_path):
    """Stopped with a savepoint at parallelism 2, resumed at 3 with no periodic epochs: the
    only committed epoch is the restored one, so every answer is read there — routed to the
    three new owners of the key groups, and equal to the oracle of the savepoint's offsets."""
    job = f"bank-{uuid.uuid4().hex[:8]}"
    first = bank(job, str(tmp_path / "out1"), per_split=100_000, rate=1000.0)
    handle = first.start(runtime="local",
                         checkpoint=ep.CheckpointConfig(interval=0.05, storage=f"file://{tmp_path}/c1"))
    handle.query("accounts", "balance", 0, timeout=60)  # running, an epoch completed
    savepoint = handle.stop_with_savepoint(str(tmp_path / "sp"), timeout=60)
    offsets = {}
    for entry in ep.state.list_source_offsets(savepoint):
        offsets.update(entry["offsets"])
    epoch = ep.state.open_checkpoint(savepoint).epoch
    second = bank(job, str(tmp_path / "out2"), per_split=100_000, rate=200.0, accounts_parallelism=3)
    handle = second.start(runtime="local", restore_from=savepoint,
                          checkpoint=ep.CheckpointConfig(interval=None, storage=f"file://{tmp_path}/c2"))
    try:
        client = handle._driver.query_client()
        answer = handle.query("accounts", "balance", list(range(N)), timeout=60)
        assert answer.epoch == epoch and answer.values == oracle(offsets)
        owners = {task for task, *_ in client._routes["operators"]["accounts"]}
        assert len(owners) == 3, owners
    finally:
        handle.cancel()
        with pytest.raises(ep.JobFailedError):
            handle.wait(60)
