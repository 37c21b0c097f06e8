"""Consistency audits of a pipeline's change stream, on Spark.

``run_audit`` reads the stream (the Kafka topics, or a Parquet archive written by
``write_archive``), applies every rule of :mod:`._rules` and returns the findings, a
summary and charts; ``gpcdc audit`` is the same on the command line.
"""

from ._archive import ArchiveError, ArchiveRun, read_archive, write_archive
from ._findings import FINDING_COLUMNS, FINDINGS_DDL, SEVERITIES, Thresholds, at_or_above, summary_table
from ._rules import RULES, Stream, prepare, watermark_delay
from ._run import AuditResult, AuditState, audit_events, events_frame, run_audit, thresholds_of

__all__ = [
    "ArchiveError", "ArchiveRun", "read_archive", "write_archive",
    "FINDING_COLUMNS", "FINDINGS_DDL", "SEVERITIES", "at_or_above", "summary_table",
    "RULES", "Stream", "Thresholds", "prepare", "watermark_delay",
    "AuditResult", "AuditState", "audit_events", "events_frame", "run_audit", "thresholds_of",
]
