"""Applying whole distributed transactions to a target cluster, exactly once.

Each source distributed transaction becomes one target distributed transaction, rows
re-routed by the target's own distribution (so the segment counts may differ). The
source gxid is recorded in ``gpcdc_replay_applied`` inside that same transaction, so a
transaction is either applied and recorded, or neither; one already recorded is
skipped. DDL runs through the target's DDL path; its record follows in a second
transaction, and a statement found already in effect (after a crash between the two)
counts as applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from ..cluster import Cluster, DistributedTransaction, Session, segment_for
from ..errors import GpcdcError
from ..protocol import UNCHANGED_TOAST
from ._order import Whole

APPLIED = "gpcdc_replay_applied"
_APPLIED_DDL = f"CREATE TABLE {APPLIED} (gxid bigint PRIMARY KEY, parts int NOT NULL) DISTRIBUTED BY (gxid)"


class ApplyError(GpcdcError):
    """A transaction could not be applied; nothing of it was."""


@dataclass
class ApplyStats:
    transactions: int = 0
    rows: int = 0
    skipped: int = 0
    ddl: int = 0


class Applier:
    def __init__(self, target: Cluster) -> None:
        self.target = target
        self.session = Session(target)
        self.stats = ApplyStats()
        with target.coordinator_connection() as conn:
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (APPLIED,)).fetchone()[0]  # type: ignore[index]
        if not exists:
            self.session.ddl(_APPLIED_DDL)

    def close(self) -> None:
        self.session.close()

    def _applied(self, tx: DistributedTransaction, gxid: int) -> bool:
        segment = segment_for([gxid], self.target.segment_count)
        return bool(tx.execute(segment, f"SELECT 1 FROM {APPLIED} WHERE gxid = %s", (gxid,)))

    def apply(self, whole: Whole) -> bool:
        """Apply one transaction; False when it had been applied already."""
        if whole.record is not None and whole.record.ddl:
            return self._apply_ddl(whole)
        with self.session.transaction() as tx:
            if self._applied(tx, whole.gxid):
                self.stats.skipped += 1
                return False
            for part in whole.parts:
                for event in part.payload or ():
                    self.stats.rows += self._apply_row(tx, event)
            tx.insert(APPLIED, [{"gxid": whole.gxid, "parts": len(whole.parts)}])
        self.stats.transactions += 1
        return True

    def _apply_ddl(self, whole: Whole) -> bool:
        with self.session.transaction() as tx:
            done = self._applied(tx, whole.gxid)
        if done:
            self.stats.skipped += 1
            return False
        for statement in whole.record.ddl:  # type: ignore[union-attr]
            try:
                self.session.ddl(statement)
            except (psycopg.errors.DuplicateTable, psycopg.errors.DuplicateColumn, psycopg.errors.UndefinedTable):
                pass  # already in effect: applied before a crash, its record not yet written
        with self.session.transaction() as tx:
            tx.insert(APPLIED, [{"gxid": whole.gxid, "parts": len(whole.parts)}])
        self.stats.ddl += 1
        self.stats.transactions += 1
        return True

    def _apply_row(self, tx: DistributedTransaction, event: Mapping[str, Any]) -> int:
        source = event["source"]
        table = f"{source['schema']}.{source['table']}"
        op = event["op"]
        info = self.session.table(table)
        key_columns = info.primary_key or info.columns
        if op == "c":
            return tx.insert(table, [event["after"]])
        if op == "u":
            values = {c: v for c, v in event["after"].items() if v != UNCHANGED_TOAST}
            old = event["before"] or event["after"]
            return tx.update(table, {c: old[c] for c in key_columns}, values)
        if op == "d":
            return tx.delete(table, {c: event["before"][c] for c in key_columns})
        raise ApplyError(f"cannot replay operation {op!r} on {table} (gxid {source.get('gxid')})",
                         fix="replay TRUNCATE by hand on the target")


def apply_all(applier: Applier, wholes: Iterable[Whole]) -> ApplyStats:
    for whole in wholes:
        applier.apply(whole)
    return applier.stats
