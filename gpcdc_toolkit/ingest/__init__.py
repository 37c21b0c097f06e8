"""Reading the toolkit's Kafka topics: a plain consumer, and Spark reads."""

from ._consumer import (
    UNNUMBERED,
    EndTracker,
    end_offsets,
    first_message,
    high_watermarks,
    json_value,
    last_message,
    last_numbering,
    located,
    partitions_of,
    read_to_end,
    read_values,
)
from ._rows import COLUMNS, SCHEMA_DDL, to_row
from ._server import SparkServer, SparkServerError, SparkServerStatus

__all__ = ["UNNUMBERED", "EndTracker", "end_offsets", "first_message", "high_watermarks", "json_value", "last_message",
           "last_numbering", "located", "partitions_of", "read_to_end", "read_values", "COLUMNS", "SCHEMA_DDL", "to_row", "SparkServer",
           "SparkServerError", "SparkServerStatus"]

# The Spark parts (gpcdc_toolkit.ingest.spark) import pyspark; they are kept apart so
# that capture workers start without it.
