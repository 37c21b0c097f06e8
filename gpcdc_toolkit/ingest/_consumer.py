"""Reading the toolkit's topics with a plain Kafka consumer, to their current end.

A partition's end is its high watermark when the read begins (the offset the next
message will take): Apache Kafka reports it exactly. A read stops at it, leaving out
what was produced since; an end-of-partition event also ends a partition, as the
consumer is then at the high watermark of that moment, which is at or past the first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Mapping
from typing import Any, Final, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from ..errors import BrokerError

log = logging.getLogger(__name__)


def located(message: Message) -> tuple[int, int]:
    """A delivered message's (partition, offset), which the client types as optional."""
    partition, offset = message.partition(), message.offset()
    if partition is None or offset is None:
        raise BrokerError(f"Kafka delivered a message of {message.topic()!r} without a partition or an offset")
    return partition, offset


def partitions_of(consumer: Consumer, topic: str, timeout: float = 10.0) -> list[int]:
    """A topic's partitions. While no broker answers (one restarting) or the topic's
    leadership settles, asked again until ``timeout``; a topic that does not exist is
    said at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = consumer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic())).topics.get(topic)
            error = info.error if info is not None else None
        except KafkaException as e:
            info, error = None, e.args[0]
        if info is not None and error is None and info.partitions:
            return sorted(info.partitions)
        away = error is not None and error.code() in _BROKER_AWAY
        if not away or time.monotonic() >= deadline:
            reason = error.str() if error is not None else "it does not exist"
            waited = f" (asked for {timeout:g} s)" if away else ""
            raise BrokerError(f"cannot read topic {topic!r}: {reason}{waited}",
                              fix="check the broker and kafka.bootstrap_servers" if away else
                              "check kafka.topic_prefix, or create the pipeline first "
                              "(`gpcdc bootstrap create`, then `gpcdc capture start`)")
        time.sleep(0.2)  # the broker is coming back: ask again


# Metadata errors while no broker answers, or one has just started.
_BROKER_AWAY = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                KafkaError.LEADER_NOT_AVAILABLE}


# Errors a broker gives while its partitions' leadership settles (after a restart, or
# after it was paused long enough to be fenced): asked again, it answers.
# While a broker starts (again), its metadata can lack a partition for a moment, which
# the client reports as an unknown partition: asked again, it is there.
# On a cluster, the client drops its handle of a node that left the metadata, failing
# the request that was on it, and a newly elected leader answers that its high
# watermark is not caught up yet, or that the leader epoch asked about is not its own
# (Kafka's retriable errors of ListOffsets): asked again, a leader answers.
_SETTLING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
             KafkaError._DESTROY_BROKER, KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.FENCED_LEADER_EPOCH,
             KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.REPLICA_NOT_AVAILABLE, KafkaError.BROKER_NOT_AVAILABLE,
             *_BROKER_AWAY}


def high_watermarks(consumer: Consumer, topic: str, partitions: list[int],
                    timeout: float | None = 30.0) -> dict[int, int]:
    """Each partition's end now: the offset its next message will take. While no broker
    answers or leadership settles, asked again until ``timeout``; None: for as long as
    it takes (a follower of a broker that answered before), saying so every minute."""
    began = time.monotonic()
    deadline = began + timeout if timeout is not None else None
    said = began
    ends: dict[int, int] = {}
    for p in partitions:
        while p not in ends:
            wait = 10.0 if deadline is None else max(0.1, deadline - time.monotonic())
            try:
                ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=wait)[1]
            except KafkaException as e:
                error = e.args[0]
                if error.code() not in _SETTLING or (deadline is not None and time.monotonic() >= deadline):
                    waited = f" within {timeout:g} s" if error.code() in _SETTLING else ""
                    raise BrokerError(f"Kafka did not say where {topic!r} partition {p} ends{waited} ({error.str()})",
                                      fix="check the broker and kafka.bootstrap_servers") from None
                if time.monotonic() - said >= 60:
                    said = time.monotonic()
                    log.warning("Kafka has not said where %r partition %d ends for %.0f s (%s): still asking",
                                topic, p, said - began, error.str())
                time.sleep(0.1)  # the leadership is settling: ask again
    return ends


class EndTracker:
    """Tells when each partition has been read to its end as of when reading began.
    Feed it every message and end-of-partition event."""

    def __init__(self, ends: Mapping[Any, int], start: Mapping[Any, int]) -> None:
        self.ends = dict(ends)
        self.ended = {p for p, end in self.ends.items() if start.get(p, 0) >= end}

    def message(self, partition: Any, offset: int) -> bool:
        """Note a message; False when it came after the partition's end."""
        if offset + 1 >= self.ends[partition]:
            self.ended.add(partition)
        return bool(offset < self.ends[partition])

    def end_of_partition(self, partition: Any) -> None:
        self.ended.add(partition)


def read_to_end(
    kafka: Mapping[str, str],
    topic: str,
    *,
    start: Mapping[int, int] | None = None,
    partitions: list[int] | None = None,
    timeout: float = 30.0,
) -> Generator[Message, None, None]:
    """Every message of ``topic`` (of ``partitions``; default: all) from ``start``
    (partition -> offset; default: the beginning) up to where each partition ended
    when the read began."""
    consumer = Consumer({**kafka, "group.id": "gpcdc-reader", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    try:
        known = partitions_of(consumer, topic, timeout)  # which also says clearly when the topic is missing
        partitions = known if partitions is None else partitions
        offsets = start or {}
        ends = EndTracker(high_watermarks(consumer, topic, partitions, timeout), offsets)
        consumer.assign([TopicPartition(topic, p, offsets.get(p, 0)) for p in partitions])
        while len(ends.ended) < len(partitions):
            message = consumer.poll(timeout)
            if message is None:
                waiting = sorted(set(partitions) - ends.ended)
                raise BrokerError(f"no message from {topic!r} partitions {waiting} within {timeout:g} s, "
                                  "though they hold more", fix="check the broker and kafka.bootstrap_servers")
            error = message.error()
            if error is None:
                partition, offset = located(message)
                if partition not in ends.ended and ends.message(partition, offset):
                    yield message
            elif error.code() == KafkaError._PARTITION_EOF:
                ends.end_of_partition(message.partition())
            else:
                raise BrokerError(f"Kafka failed while reading {topic!r} partition {message.partition()}: {error.str()}",
                                  fix="check the broker and kafka.bootstrap_servers")
    finally:
        consumer.close()


def first_message(kafka: Mapping[str, str], topic: str, partition: int, *, timeout: float = 30.0) -> Message | None:
    """The first message a partition holds now, or None when it holds none."""
    messages = read_to_end(kafka, topic, partitions=[partition], timeout=timeout)
    try:
        return next(messages, None)
    finally:
        messages.close()  # its consumer with it


def json_value(message: Message | None) -> Any:
    """A message's value decoded as JSON (None: no message, no value, or not JSON)."""
    import orjson

    value = message.value() if message is not None else None
    try:
        return orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        return None


def last_message(kafka: Mapping[str, str], topic: str, partition: int, *, end: int | None = None,
                 timeout: float = 30.0) -> Message | None:
    """The last message a partition holds before offset ``end`` (default: now), or None
    when it holds none."""
    end = end_offsets(kafka, topic, [partition], timeout=timeout)[partition] if end is None else end
    last = None
    for message in read_to_end(kafka, topic, start={partition: max(0, end - 1)}, partitions=[partition],
                               timeout=timeout):
        last = message
    return last


UNNUMBERED: Final = "unnumbered"


def last_numbering(kafka: Mapping[str, str], topic: str, partition: int,
                   before: int) -> tuple[int, int] | Literal["unnumbered"] | None:
    """What the last message of a segment partition before offset ``before`` that says
    anything of the parts before it says (see ``protocol.numbering_of``), as (LSN,
    number). ``UNNUMBERED`` for a partition whose parts are not numbered (a pipeline
    bootstrapped before they were): its marker counts no parts, or, where retention
    removed the marker, the last END or watermark before ``before`` carries no number.
    None when nothing before ``before`` says. After a repaired mark (``gpcdc bootstrap
    repair``) the LSN is -1: the segment streams from a new slot, whose LSNs are not
    the old one's. Read backwards in growing windows, down to the partition's first
    message."""
    from ..protocol import kind_of, numbering_of, problem_of, shows_unnumbered

    first = first_message(kafka, topic, partition)
    if first is None:
        return None
    head = json_value(first)
    marked = isinstance(head, dict) and kind_of(head) == "pipeline"
    if marked and shows_unnumbered(head):
        return UNNUMBERED
    low = located(first)[1]
    stop, window = before, 256
    repaired = False  # a repaired mark comes after the last number found so far
    while stop > low:
        begin = max(low, stop - window)
        found: tuple[int, int] | Literal["unnumbered"] | None = None
        repaired_here = False
        for message in read_to_end(kafka, topic, start={partition: begin}, partitions=[partition]):
            if located(message)[1] >= stop:
                break
            value = json_value(message)  # not JSON: it says nothing
            if not isinstance(value, dict):
                continue
            if (numbering := numbering_of(value)) is not None:
                found, repaired_here = numbering, False
            elif not marked and shows_unnumbered(value):
                found, repaired_here = UNNUMBERED, False  # the marker is gone: the partition's own messages say
            elif kind_of(value) == "repaired" and problem_of(value) is None:
                repaired_here = True
        repaired = repaired or repaired_here
        if isinstance(found, tuple) and repaired:
            return -1, found[1]
        if found is not None:
            return found
        stop, window = begin, window * 4
    return None


def end_offsets(kafka: Mapping[str, str], topic: str, partitions: list[int] | None = None,
                *, timeout: float = 30.0) -> dict[int, int]:
    """The end (next offset to be written) of each partition."""
    consumer = Consumer({**kafka, "group.id": "gpcdc-reader", "enable.auto.commit": False})
    try:
        partitions = partitions if partitions is not None else partitions_of(consumer, topic, timeout)
        return high_watermarks(consumer, topic, partitions, timeout)
    finally:
        consumer.close()


def read_values(kafka: Mapping[str, str], topic: str, **kwargs: Any) -> list[tuple[int, int, dict[str, Any]]]:
    """(partition, offset, decoded JSON value) of every message, in partition order."""
    import orjson

    return [(*located(m), orjson.loads(m.value() or b"")) for m in read_to_end(kafka, topic, **kwargs)]
