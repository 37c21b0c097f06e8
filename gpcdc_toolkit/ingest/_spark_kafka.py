"""Spark's own Kafka source (``format("kafka")``, in the JVM) as a second way in.

Its rows (topic, partition, offset, timestamp, key, value) go through the same parsing
as the ``gpcdc`` source's (:func:`._rows.to_row`, applied to whole Arrow batches with
``mapInArrow``), so both give the same DataFrame. The connector's jars, matching the
installed Spark, come from Maven Central through the toolkit's resolver, less those
Spark ships already.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .._maven import resolve
from ._rows import SCHEMA_DDL

_VERSION_SUFFIX = re.compile(r"-\d[^-]*(-\d+)?\.jar$")


def _artifact(jar: str) -> str:
    """A jar file's name without its version: ``zstd-jni-1.5.6-10.jar`` -> ``zstd-jni``."""
    return _VERSION_SUFFIX.sub("", jar)


def connector_jars() -> list[Path]:
    """The jars of ``spark-sql-kafka-0-10`` for the installed Spark that Spark lacks."""
    import pyspark

    version = pyspark.__version__
    jars = resolve(f"spark-sql-kafka-{version}", [f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"])
    bundled = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [jar for jar in jars if _artifact(jar.name) not in bundled]


def _offsets(topic: str, offsets: Mapping[int, int]) -> str:
    return json.dumps({topic: {str(p): int(o) for p, o in offsets.items()}})


def kafka_options(servers: str, topic: str, *, starting_offsets: Mapping[int, int],
                  ending_offsets: Mapping[int, int] | None = None, max_offsets_per_trigger: int | None = None,
                  max_records_per_partition: int) -> dict[str, str]:
    """Spark Kafka source options for offsets planned for every partition. A Kafka
    partition's range is split into Spark partitions of ``max_records_per_partition``
    offsets, as the gpcdc source splits it: without, a topic of 3 partitions would be
    read by 3 tasks, whatever the cores."""
    options = {"kafka.bootstrap.servers": servers, "subscribe": topic,
               "startingOffsets": _offsets(topic, starting_offsets), "includeHeaders": "false",
               "maxRecordsPerPartition": str(max_records_per_partition)}
    if ending_offsets is not None:
        options["endingOffsets"] = _offsets(topic, ending_offsets)
    if max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    return options


def _parse_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """Spark's Kafka rows, batch by batch, as the toolkit's rows (runs on executors)."""
    import pyarrow.compute as pc

    from ._rows import arrow_schema, collector_paused, to_arrow, to_row

    schema = arrow_schema()
    for batch in batches:
        with collector_paused():
            millis = pc.divide(batch.column("timestamp").cast("int64"), 1000).to_pylist()
            rows = [to_row(topic, partition, offset, ms, key, value) for topic, partition, offset, ms, key, value in zip(
                batch.column("topic").to_pylist(), batch.column("partition").to_pylist(),
                batch.column("offset").to_pylist(), millis, batch.column("key").to_pylist(),
                batch.column("value").to_pylist())]
            parsed = to_arrow(rows, schema)
        yield parsed


def parse_kafka_frame(df: Any) -> Any:
    """A DataFrame of Spark's Kafka source (batch or streaming) in the toolkit's schema."""
    return df.select("topic", "partition", "offset", "timestamp", "key", "value").mapInArrow(_parse_batches, SCHEMA_DDL)
