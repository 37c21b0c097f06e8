"""Reading the toolkit's topics with a plain Kafka consumer, to their current end.

Where a partition ends is found by reading, not from its high watermark: some
Kafka-compatible brokers (the embedded one among them) report a high watermark
short of the real end after multi-message batches, so the consumer's end-of-partition
event comes early, or never. A partition counts as read to its end when a message
produced after the read began arrives (it is left out), or when no message comes
from it for ``idle`` seconds, or for a quarter second after an end-of-partition event.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from ..errors import BrokerError

EOF_GRACE = 0.25  # seconds of silence after an end-of-partition event


def partitions_of(consumer: Consumer, topic: str, timeout: float = 10.0) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=timeout)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        reason = info.error.str() if info is not None and info.error is not None else "it does not exist"
        raise BrokerError(f"cannot read topic {topic!r}: {reason}", fix="check kafka.topic_prefix, or start capture first")
    return sorted(info.partitions)


def read_to_end(
    kafka: Mapping[str, str],
    topic: str,
    *,
    start: Mapping[int, int] | None = None,
    idle: float = 1.0,
    timeout: float = 30.0,
) -> Iterator[Message]:
    """Every message of ``topic`` from ``start`` (partition -> offset; default: the
    beginning) up to where each partition ended when the read began."""
    began_ms = int(time.time() * 1000)
    consumer = Consumer({**kafka, "group.id": "gpcdc-reader", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    try:
        partitions = partitions_of(consumer, topic)
        offsets = start or {}
        consumer.assign([TopicPartition(topic, p, offsets.get(p, 0)) for p in partitions])
        now = time.monotonic()
        last_heard = {p: now for p in partitions}
        pending = set(partitions)
        at_eof: dict[int, float] = {}
        connected = False
        while pending:
            message = consumer.poll(0.1)
            now = time.monotonic()
            if message is not None:
                error = message.error()
                partition = message.partition()
                if error is None:
                    connected = True
                    last_heard[partition] = now
                    if partition in pending:
                        if message.timestamp()[1] > began_ms:
                            pending.discard(partition)  # produced after the read began
                        else:
                            yield message
                    continue
                if error.code() == KafkaError._PARTITION_EOF:
                    connected = True
                    at_eof[partition] = now
                    continue
                raise KafkaException(error)
            for partition in list(pending):
                silent = now - last_heard[partition]
                # After an end-of-partition event, a short silence confirms it (a broker
                # with a short high watermark sends what follows at once).
                if connected and (silent > idle or (partition in at_eof and now - at_eof[partition] > EOF_GRACE
                                                     and at_eof[partition] >= last_heard[partition])):
                    pending.discard(partition)
            if not connected and now - min(last_heard.values()) > timeout:
                raise BrokerError(f"no answer from Kafka for {timeout:g} s while reading {topic!r}")
    finally:
        consumer.close()


def end_offsets(kafka: Mapping[str, str], topic: str, partitions: list[int] | None = None,
                *, idle: float = 1.0, timeout: float = 30.0) -> dict[int, int]:
    """The real end (next offset to be written) of each partition, found by reading
    forward from the reported high watermark, which may fall short but not beyond."""
    consumer = Consumer({**kafka, "group.id": "gpcdc-reader", "enable.auto.commit": False})
    try:
        partitions = partitions if partitions is not None else partitions_of(consumer, topic)
        starts = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in partitions}
    finally:
        consumer.close()
    ends = dict(starts)
    for message in read_to_end(kafka, topic, start=starts, idle=idle, timeout=timeout):
        ends[message.partition()] = message.offset() + 1
    return ends


def read_values(kafka: Mapping[str, str], topic: str, **kwargs: Any) -> list[tuple[int, int, dict[str, Any]]]:
    """(partition, offset, decoded JSON value) of every message, in partition order."""
    import orjson

    return [(m.partition(), m.offset(), orjson.loads(m.value())) for m in read_to_end(kafka, topic, **kwargs)]
