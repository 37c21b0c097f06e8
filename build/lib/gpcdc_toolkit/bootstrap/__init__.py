"""Slots at a distributed-transaction-consistent point, and the initial snapshot."""

from ._bootstrap import (
    METHODS,
    BootstrapError,
    Pipeline,
    bootstrap,
    create_slots_naively,
    drop_slots,
    replication_connection,
)
from ._snapshot import InitialSnapshot, distributed_tables

__all__ = [
    "METHODS", "BootstrapError", "Pipeline", "bootstrap", "create_slots_naively", "drop_slots",
    "replication_connection", "InitialSnapshot", "distributed_tables",
]
