"""The Kafka sink's commit thread (epochal/connectors/kafka/committer.py) on its own, no broker:
a commit call that never returns — what librdkafka's send_offsets_to_transaction does after a
broker restart (confluentinc/librdkafka#5456, #5511) — is noticed within its limit, by the task
thread's checks and by a drain, and the wedged thread is abandoned, not waited for. An idle
thread exits, so a writer nobody released does not keep its Kafka clients alive (they kept
reconnecting to the session broker after it stopped: ~440 "Connect ... refused" lines in 5 s
per writer)."""
from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest

from epochal.connectors.kafka import committer
from epochal.connectors.kafka.committer import CALL_GRACE_S, Committer, CommitWedged

LIMIT_S = 0.3


def _wedged_committer():
    """A committer whose first commit enters a watched call and blocks until released."""
    entered, release = threading.Event(), threading.Event()
    c = Committer("test-commit", call_limit=LIMIT_S)
    ran = []

    def stuck():
        with c.calling("send_offsets_to_transaction (the marker of epoch 1)"):
            entered.set()
            release.wait(30)
        ran.append(1)

    c.submit("epoch-1", stuck)
    c.submit("epoch-2", lambda: ran.append(2))
    assert entered.wait(10), "the commit thread did not start the commit"
    return c, release, ran


def test_a_call_that_overruns_its_limit_fails_the_task_thread_check():
    c, release, ran = _wedged_committer()
    try:
        c.raise_if_failed()  # within its limit: not wedged yet
        deadline = time.monotonic() + 10
        while True:
            try:
                c.raise_if_failed()
            except CommitWedged as exc:
                assert "send_offsets_to_transaction" in str(exc) and exc.running > LIMIT_S
                break
            assert time.monotonic() < deadline, "the wedged call was never noticed"
            time.sleep(0.02)
        assert c.wedged and c.in_flight() == ("epoch-1", "epoch-2")  # a checkpoint still carries both
    finally:
        release.set()
    time.sleep(0.1)
    with pytest.raises(CommitWedged):  # the call that returned late keeps the failure; epoch 2 never runs
        c.raise_if_failed()
    assert ran == [1]


def test_a_drain_returns_once_the_call_is_wedged_and_stop_abandons_the_thread():
    c, release, _ = _wedged_committer()
    try:
        began = time.monotonic()
        assert c.drain(30)  # returns: failed
        waited = time.monotonic() - began
        assert LIMIT_S < waited < LIMIT_S + CALL_GRACE_S + 5, waited
        with pytest.raises(CommitWedged):
            c.raise_if_failed()
        began = time.monotonic()
        c.stop(30)
        assert time.monotonic() - began < 1, "stop waited for a wedged thread"
    finally:
        release.set()


def test_calls_within_their_limit_and_unwatched_work_are_not_wedged():
    c = Committer("test-commit", call_limit=LIMIT_S)
    done = []

    def slow_but_fine():
        time.sleep(LIMIT_S + CALL_GRACE_S + 0.2)  # outside any watched call: producing a replay, say
        with c.calling("commit_transaction (epoch 1)"):
            time.sleep(0.05)
        done.append(1)

    c.submit("epoch-1", slow_but_fine)
    assert c.drain(30)
    c.raise_if_failed()
    assert done == [1] and not c.wedged


def test_an_idle_thread_exits_and_lets_its_writer_go(monkeypatch):
    monkeypatch.setattr(committer, "IDLE_EXIT_S", 0.2)

    class Writer:  # what the committer's join holds: the writer, and through it its clients
        def __init__(self):
            self.committer = Committer("test-commit", join=self.join)
            self.done = []

        def join(self, handles):
            self.done.extend(handles)

    w = Writer()
    done = w.done
    w.committer.submit("epoch-1", lambda: done.append("epoch-1"))
    assert w.committer.drain(10)
    first = w.committer._thread
    assert first is not None
    first.join(10)
    assert not first.is_alive(), "the idle commit thread did not exit"
    w.committer.submit("epoch-2", lambda: done.append("epoch-2"))  # a later commit starts another
    assert w.committer.drain(10) and done == ["epoch-1", "epoch-2"]
    second = w.committer._thread
    if second is not None:
        second.join(10)
    ref = weakref.ref(w)
    del w
    gc.collect()
    assert ref() is None, "something still holds the writer"
