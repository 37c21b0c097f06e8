"""Checks that data is what it should be: a target against its source, a cluster
against a workload's ground truth, captured topics against that ground truth.

``_diff`` (row sets compared, differences counted and quoted) and ``_chunks`` (a key
space's chunks and their bisection) are the pure core, imported with the package; the
modules that read clusters and topics load on first use."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._diff import TableDiff, diff_by_key, diff_rows

__getattr__ = lazy_exports(__name__, {
    "_capture": ("CaptureCheck", "Captured", "check_against_truth", "read_captured"),
    "_checksum": ("ChecksumResult", "ValidationError", "compare_checksums"),
    "_recorded": ("SyncPointCheck", "SyncPointRecord", "check_against_syncpoint", "load_record", "record_syncpoint"),
    "_run": ("Validation", "latest_differences", "validate"),
    "_snapshots": ("Snapshots",),
    "_syncpoint": ("SyncPoint", "SyncPointError", "take_syncpoint"),
    "_tables": ("check_workload", "compare_tables", "table_rows"),
})

if TYPE_CHECKING:
    from ._capture import CaptureCheck, Captured, check_against_truth, read_captured
    from ._checksum import ChecksumResult, ValidationError, compare_checksums
    from ._recorded import SyncPointCheck, SyncPointRecord, check_against_syncpoint, load_record, record_syncpoint
    from ._run import Validation, latest_differences, validate
    from ._snapshots import Snapshots
    from ._syncpoint import SyncPoint, SyncPointError, take_syncpoint
    from ._tables import check_workload, compare_tables, table_rows

__all__ = [
    "TableDiff", "diff_by_key", "diff_rows",
    "check_workload", "compare_tables", "table_rows",
    "CaptureCheck", "Captured", "check_against_truth", "read_captured",
    "ChecksumResult", "ValidationError", "compare_checksums",
    "SyncPointCheck", "SyncPointRecord", "check_against_syncpoint", "load_record", "record_syncpoint",
    "Validation", "latest_differences", "validate", "Snapshots", "SyncPoint", "SyncPointError", "take_syncpoint",
]
