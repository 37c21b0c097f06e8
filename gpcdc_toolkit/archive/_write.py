"""Writing an archive: what the topics gained since the last run, as one more run.

A run is read with one consumer over both topics, in the order Kafka delivers (each
partition's messages in offset order, partitions interleaved as a replayer meets them),
and written as Parquet in the ingest schema plus each message's bytes, aside and then
renamed into place: a write that fails leaves no partial run behind, and the next one
starts where the last whole one ended. The pipeline's record (start point, initial
snapshot, repairs, sync points) is copied beside the runs.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from .._runtime import read_json, write_json
from ..bootstrap import Pipeline
from ..broker import check_reachable
from ..config import Config
from ..connect import kafka_client_settings
from ..errors import BrokerError
from ..ingest import EndTracker, end_offsets, located
from ..ingest._rows import arrow_schema, to_arrow, to_row
from ..protocol import StartPoint, Topics
from ._layout import POSITION, START, VALUE, ArchiveError, Offsets
from ._read import bounds_of, runs_of

BATCH = 10_000  # messages per Parquet row group: what a write holds in memory


@dataclass(frozen=True)
class ArchiveRun:
    path: Path  # the run's directory
    events: int  # messages it holds


def write_archive(config: Config, path: Path) -> ArchiveRun:
    """Append the topics' messages since the previous run to the archive at ``path``,
    and copy the pipeline's record beside it."""
    path.mkdir(parents=True, exist_ok=True)
    topics = Topics(config.kafka.topic_prefix)
    kafka = kafka_client_settings(config)
    check_reachable(kafka)  # one line now, rather than the client's retries
    _copy_record(Pipeline(config.work_dir, topics.prefix), Pipeline(path, topics.prefix), path)
    bounds = bounds_of(path)
    start: Offsets = bounds[-1].end if bounds else {}
    end = {topic: end_offsets(kafka, topic) for topic in (topics.changes, topics.dtx)}
    for topic, parts in start.items():
        if topic not in end:
            raise ArchiveError(f"archive {path} holds topic {topic}, not one of this pipeline's",
                               fix="archive each pipeline (kafka.topic_prefix) to its own path")
        for partition, offset in parts.items():
            if end[topic].get(partition, 0) < offset:
                raise ArchiveError(f"archive {path} holds {topic} partition {partition} up to offset {offset}, but "
                                   f"Kafka's ends at {end[topic].get(partition, 0)}: the topic was recreated",
                                   fix="archive the new topics to a new path")
    runs = runs_of(path)
    number = int(runs[-1].name.split("-")[1]) + 1 if runs else 1
    aside = path / f".writing-{uuid.uuid4().hex[:8]}"
    try:
        aside.mkdir()
        first = {topic: {p: start.get(topic, {}).get(p, 0) for p in parts} for topic, parts in end.items()}
        count, low = _write_run(kafka, first, end, aside / "part-00000.parquet")
        # Where the run starts: its first messages (past where the last run ended when
        # retention deleted messages the archive never held: a gap the chain shows).
        write_json(aside / START, {t: {str(p): low.get(t, {}).get(p, o) for p, o in parts.items()}
                                   for t, parts in first.items()})
        write_json(aside / POSITION, {t: {str(p): o for p, o in parts.items()} for t, parts in end.items()})
        final = path / f"run-{number:06d}"
        aside.rename(final)  # the run, and where it starts and ends, at once
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return ArchiveRun(final, count)


def _write_run(kafka: dict[str, str], start: Offsets, end: Offsets, file: Path) -> tuple[int, Offsets]:
    """Write the messages from ``start`` to ``end``; their count, and each partition's
    first offset."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema().append(pa.field(VALUE, pa.binary()))
    count, low = 0, dict[str, dict[int, int]]()
    with pq.ParquetWriter(file, schema) as writer:
        rows: list[tuple[Any, ...]] = []
        values: list[bytes | None] = []
        for message in _messages(kafka, start, end):
            partition, offset = located(message)
            low.setdefault(message.topic() or "", {}).setdefault(partition, offset)
            value = message.value()
            rows.append(to_row(message.topic() or "", partition, offset, message.timestamp()[1], message.key(), value))
            values.append(value)
            if len(rows) >= BATCH:
                count += _flush(writer, schema, rows, values)
        count += _flush(writer, schema, rows, values)
    return count, low


def _flush(writer: Any, schema: Any, rows: list[tuple[Any, ...]], values: list[bytes | None]) -> int:
    import pyarrow as pa

    n = len(rows)
    if n:
        batch = to_arrow(rows, arrow_schema())
        writer.write_batch(pa.RecordBatch.from_arrays([*batch.columns, pa.array(values, pa.binary())], schema=schema))
        rows.clear()
        values.clear()
    return n


def _messages(kafka: dict[str, str], start: Offsets, end: Offsets, timeout: float = 30.0) -> Iterator[Message]:
    """The messages of every topic and partition from ``start`` up to ``end``, as one
    consumer delivers them."""
    windows = {(t, p): (start[t][p], o) for t, parts in end.items() for p, o in parts.items()}
    consumer = Consumer({**kafka, "group.id": "gpcdc-archive", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    try:
        ends = EndTracker({k: e for k, (_, e) in windows.items()}, {k: s for k, (s, _) in windows.items()})
        consumer.assign([TopicPartition(t, p, s) for (t, p), (s, _) in windows.items()])
        while len(ends.ended) < len(windows):
            message = consumer.poll(timeout)
            if message is None:
                waiting = sorted(set(windows) - ends.ended)
                raise BrokerError(f"no message from {waiting} within {timeout:g} s, though they hold more",
                                  fix="check the broker and kafka.bootstrap_servers, then archive again")
            error = message.error()
            key = (message.topic(), message.partition())
            if error is None:
                if key not in ends.ended and ends.message(key, located(message)[1]):
                    yield message
            elif error.code() == KafkaError._PARTITION_EOF:
                ends.end_of_partition(key)
            else:
                raise BrokerError(f"Kafka failed while archiving {key[0]!r} partition {key[1]}: {error.str()}",
                                  fix="check the broker and kafka.bootstrap_servers, then archive again")
    finally:
        consumer.close()


def _copy_record(pipeline: Pipeline, archived: Pipeline, path: Path) -> None:
    """Copy what of the pipeline's record the archive lacks: its start point (refusing
    an archive of another bootstrap), initial snapshot, repairs and sync points."""
    if not pipeline.start_point_file.is_file():
        return  # the topics alone: audits read them; a rebuild needs the start point
    ours = StartPoint.from_json(read_json(pipeline.start_point_file)).identity
    if archived.start_point_file.is_file():
        theirs = StartPoint.from_json(read_json(archived.start_point_file)).identity
        if theirs != ours:
            raise ArchiveError(f"archive {path} holds bootstrap {theirs} of pipeline {pipeline.prefix!r}, and the "
                               f"pipeline is now bootstrap {ours}", fix="archive the new bootstrap's topics to a new path")
    archived.directory.mkdir(parents=True, exist_ok=True)
    copies = [(pipeline.snapshot_dir, archived.snapshot_dir)]
    copies += [(d, archived.repairs_dir / d.name) for d in sorted(pipeline.repairs_dir.glob("seg*-*"))
               if (d / "repair.json").is_file()]
    for source, copy in copies:
        if source.is_dir() and not copy.exists():
            aside = copy.with_name(f".copying-{copy.name}")
            shutil.rmtree(aside, ignore_errors=True)
            shutil.copytree(source, aside)
            aside.rename(copy)
    archived.syncpoints_dir.mkdir(exist_ok=True)
    for record in sorted(pipeline.syncpoints_dir.glob("*.json")):
        if not (archived.syncpoints_dir / record.name).exists():
            shutil.copy2(record, archived.syncpoints_dir / f".{record.name}")
            (archived.syncpoints_dir / f".{record.name}").rename(archived.syncpoints_dir / record.name)
    if not archived.start_point_file.is_file():
        shutil.copy2(pipeline.start_point_file, archived.start_point_file)  # last: the record is whole once it is here
