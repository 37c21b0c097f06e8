"""A workload of concurrent distributed transactions, with a ground-truth log."""

from ._plan import ACCOUNTS, EVENTS, Op, Plan, ThreadPlanner, WorkloadSpec, expected_state
from ._runner import WorkloadResult, read_ground_truth, reset_tables, run_workload, setup_tables

__all__ = [
    "ACCOUNTS", "EVENTS", "Op", "Plan", "ThreadPlanner", "WorkloadSpec", "expected_state",
    "WorkloadResult", "read_ground_truth", "reset_tables", "run_workload", "setup_tables",
]
