"""The coordinator's sends (epochal.runtime.driver.fanout): a broadcast is encoded once, every
task's connection receives the coordinator's messages in the coordinator's order, a failed
write is reported as that task's connection lost, and close() lets the queued messages out.
The connections are stand-ins recording the frames they were given (the oracle: the list of
messages sent, decoded back)."""
from __future__ import annotations

import pickle
import threading

from epochal.runtime.driver.fanout import Fanout


class Recorder:
    codec = None

    def __init__(self, fail: bool = False):
        self.frames: list[bytes] = []
        self.fail = fail

    def send_bytes(self, frame) -> None:
        if self.fail:
            raise OSError("injected: connection reset")
        self.frames.append(bytes(frame))


def test_every_task_gets_every_message_in_order_each_encoded_once():
    encodes = []

    def encode(conn, message):
        encodes.append(message)
        return pickle.dumps(message)
    lost = []
    fan = Fanout(lambda task, conn, exc: lost.append(task), encode)
    conns = {f"t[{i}]": Recorder() for i in range(50)}
    sent = []
    for n in range(20):
        message = ("trigger", n, 1.5) if n % 2 else ("complete", n)
        fan.broadcast(list(conns.items()), message)
        sent.append(message)
        fan.send("t[7]", conns["t[7]"], ("release_end", n))  # a single send between broadcasts keeps its place
    assert fan.close(30)
    assert len(encodes) == 40  # once per broadcast and per single send, never per task
    for task, conn in conns.items():
        got = [pickle.loads(f) for f in conn.frames]
        want = [m for n, m in enumerate(sent) for m in ([m, ("release_end", n)] if task == "t[7]" else [m])]
        assert got == want, task
    assert lost == []
    assert len(fan.fanouts) == 20 and all(targets == 50 for targets, _ in fan.fanouts)


def test_a_failed_write_is_reported_as_the_task_lost_and_the_others_still_receive():
    lost = []
    done = threading.Event()
    fan = Fanout(lambda task, conn, exc: (lost.append((task, conn, str(exc))), done.set()),
                 lambda conn, message: pickle.dumps(message))
    good, bad = Recorder(), Recorder(fail=True)
    fan.broadcast([("a", good), ("b", bad)], ("finish",))
    assert done.wait(30), "the injected write failure was never reported"
    assert fan.close(30)
    assert lost == [("b", bad, "injected: connection reset")]
    assert [pickle.loads(f) for f in good.frames] == [("finish",)]
