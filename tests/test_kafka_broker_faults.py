"""Broker faults, not task faults (issue 47): Apache Kafka itself SIGKILLed and restarted on
its log directory and ports while transactions are open on the output. A keyed count
Kafka → Kafka on the local runtime runs through it; its read_committed output equals the
plain-Python count and no transaction is left open. The test has a broker of its own
(tests/kafka_broker.py)."""
from __future__ import annotations

import threading
import time

import cloudpickle
import pytest
import test_kafka
from kafka_broker import cannot_start_broker, start_broker
from test_kafka import Input, checkpoint, committed_counts, running_counts, wordcount

import epochal as ep

cloudpickle.register_pickle_by_value(test_kafka)  # its Count runs in the task processes

#: librdkafka's request timeout for the sink's producers here: the broker is down for longer
REQUEST_TIMEOUT_MS = 3000


@pytest.fixture
def own_broker():
    why = cannot_start_broker()
    if why:
        pytest.skip(why)
    broker = start_broker()
    yield broker
    broker.stop()


def _wait(what: str, done, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.01)


@pytest.mark.parametrize("fault", ["kill-and-restart"])
def test_the_broker_fails_mid_transaction_and_the_job_recovers_exactly_once(own_broker, tmp_path, fault):
    broker = own_broker
    data = Input(broker, per_partition=1500)
    out = broker.create_topic(None, 2)
    clients = {"request.timeout.ms": REQUEST_TIMEOUT_MS, "socket.timeout.ms": REQUEST_TIMEOUT_MS}
    handle = wordcount(broker, data, out, config=clients).start(
        runtime="local", checkpoint=checkpoint(tmp_path), restart=ep.RestartStrategy(max_attempts=8, delay=0.5))
    try:
        _wait("checkpoint", lambda: handle.completed_epochs)
        rest = threading.Thread(target=data.rest, daemon=True)  # the producer rides out the fault itself
        rest.start()
        open_before = {}

        def a_transaction_is_open():
            open_before.update(broker.open_transactions(out))
            return bool(open_before)

        _wait("open transaction on the output", a_transaction_is_open)
        broker.kill()
        down = time.monotonic()
        broker.restart()
        print(f"broker down {time.monotonic() - down:.1f} s (restart {broker.started_in:.1f} s)")
        rest.join(300)
        assert not rest.is_alive(), "the second half of the input was not produced"
        result = handle.wait(300)
    except BaseException:
        handle.cancel()
        raise
    print(f"{fault}: {result.attempts} attempt(s); open on the output before the fault: {open_before}; "
          f"failures: {[f.splitlines()[0][:160] for f in result.failures]}")
    assert open_before, "no transaction was open when the broker failed"
    assert committed_counts(broker, out) == running_counts(data.lines)
    assert broker.open_transactions(out) == {}
