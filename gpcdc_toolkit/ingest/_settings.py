"""The Spark settings of every session the toolkit starts: a local one, or the Spark
Connect server's."""

from __future__ import annotations

SESSION_SETTINGS: dict[str, str | bool | float | int | None] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    # An audit's plans generate about 370 classes. Spark's cache holds 100 by default, so
    # each audit evicted the last one's and compiled them all again, and the JIT after it.
    "spark.sql.codegen.cache.maxEntries": "2000",
    # When on, every call of a PySpark function makes four more calls into the JVM to
    # record the caller's line for error messages: a quarter of the time an audit spends
    # building its rules' DataFrames.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}
