"""A Spark Python data source over the toolkit's Kafka topics: ``format("gpcdc")``.

Options (strings, like Spark's own Kafka source):

=========================  ====================================================================
``kafka.bootstrap.servers``  required; every ``kafka.*`` option goes to the Kafka client
``topic``                    the topic to read (``<prefix>.changes`` or ``<prefix>.dtx``)
``startingOffsets``          ``earliest`` (default), ``latest``, or JSON ``{"0": 42, "1": -2}``
                             (-2 earliest, -1 latest)
``endingOffsets``            batch only: ``latest`` (default) or JSON as above
``startingTimestamp``        epoch ms: start each partition at its first message at or after it
``endingTimestamp``          batch only, epoch ms: stop before the first message at or after it
``maxOffsetsPerTrigger``     streaming: at most this many messages per micro-batch
``maxRecordsPerPartition``   split a partition's range into Spark partitions of this size
                             (default 100000)
=========================  ====================================================================

Every Kafka partition becomes at least one Spark partition. Ends of partitions are
their high watermarks when the read is planned (see :mod:`._consumer`).
Executors read with confluent-kafka and parse with :func:`._rows.to_row`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from .._spark_tasks import read_in_tasks
from ..errors import ConfigError
from ._rows import SCHEMA_DDL

NAME = "gpcdc"
EARLIEST, LATEST = -2, -1


class SourceOptionError(ConfigError, ValueError):
    """An option of the gpcdc source is missing or malformed."""


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """Offsets [start, end) of one Kafka partition: what one Spark partition reads."""

    topic: str
    partition: int
    start: int
    end: int


def _normalized(options: Any) -> dict[str, str]:
    """Options by lower-case name: Spark treats option names case-insensitively."""
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _kafka_settings(options: dict[str, str]) -> dict[str, str]:
    settings = {k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}
    if "bootstrap.servers" not in settings:
        raise SourceOptionError("the gpcdc source needs option kafka.bootstrap.servers")
    return settings


def _offsets_option(options: dict[str, str], name: str, default: str) -> str | dict[int, int]:
    text = options.get(name.lower(), default).strip()
    if text in ("earliest", "latest"):
        return text
    try:
        parsed = json.loads(text)
        return {int(p): int(o) for p, o in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise SourceOptionError(
            f"option {name}={text!r} is not earliest, latest or a JSON object of partition to offset"
        ) from None


def _int_option(options: dict[str, str], name: str) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise SourceOptionError(f"option {name}={text!r} is not an integer") from None


SPLIT = 100_000  # maxRecordsPerPartition's default: a Spark partition's offsets, at most


class _Planner:
    """Turns options into offsets, on the driver."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.kafka = _kafka_settings(options)
        topic = options.get("topic")
        if not topic:
            raise SourceOptionError("the gpcdc source needs option topic (e.g. gpcdc.changes)")
        self.topic: str = topic
        self.split = _int_option(options, "maxRecordsPerPartition") or SPLIT
        if self.split <= 0:
            raise SourceOptionError("option maxRecordsPerPartition must be positive")

    def _bounds(self) -> tuple[list[int], dict[int, int], dict[int, int]]:
        from confluent_kafka import Consumer, TopicPartition

        from ._consumer import end_offsets, partitions_of

        consumer = Consumer({**self.kafka, "group.id": "gpcdc-planner", "enable.auto.commit": False})
        try:
            partitions = partitions_of(consumer, self.topic)
            lows = {p: consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[0] for p in partitions}
        finally:
            consumer.close()
        return partitions, lows, end_offsets(self.kafka, self.topic, partitions)

    def _by_time(self, ms: int, partitions: list[int], ends: dict[int, int]) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({**self.kafka, "group.id": "gpcdc-planner", "enable.auto.commit": False})
        try:
            found = consumer.offsets_for_times([TopicPartition(self.topic, p, ms) for p in partitions], timeout=10)
        finally:
            consumer.close()
        return {tp.partition: (tp.offset if tp.offset >= 0 else ends[tp.partition]) for tp in found}

    def offsets(self, name: str, default: str, time_option: str,
                partitions: list[int], lows: dict[int, int], ends: dict[int, int]) -> dict[int, int]:
        ms = _int_option(self.options, time_option)
        if ms is not None:
            return self._by_time(ms, partitions, ends)
        spec = _offsets_option(self.options, name, default)
        if spec == "earliest":
            return dict(lows)
        if spec == "latest":
            return dict(ends)
        out = {}
        for p in partitions:
            o = spec.get(p, EARLIEST if name == "startingOffsets" else LATEST)  # type: ignore[union-attr]
            if o not in (EARLIEST, LATEST) and o < lows[p]:
                # Reading on from the log's start would skip what is gone without a word.
                raise SourceOptionError(f"option {name} asks for offset {o} of {self.topic} partition {p}, but Kafka "
                                        f"holds it from offset {lows[p]} on (retention or deletion removed the rest)")
            out[p] = lows[p] if o == EARLIEST else ends[p] if o == LATEST else min(o, ends[p])
        return out

    def window(self) -> tuple[dict[int, int], dict[int, int]]:
        """The offsets a batch read covers, per partition: from the first, up to the second."""
        partitions, lows, ends = self._bounds()
        return (self.offsets("startingOffsets", "earliest", "startingTimestamp", partitions, lows, ends),
                self.offsets("endingOffsets", "latest", "endingTimestamp", partitions, lows, ends))

    def ranges(self, start: dict[int, int], end: dict[int, int]) -> list[KafkaRange]:
        out = []
        for p in sorted(end):
            first, last = start.get(p, 0), end[p]
            while first < last:
                out.append(KafkaRange(self.topic, p, first, min(last, first + self.split)))
                first += self.split
        return out


def read_range(kafka: dict[str, str], r: KafkaRange, batch: int = 10_000) -> Iterator[Any]:
    """The rows of one range as Arrow record batches, read with a plain consumer (on an
    executor). Arrow hands whole columns to the JVM instead of pickled rows."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from ._consumer import located
    from ._rows import arrow_schema, collector_paused, to_arrow, to_row

    if r.start >= r.end:
        return
    schema = arrow_schema()
    # auto.offset.reset=error: an offset the broker no longer has (retention) fails the
    # read instead of silently jumping to the end.
    consumer = Consumer({**kafka, "group.id": "gpcdc-reader", "enable.auto.commit": False,
                         "auto.offset.reset": "error",
                         "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
    try:
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        position = r.start
        idle_polls = 0
        while position < r.end:
            # No more than the range still holds: consume() returns once it has that many,
            # where asking for a full batch would wait out the timeout at a range's end.
            messages = consumer.consume(min(batch, r.end - position), timeout=1.0)
            if not messages:
                idle_polls += 1
                if idle_polls > 60:
                    raise KafkaException(f"no message from {r.topic}[{r.partition}] at offset {position} "
                                         f"within 60 s (range ends at {r.end})")
                continue
            idle_polls = 0
            rows = []
            done = False
            with collector_paused():
                for m in messages:
                    error = m.error()
                    if error is not None:
                        if error.code() == -191:  # _PARTITION_EOF
                            continue
                        raise KafkaException(error)
                    _partition, offset = located(m)
                    if offset < position:
                        continue  # a broker may return a batch from before the requested offset
                    ts = m.timestamp()[1]
                    if offset >= r.end:
                        done = True
                        break
                    position = offset + 1
                    rows.append(to_row(r.topic, r.partition, offset, ts if ts >= 0 else None, m.key(), m.value()))
                parsed = to_arrow(rows, schema) if rows else None
            if parsed is not None:
                yield parsed
            if done:
                return
    finally:
        consumer.close()


class _BatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        planner = _Planner(options)
        self.kafka = planner.kafka
        self._ranges = planner.ranges(*planner.window())

    def partitions(self) -> Sequence[InputPartition]:
        return self._ranges or [KafkaRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.kafka, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.planner = _Planner(options)
        self.kafka = self.planner.kafka
        self.max_per_trigger = _int_option(options, "maxOffsetsPerTrigger")
        self.target: dict[int, int] | None = None  # for Trigger.AvailableNow

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 (Spark's names)
        partitions, lows, ends = self.planner._bounds()
        start = self.planner.offsets("startingOffsets", "earliest", "startingTimestamp", partitions, lows, ends)
        return {str(p): o for p, o in start.items()}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.target = self.planner._bounds()[2]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        ends = self.target if self.target is not None else self.planner._bounds()[2]
        begin = {int(p): o for p, o in start.items()}
        latest = {p: max(ends[p], begin.get(p, 0)) for p in ends}
        if isinstance(limit, ReadMaxRows):
            latest = _limit(begin, latest, limit.max_rows)
        return {str(p): o for p, o in latest.items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self.planner.ranges({int(p): o for p, o in start.items()}, {int(p): o for p, o in end.items()})

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.kafka, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # positions live in Spark's checkpoint, not in Kafka


def _limit(start: dict[int, int], latest: dict[int, int], max_rows: int) -> dict[int, int]:
    """Advance the partitions by ``max_rows`` messages in all, shared in proportion to
    what each has waiting, the remainder going to those with the most."""
    waiting = {p: latest[p] - start.get(p, 0) for p in latest}
    total = sum(waiting.values())
    if total <= max_rows:
        return latest
    shares = {p: n * max_rows // total for p, n in waiting.items()}
    left = max_rows - sum(shares.values())
    for p in sorted(waiting, key=lambda q: -waiting[q]):
        extra = min(left, waiting[p] - shares[p])
        shares[p] += extra
        left -= extra
    return {p: start.get(p, 0) + n for p, n in shares.items()}


def plan_window(options: dict[str, str]) -> tuple[dict[int, int], dict[int, int]]:
    """The offsets, per partition, that a batch read with these options covers (a time
    is each partition's first offset whose timestamp is at or after it, from the
    broker's time index): what Spark's own Kafka source is given, so that both read
    the same."""
    return _Planner(_normalized(options)).window()


def plan_start(options: dict[str, str]) -> dict[int, int]:
    """The offsets, per partition, that a stream with these options starts from."""
    planner = _Planner(_normalized(options))
    partitions, lows, ends = planner._bounds()
    return planner.offsets("startingOffsets", "earliest", "startingTimestamp", partitions, lows, ends)


def read_window(spark: Any, options: dict[str, str]) -> Any:
    """A batch read with these options as a DataFrame, planned here, now: its ranges
    are read on the executors, one task each, by the same reader as the data source's.
    The data source's own planning runs in Python workers Spark starts for it, which a
    fresh session's first read waits for; and it plans again at every action, where
    this DataFrame keeps the window it was made with."""
    planner = _Planner(_normalized(options))
    return read_in_tasks(spark, planner.ranges(*planner.window()), partial(read_range, planner.kafka), SCHEMA_DDL)


class GpcdcDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(_normalized(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return _StreamReader(_normalized(self.options))
