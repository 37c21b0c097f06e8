"""A pipeline's topics kept as Parquet, beyond Kafka's retention: for audits of long
history, and to rebuild a target as of any sync point without Kafka.

``write_archive`` appends a run; ``read_archive`` gives every message to Spark;
``ArchivedStream`` gives them, checked whole, to a replay.
"""

from ._layout import ArchiveError, check_continuous
from ._read import ArchivedStream, archive_runs, read_archive
from ._write import ArchiveRun, write_archive

__all__ = ["ArchiveError", "ArchiveRun", "ArchivedStream", "archive_runs", "check_continuous", "read_archive",
           "write_archive"]
