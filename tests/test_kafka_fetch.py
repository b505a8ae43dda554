"""KafkaSource's fetch keeps a short epoch fed (issue 34): a poll takes what the consumer
already holds without waiting, and when it holds nothing it waits for the *first* message
only — never for a whole batch, which librdkafka's ``consume(n, timeout)`` does until n
messages came or the timeout passed (up to ``POLL_WAIT_S`` of every poll at low rates,
holding the records and the next barrier back)."""
from __future__ import annotations

import time

from epochal.connectors.kafka import source as kafka_source
from epochal.sources import KafkaSource

pytest_plugins = ["kafka_broker"]


class RecordingConsumer:
    """Passes every call to the real consumer; records ``consume``'s arguments."""

    def __init__(self, consumer):
        self._consumer = consumer
        self.calls: list[tuple[int, float]] = []

    def consume(self, num_messages=1, timeout=-1):
        self.calls.append((num_messages, timeout))
        return self._consumer.consume(num_messages=num_messages, timeout=timeout)

    def __getattr__(self, name):
        return getattr(self._consumer, name)


def test_a_poll_never_waits_for_more_than_one_message(kafka_broker):
    topic = kafka_broker.create_topic(None, 1)
    kafka_broker.produce(topic, [f"r{i}" for i in range(30)], partition=0)
    src = KafkaSource(kafka_broker.servers, topic)
    reader = src.create_reader(src.splits(), None, subtask=0, parallelism=1)
    spy = reader._consumer = RecordingConsumer(reader._consumer)
    got: list[bytes] = []
    deadline = time.monotonic() + 60

    def poll_until(done):
        while not done() and time.monotonic() < deadline:
            got.extend(r.value for r in reader.poll(1000).records)

    try:
        poll_until(lambda: len(got) >= 30)
        poll_until(lambda: any(t != 0 for _, t in spy.calls))  # the topic holds no more: a poll must wait
        kafka_broker.produce(topic, [f"r{i}" for i in range(30, 60)], partition=0)
        poll_until(lambda: len(got) >= 60)
        assert [v.decode() for v in got] == [f"r{i}" for i in range(60)]
        waiting = [(n, t) for n, t in spy.calls if t != 0]
        assert waiting, "no poll waited for the brokers"
        assert all(n == 1 and t <= kafka_source.POLL_WAIT_S for n, t in waiting), (
            f"a consume call waited for a batch of messages: {sorted(set(waiting))}")
    finally:
        reader.close()
