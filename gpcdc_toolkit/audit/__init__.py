"""Consistency audits of a pipeline's change stream, on Spark.

``run_audit`` reads the stream (the Kafka topics, or a Parquet archive written by
:func:`gpcdc_toolkit.archive.write_archive`), applies every rule of :mod:`._rules` and the suites of
``expectations/``, and returns the findings, a summary and charts; ``gpcdc audit`` is
the same on the command line.

``_findings`` (the findings' schema, severities, thresholds) and ``_faults`` (fault
injection) are pure and imported with the package; the Spark parts load on first use.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._findings import ADVICE, FINDING_COLUMNS, FINDINGS_DDL, SEVERITIES, Thresholds, advice, at_or_above, summary_table

__getattr__ = lazy_exports(__name__, {
    "_rules": ("RULES", "Stream", "prepare", "watermark_delay"),
    "_run": ("AuditResult", "AuditState", "audit_events", "check_request", "events_frame", "latest_findings",
             "run_audit", "thresholds_of"),
    "_warm": ("warm_up",),
})

if TYPE_CHECKING:
    from ._rules import RULES, Stream, prepare, watermark_delay
    from ._run import AuditResult, AuditState, audit_events, check_request, events_frame, latest_findings, run_audit, thresholds_of
    from ._warm import warm_up

__all__ = [
    "ADVICE", "advice", "FINDING_COLUMNS", "FINDINGS_DDL", "SEVERITIES", "Thresholds", "at_or_above", "summary_table",
    "RULES", "Stream", "prepare", "watermark_delay",
    "AuditResult", "AuditState", "audit_events", "check_request", "events_frame", "latest_findings", "run_audit",
    "thresholds_of", "warm_up",
]
