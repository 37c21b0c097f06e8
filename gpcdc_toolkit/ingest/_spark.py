"""Spark helpers the notebooks use: a session, and the toolkit's topics as DataFrames."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .._runtime import read_json, write_json
from ..config import Config
from ..connect import kafka_client_settings
from ..protocol import Topics
from ._spark_source import NAME, GpcdcDataSource


def spark_session(config: Config, app_name: str = "gpcdc") -> Any:
    """A Spark session on ``spark.master``, with the gpcdc source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(config.spark.master).appName(app_name)
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.ui.enabled", "false")
             .getOrCreate())
    register(spark)
    return spark


def register(spark: Any) -> None:
    spark.dataSource.register(GpcdcDataSource)


def _options(config: Config, topic: str, **options: Any) -> dict[str, str]:
    kafka = {f"kafka.{k}": v for k, v in kafka_client_settings(config).items()}
    out = {**kafka, "topic": topic}
    for name, value in options.items():
        if value is None:
            continue
        out[name] = json.dumps({str(p): o for p, o in value.items()}) if isinstance(value, dict) else str(value)
    return out


def _read(spark: Any, config: Config, topic: str, **window: Any) -> Any:
    return spark.read.format(NAME).options(**_options(config, topic, **window)).load()


def read_changes(spark: Any, config: Config, *, starting_offsets: Any = None, ending_offsets: Any = None,
                 starting_timestamp: int | None = None, ending_timestamp: int | None = None) -> Any:
    """The segments' events (row events, BEGIN/END, watermarks) in an offset or time window."""
    return _read(spark, config, Topics(config.kafka.topic_prefix).changes, startingOffsets=starting_offsets,
                 endingOffsets=ending_offsets, startingTimestamp=starting_timestamp, endingTimestamp=ending_timestamp)


def read_transactions(spark: Any, config: Config, **window: Any) -> Any:
    """The coordinator's distributed commit records and DDL records."""
    df = _read(spark, config, Topics(config.kafka.topic_prefix).dtx, **_window(window))
    return df.where(df.kind.isin("commit", "ddl"))


def read_watermarks(spark: Any, config: Config, **window: Any) -> Any:
    """Every node's resolved watermarks, the coordinator's included."""
    topics = Topics(config.kafka.topic_prefix)
    parts = [_read(spark, config, t, **_window(window)) for t in (topics.changes, topics.dtx)]
    df = parts[0].unionByName(parts[1])
    return df.where(df.kind == "resolved").select("segment", "resolved_lsn", "resolved_ts", "timestamp", "topic",
                                                  "partition", "offset")


def _window(window: dict[str, Any]) -> dict[str, Any]:
    names = {"starting_offsets": "startingOffsets", "ending_offsets": "endingOffsets",
             "starting_timestamp": "startingTimestamp", "ending_timestamp": "endingTimestamp"}
    return {names[k]: v for k, v in window.items()}


def stream_changes(spark: Any, config: Config, *, starting_offsets: Any = None,
                   max_offsets_per_trigger: int | None = None) -> Any:
    """The changes topic as a streaming DataFrame (restartable from a checkpoint)."""
    return (spark.readStream.format(NAME)
            .options(**_options(config, Topics(config.kafka.topic_prefix).changes, startingOffsets=starting_offsets,
                                maxOffsetsPerTrigger=max_offsets_per_trigger))
            .load())


class IncrementalRead:
    """Batch reads that each start where the previous committed one ended.

    ``df = run.changes()`` reads from the saved position to the current end;
    ``run.commit()`` saves that end once the DataFrame has been processed. A run that
    fails before ``commit()`` is read again next time.
    """

    def __init__(self, spark: Any, config: Config, name: str) -> None:
        self.spark = spark
        self.config = config
        self.position_file = Path(config.work_dir) / "positions" / f"{name}.json"
        self._end: dict[int, int] | None = None

    def saved_position(self) -> dict[int, int]:
        if not self.position_file.is_file():
            return {}
        return {int(p): o for p, o in read_json(self.position_file).items()}

    def changes(self) -> Any:
        from ._consumer import end_offsets

        topic = Topics(self.config.kafka.topic_prefix).changes
        self._end = end_offsets(kafka_client_settings(self.config), topic)
        start = {p: self.saved_position().get(p, -2) for p in self._end}
        return _read(self.spark, self.config, topic, startingOffsets=start, endingOffsets=self._end)

    def commit(self) -> None:
        if self._end is None:
            raise RuntimeError("nothing to commit: call changes() first")
        self.position_file.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.position_file, {str(p): o for p, o in self._end.items()})
