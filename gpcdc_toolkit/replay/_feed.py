"""Where a replay's messages come from: the pipeline's Kafka topics, or a Parquet
archive of them. Either gives each partition's messages in offset order (the
coordinator's topic as partition -1), and says where each partition ends."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, TopicPartition

from ..archive import ArchivedStream
from ..connect import METADATA_REFRESH, kafka_logger
from ..errors import BrokerError
from ..ingest import high_watermarks, last_numbering, located, partitions_of
from ..protocol import COORDINATOR, Topics


@dataclass(frozen=True)
class Delivery:
    partition: int  # of the changes topic; COORDINATOR: the coordinator's topic
    offset: int
    value: bytes | None


class Feed(Protocol):
    segments: list[int]  # the changes topic's partitions

    def ends(self) -> dict[int, int]:
        """Where each partition ends now: the offset its next message will take."""
        ...

    def start(self, offsets: Mapping[int, int]) -> None:
        """Read each partition from ``offsets``."""
        ...

    def poll(self) -> tuple[list[Delivery], list[int]]:
        """The next messages, and the partitions that reported reaching their end."""
        ...

    def numbering_before(self, partition: int, offset: int) -> int | None:
        """In a numbered segment partition, the number of the last part before
        ``offset`` (None: nothing before it says)."""
        ...

    def syncpoints(self) -> list[int] | None:
        """The sync points the whole stream holds, where that is known before reading
        it (an archive); None where the stream grows (Kafka)."""
        ...

    def close(self) -> None: ...


def consumer_config(kafka: Mapping[str, str], topics: Topics) -> dict[str, Any]:
    """The replayer's consumer: ``kafka`` (the broker and [kafka.client]) with what the
    replayer needs of it."""
    return {**METADATA_REFRESH, **kafka, "group.id": f"gpcdc-replay-{topics.prefix}",
            "enable.auto.commit": False, "enable.partition.eof": True,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
            # Prefetch bounded: 16 MB queued, 8 MB per fetch (not 64 and 50).
            "queued.max.messages.kbytes": 16384, "fetch.max.bytes": 8 << 20,
            "logger": kafka_logger()}


class KafkaFeed:
    """The topics, with one consumer."""

    def __init__(self, kafka: Mapping[str, str], topics: Topics, broker_wait: float, *, follow: bool = False) -> None:
        # The topics must be found within ``broker_wait``; once they are, a follower
        # waits for a broker that stops answering for as long as it takes, as capture does.
        self.kafka, self.topics, self.broker_wait = kafka, topics, broker_wait
        self.ends_wait = None if follow else broker_wait
        self.consumer = Consumer(consumer_config(kafka, topics))
        try:
            self.segments = partitions_of(self.consumer, topics.changes, broker_wait)
            partitions_of(self.consumer, topics.dtx, broker_wait)
        except BaseException:
            self.consumer.close()
            raise

    def ends(self) -> dict[int, int]:
        return {**high_watermarks(self.consumer, self.topics.changes, self.segments, self.ends_wait),
                COORDINATOR: high_watermarks(self.consumer, self.topics.dtx, [0], self.ends_wait)[0]}

    def start(self, offsets: Mapping[int, int]) -> None:
        self.consumer.assign([TopicPartition(self.topics.changes, p, offsets[p]) for p in self.segments]
                             + [TopicPartition(self.topics.dtx, 0, offsets[COORDINATOR])])

    def poll(self) -> tuple[list[Delivery], list[int]]:
        delivered, ended = [], []
        for message in self.consumer.consume(1000, 0.2):
            error = message.error()
            partition = COORDINATOR if message.topic() == self.topics.dtx else (message.partition() or 0)
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise BrokerError(f"Kafka failed while the replayer read {self.topics.name(partition)}: "
                                      f"{error.str()}", fix="check the broker and kafka.bootstrap_servers")
                ended.append(partition)
                continue
            delivered.append(Delivery(partition, located(message)[1], message.value()))
        return delivered, ended

    def numbering_before(self, partition: int, offset: int) -> int | None:
        found = last_numbering(self.kafka, self.topics.changes, partition, offset)
        return found[1] if isinstance(found, tuple) else None

    def syncpoints(self) -> list[int] | None:
        return None

    def close(self) -> None:
        self.consumer.close()


class ArchiveFeed:
    """An archive's runs, read in the order they hold the messages."""

    def __init__(self, path: Path, topics: Topics) -> None:
        self.stream = ArchivedStream(path, topics)
        self.segments = self.stream.segments
        self._batches: Generator[list[tuple[int, int, bytes | None]], None, None] | None = None

    def ends(self) -> dict[int, int]:
        return dict(self.stream.ends)

    def start(self, offsets: Mapping[int, int]) -> None:
        self._batches = self.stream.messages(dict(offsets))

    def poll(self) -> tuple[list[Delivery], list[int]]:
        assert self._batches is not None, "start() first"
        batch = next(self._batches, None)
        if batch is None:
            return [], [*self.segments, COORDINATOR]  # the archive's end is every partition's
        return [Delivery(*m) for m in batch], []

    def numbering_before(self, partition: int, offset: int) -> int | None:
        return self.stream.numbering_before(partition, offset)

    def syncpoints(self) -> list[int] | None:
        return [gxid for gxid, _ms in self.stream.syncpoints()]

    def close(self) -> None:
        if self._batches is not None:
            self._batches.close()
