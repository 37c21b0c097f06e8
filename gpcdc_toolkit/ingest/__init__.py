"""Reading the toolkit's Kafka topics."""

from ._consumer import partitions_of, read_to_end, read_values

__all__ = ["partitions_of", "read_to_end", "read_values"]
