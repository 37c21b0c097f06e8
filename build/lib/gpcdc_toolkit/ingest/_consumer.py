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
from collections.abc import Generator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from ..errors import BrokerError

EOF_GRACE = 0.25  # seconds of silence after an end-of-partition event


def located(message: Message) -> tuple[int, int]:
    """A delivered message's (partition, offset), which the client types as optional."""
    partition, offset = message.partition(), message.offset()
    if partition is None or offset is None:
        raise BrokerError(f"Kafka delivered a message of {message.topic()!r} without a partition or an offset")
    return partition, offset


def partitions_of(consumer: Consumer, topic: str, timeout: float = 10.0) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=timeout)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        reason = info.error.str() if info is not None and info.error is not None else "it does not exist"
        raise BrokerError(f"cannot read topic {topic!r}: {reason}", fix="check kafka.topic_prefix, or create the pipeline first "
                         "(`gpcdc bootstrap create`, then `gpcdc capture start`)")
    return sorted(info.partitions)


class EndTracker:
    """Tells when each partition has been read to where it ended when reading began,
    by the rules above. Feed it every message and end-of-partition event, and the time
    spent in each poll: silence counts only while the consumer listens, so a caller
    busy between polls does not make partitions look idle."""

    def __init__(self, partitions: list[Any], *, idle: float = 1.0, began_ms: int | None = None) -> None:
        self.idle = idle
        self.began_ms = began_ms if began_ms is not None else int(time.time() * 1000)
        self.listened = 0.0  # seconds spent polling so far
        self.last_heard = {p: 0.0 for p in partitions}
        self.at_eof: dict[Any, float] = {}
        self.ended: set[Any] = set()
        self.connected = False

    def polled(self, seconds: float) -> None:
        self.listened += seconds

    def message(self, partition: Any, timestamp_ms: int) -> bool:
        """Note a message; False when it was produced after reading began."""
        self.connected = True
        self.last_heard[partition] = self.listened
        if timestamp_ms > self.began_ms:
            self.ended.add(partition)
            return False
        return True

    def end_of_partition(self, partition: Any) -> None:
        self.connected = True
        self.at_eof[partition] = self.listened

    def silent(self, partition: Any) -> bool:
        """Whether nothing came from ``partition`` for ``idle`` seconds of polling."""
        return self.connected and self.listened - self.last_heard[partition] > self.idle

    def check(self, timeout: float = 30.0, what: str = "") -> set[Any]:
        """The partitions read to their end so far; raises BrokerError when Kafka has not
        answered for ``timeout`` seconds of polling."""
        now = self.listened
        for partition, heard in self.last_heard.items():
            # After an end-of-partition event, a short silence confirms it (a broker
            # with a short high watermark sends what follows at once).
            eof = self.at_eof.get(partition)
            if self.connected and (now - heard > self.idle or (eof is not None and now - eof > EOF_GRACE and eof >= heard)):
                self.ended.add(partition)
        if not self.connected and now > timeout:
            raise BrokerError(f"no answer from Kafka for {timeout:g} s while reading {what}")
        return self.ended


def read_to_end(
    kafka: Mapping[str, str],
    topic: str,
    *,
    start: Mapping[int, int] | None = None,
    partitions: list[int] | None = None,
    idle: float = 1.0,
    timeout: float = 30.0,
) -> Generator[Message, None, None]:
    """Every message of ``topic`` (of ``partitions``; default: all) from ``start``
    (partition -> offset; default: the beginning) up to where each partition ended
    when the read began."""
    began_ms = int(time.time() * 1000)
    consumer = Consumer({**kafka, "group.id": "gpcdc-reader", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    try:
        known = partitions_of(consumer, topic)  # which also says clearly when the topic is missing
        partitions = known if partitions is None else partitions
        offsets = start or {}
        consumer.assign([TopicPartition(topic, p, offsets.get(p, 0)) for p in partitions])
        ends = EndTracker(partitions, idle=idle, began_ms=began_ms)
        while len(ends.check(timeout, repr(topic))) < len(partitions):
            polling = time.monotonic()
            message = consumer.poll(0.1)
            ends.polled(time.monotonic() - polling)
            if message is None:
                continue
            error = message.error()
            partition = message.partition()
            if error is None:
                partition, _offset = located(message)
                if ends.message(partition, message.timestamp()[1]) and partition not in ends.ended:
                    yield message
            elif error.code() == KafkaError._PARTITION_EOF:
                ends.end_of_partition(partition)
            else:
                raise BrokerError(f"Kafka failed while reading {topic!r} partition {partition}: {error.str()}",
                                  fix="check the broker and kafka.bootstrap_servers")
    finally:
        consumer.close()


def first_message(kafka: Mapping[str, str], topic: str, partition: int, *, idle: float = 1.0,
                  timeout: float = 30.0) -> Message | None:
    """The first message a partition holds now, or None when it holds none."""
    messages = read_to_end(kafka, topic, partitions=[partition], idle=idle, timeout=timeout)
    try:
        return next(messages, None)
    finally:
        messages.close()  # its consumer with it


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
        partition, offset = located(message)
        ends[partition] = offset + 1
    return ends


def read_values(kafka: Mapping[str, str], topic: str, **kwargs: Any) -> list[tuple[int, int, dict[str, Any]]]:
    """(partition, offset, decoded JSON value) of every message, in partition order."""
    import orjson

    return [(*located(m), orjson.loads(m.value() or b"")) for m in read_to_end(kafka, topic, **kwargs)]
