"""A Parquet archive of a pipeline's topics, so that audits of history do not depend on
Kafka's retention.

Each ``write_archive`` appends what the topics gained since the previous one, as one
directory of Parquet files in the ingest schema (``run-<n>``) holding also where it
ended (``_position.json``, which Spark's Parquet reader passes over), written aside and
renamed into place: a write that fails leaves no partial run behind, and the next one
starts where the last whole one ended.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._runtime import read_json, write_json
from ..broker import check_reachable
from ..config import Config
from ..connect import kafka_client_settings
from ..errors import ConfigError
from ..ingest import end_offsets
from ..ingest._rows import SCHEMA_DDL
from ..protocol import Topics

POSITION = "_position.json"  # in each run's directory: where that run ended


class ArchiveError(ConfigError):
    """An archive cannot be read or written as asked."""


Offsets = dict[str, dict[int, int]]  # topic -> partition -> offset


@dataclass(frozen=True)
class ArchiveRun:
    path: Path  # the run's directory
    events: int  # messages it holds


def _position(path: Path) -> Offsets:
    runs = _runs(path)
    if not runs:
        return {}
    file = runs[-1] / POSITION
    return {topic: {int(p): o for p, o in parts.items()} for topic, parts in read_json(file).items()}


def _runs(path: Path) -> list[Path]:
    return sorted((p for p in path.glob("run-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))


def write_archive(spark: Any, config: Config, path: Path) -> ArchiveRun:
    """Append the topics' messages since the previous run to the archive at ``path``."""
    from ..ingest.spark import read_changes, read_coordinator

    path.mkdir(parents=True, exist_ok=True)
    topics = Topics(config.kafka.topic_prefix)
    kafka = kafka_client_settings(config)
    check_reachable(kafka)  # one line now, rather than the client's retries
    start = _position(path)
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
    window = {topic: {p: start.get(topic, {}).get(p, -2) for p in end[topic]} for topic in end}
    events = read_changes(spark, config, starting_offsets=window[topics.changes],
                          ending_offsets=end[topics.changes]).unionByName(
        read_coordinator(spark, config, starting_offsets=window[topics.dtx], ending_offsets=end[topics.dtx]))
    runs = _runs(path)
    number = int(runs[-1].name.split("-")[1]) + 1 if runs else 1
    aside = path / f".writing-{uuid.uuid4().hex[:8]}"
    try:
        events.write.parquet(str(aside))
        count = spark.read.parquet(str(aside)).count()
        write_json(aside / POSITION, {topic: {str(p): o for p, o in parts.items()} for topic, parts in end.items()})
        final = path / f"run-{number:06d}"
        aside.rename(final)  # the run, and where it ended, at once
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return ArchiveRun(final, count)


def read_archive(spark: Any, path: Path) -> Any:
    """Every message of an archive, in the ingest schema."""
    runs = _runs(path) if path.is_dir() else []
    if not runs:
        raise ArchiveError(f"{path} holds no archive runs", fix="write one with `gpcdc archive --to PATH` first")
    return spark.read.schema(SCHEMA_DDL).parquet(*(str(run) for run in runs))
