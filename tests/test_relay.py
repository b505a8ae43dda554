"""The relay's lanes as part of the cut (epochal.regions.relay), scripted against the hub's
request handler — no tasks, no timing: producer requests and consumer requests in a chosen
order, and what each side's snapshot holds, checked against plain Python."""
from __future__ import annotations

import pytest

from epochal.regions.relay import RelayHub

CH = "p-c"


@pytest.fixture
def hubs():
    made: list[RelayHub] = []

    def new() -> RelayHub:
        made.append(RelayHub())
        return made[-1]

    yield new
    for hub in made:
        hub.close()


class Producer:
    """What ``_RelayWriter`` does, against ``hub._answer``: the kept tail and the last number."""

    def __init__(self, hub: RelayHub, state=None, subtask: int = 0):
        self.hub, self.subtask = hub, subtask
        self.last, self.seqs, self.kept = 0, [], []
        if state:
            self.last, self.seqs, self.kept = state["last"], list(state["seqs"]), list(state["records"])
        _, acked = hub._answer(("open", CH, subtask, self.last, list(self.seqs), list(self.kept)))
        self._forget(acked)

    def _forget(self, acked: int) -> None:
        while self.seqs and self.seqs[0] <= acked:
            self.seqs.pop(0)
            self.kept.pop(0)

    def put(self, *records) -> None:
        _, first, acked = self.hub._answer(("put", CH, self.subtask, list(records)))
        self.seqs += list(range(first, first + len(records)))
        self.kept += list(records)
        self.last = self.seqs[-1]
        self._forget(acked)

    def snapshot(self) -> dict:
        return {"last": self.last, "seqs": list(self.seqs), "records": list(self.kept)}


def take(hub: RelayHub, after: int, n: int = 100) -> tuple[list, int]:
    """Every record above ``after`` the lane has now, and the number of the last one taken."""
    _, records, _, seqs = hub._answer(("take", CH, 0, n, after))
    return records, (seqs[-1] if seqs else after)


def test_a_savepoint_holds_what_the_lane_queued_and_what_the_reader_took_after_its_cut(hubs):
    hub = hubs()
    producer = Producer(hub)
    producer.put("a", "b", "c")
    got, read = take(hub, 0, 2)
    assert got == ["a", "b"]
    reader_cut = read  # the reader's savepoint: it holds a, b
    hub.hold_acks()  # the savepoint: readers first, then producers
    got, read = take(hub, read)
    hub._answer(("ack", CH, 0, read))  # the reader completed an epoch holding c meanwhile
    producer.put("d")
    sp = producer.snapshot()  # the producer's savepoint
    hub.hold_acks(False)
    assert sp["records"] == ["a", "b", "c", "d"]  # the held ack trimmed nothing
    # restore both into a new driver (a new hub): the reader takes what follows its cut
    hub2 = hubs()
    restored = Producer(hub2, sp)
    restored.put("e")  # the producer's replay after its cut
    got, _ = take(hub2, reader_cut)
    assert got == ["c", "d", "e"]


def test_acks_let_the_producer_forget_what_the_reader_checkpointed(hubs):
    hub = hubs()
    producer = Producer(hub)
    producer.put("a", "b", "c")
    _, read = take(hub, 0, 2)
    hub._answer(("ack", CH, 0, read))
    producer.put("d")
    assert producer.snapshot()["records"] == ["c", "d"]


def test_a_reader_ahead_of_its_producers_cut_is_handed_the_replay_again(hubs):
    """A driver dies: the reader's latest epoch read a, b, c, d; the producer's latest epoch
    was after b; its replay hands c2, d2 (not necessarily c, d). The reopened lane numbers
    the replay above everything numbered before, so the reader takes c2, d2 (at least once)
    rather than skipping them as numbers it already read (which would lose them)."""
    hub = hubs()
    producer = Producer(hub)
    producer.put("a", "b")
    cut = producer.snapshot()
    producer.put("c", "d")
    got, reader_cut = take(hub, 0)
    assert got == ["a", "b", "c", "d"]
    hub2 = hubs()
    restored = Producer(hub2, cut)
    restored.put("c2", "d2")
    got, _ = take(hub2, reader_cut)
    assert got == ["c2", "d2"]


def test_a_producer_restarting_under_the_same_driver_hands_its_replay_over_again(hubs):
    """The hub queued or handed out what the restored tail holds: it is not queued twice;
    the replay is handed over again (at least once, seed 000 §3.2)."""
    hub = hubs()
    producer = Producer(hub)
    producer.put("a", "b")
    cut = producer.snapshot()
    producer.put("c")
    got, read = take(hub, 0, 1)
    assert got == ["a"]
    restarted = Producer(hub, cut)
    restarted.put("c")
    got, _ = take(hub, read)
    assert got == ["b", "c", "c"]


def test_a_stopping_hub_lets_a_producer_put_into_a_full_lane():
    hub = RelayHub(capacity=2)
    try:
        producer = Producer(hub)
        producer.put("a", "b")
        hub.stopping()  # without it, the next put would wait for a reader that stopped
        producer.put("c")
        assert hub.stats()[CH]["queued"] == 3
    finally:
        hub.close()


def test_a_reader_without_periodic_epochs_acks_what_it_takes(hubs):
    """An ``epochal.Autonomous`` reading region never completes a periodic epoch: it acks
    at take, so its producer keeps (and snapshots) only what the lane still queues — but
    not while a savepoint is taken (acks held)."""
    hub = hubs()
    producer = Producer(hub)
    producer.put("a", "b", "c")
    _, _, _, seqs = hub._answer(("take", CH, 0, 2, 0, 1))
    producer.put("d")
    assert producer.snapshot()["records"] == ["c", "d"]
    hub.hold_acks()
    hub._answer(("take", CH, 0, 1, seqs[-1], 1))
    producer.put("e")
    assert producer.snapshot()["records"] == ["c", "d", "e"]
    hub.hold_acks(False)
    producer.put("f")
    assert producer.snapshot()["records"] == ["d", "e", "f"]
