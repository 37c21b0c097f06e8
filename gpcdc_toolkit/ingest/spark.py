"""The Spark side of ingestion: the ``gpcdc`` data source and the notebooks' helpers."""

from ._classes import ClassArchiveError, class_archive, class_archive_options
from ._spark import (
    IncrementalRead,
    command_session,
    read_changes,
    read_coordinator,
    read_transactions,
    read_watermarks,
    register,
    spark_session,
    stream_changes,
)
from ._spark_kafka import connector_jars, parse_kafka_frame
from ._spark_source import NAME, GpcdcDataSource, KafkaRange, SourceOptionError

__all__ = [
    "ClassArchiveError", "class_archive", "class_archive_options", "IncrementalRead", "command_session",
    "read_changes", "read_coordinator", "read_transactions", "read_watermarks", "register", "spark_session",
    "stream_changes", "NAME", "GpcdcDataSource", "KafkaRange", "SourceOptionError", "connector_jars", "parse_kafka_frame",
]
