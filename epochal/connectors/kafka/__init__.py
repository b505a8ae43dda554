"""Kafka: a replayable source over topic-partitions and an exactly-once transactional sink.

Re-exported as :class:`epochal.sources.KafkaSource` and :class:`epochal.sinks.KafkaSink`.
The client, confluent-kafka (librdkafka), is the ``kafka`` extra
(``pip install 'epochal[kafka]'``); it is imported only when a reader or writer starts.
"""
from epochal.connectors.kafka.records import KafkaRecord
from epochal.connectors.kafka.sink import KafkaSink, KafkaSinkWriter, KafkaTransaction
from epochal.connectors.kafka.source import KafkaSource, KafkaSourceError

__all__ = ["KafkaRecord", "KafkaSink", "KafkaSinkWriter", "KafkaSource", "KafkaSourceError", "KafkaTransaction"]
