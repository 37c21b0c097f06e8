"""Kafka failing in ways a broker of its own cannot be made to, for tests."""

from __future__ import annotations

import threading
import time

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from gpcdc_toolkit.ingest import end_offsets, located, read_to_end


def lose_tail(kafka, topic, partition, keep):
    """Kafka losing a partition's tail that it had acknowledged (a broker back without
    what it had not written to disk): the topic made again with every message it held,
    at the same offsets, but those of ``partition`` from offset ``keep`` on."""
    held = [m for m in read_to_end(kafka, topic) if located(m)[0] != partition or located(m)[1] < keep]
    admin = AdminClient(kafka)
    partitions = len(admin.list_topics(topic, timeout=10).topics[topic].partitions)
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:  # deletion finishes in the background: the name is free once a creation is taken
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
            break
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS or time.monotonic() > deadline:
                raise
            threading.Event().wait(0.2)
    producer = Producer({**kafka, "enable.idempotence": True})
    for message in held:
        producer.produce(topic, message.value(), key=message.key(), partition=located(message)[0],
                         timestamp=message.timestamp()[1])
    assert producer.flush(30) == 0
    assert end_offsets(kafka, topic, [partition]) == {partition: keep}
