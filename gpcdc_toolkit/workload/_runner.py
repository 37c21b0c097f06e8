"""Run a workload against a cluster: threads of distributed transactions."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

from ..cluster import Cluster, DistributedTransaction, Session
from ..errors import DistributedTransactionError
from ._plan import (
    ACCOUNTS,
    DDL,
    EVENTS,
    THREAD_STRIDE,
    Plan,
    ThreadPlanner,
    WorkloadSpec,
    first_free_id,
    large_plan,
    large_rows,
)

_CHUNK = 10_000  # rows per INSERT batch of the large transaction


@dataclass
class WorkloadResult:
    committed: int = 0
    aborted: int = 0
    failed: int = 0  # aborted by an error (a conflict, a lost connection), not by plan
    one_phase: int = 0
    rows: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list, repr=False)
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        return self.committed / self.elapsed if self.elapsed else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]

    def summary(self) -> str:
        return (
            f"{self.committed} distributed transactions committed ({self.one_phase} one-phase), "
            f"{self.aborted} aborted, {self.failed} failed, {self.rows} rows in {self.elapsed:.1f} s: "
            f"{self.rate:.0f} dtx/s; latency p50 {self.percentile(50) * 1e3:.1f} ms, "
            f"p95 {self.percentile(95) * 1e3:.1f} ms, p99 {self.percentile(99) * 1e3:.1f} ms"
        )


def setup_tables(cluster: Cluster, hot_keys: int, *, legacy_markers: bool = False) -> None:
    """Create the workload's tables unless they exist, and its hot accounts."""
    with Session(cluster, legacy_markers=legacy_markers) as session, cluster.coordinator_connection() as conn:
        existing = {r[0] for r in conn.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s) AND relkind = 'r'",
                                                ([ACCOUNTS, EVENTS],))}
        for table, ddl in zip((ACCOUNTS, EVENTS), DDL):
            if table not in existing:
                session.ddl(ddl)
        if hot_keys:
            with session.transaction() as tx:
                have = {r[0] for s in range(cluster.segment_count)
                        for r in tx.execute(s, f"SELECT id FROM {ACCOUNTS} WHERE id <= %s", (hot_keys,))}
                tx.insert(ACCOUNTS, [{"id": k, "balance": 0, "note": "hot"} for k in range(1, hot_keys + 1) if k not in have])


def reset_tables(cluster: Cluster) -> None:
    """Drop the workload's tables (a distributed DDL transaction each)."""
    with Session(cluster) as session:
        for table in (ACCOUNTS, EVENTS):
            session.ddl(f"DROP TABLE IF EXISTS {table}")


def apply_plan(tx: DistributedTransaction, plan: Plan) -> int:
    """Execute a plan's writes in ``tx``; returns the number of rows written."""
    rows = 0
    for op in plan.ops:
        if op.kind == "insert":
            rows += tx.insert(op.table, [{**op.key, **op.values}])
        elif op.kind == "insert_range":
            first, count = op.key["account_id"], op.values["count"]
            batch: list[dict[str, Any]] = []
            for row in large_rows(first, count):
                batch.append(row)
                if len(batch) == _CHUNK:
                    rows += tx.insert(op.table, batch)
                    batch = []
            rows += tx.insert(op.table, batch) if batch else 0
        elif op.kind in ("update", "move"):
            rows += tx.update(op.table, op.key, op.values)
        elif op.kind == "delete":
            rows += tx.delete(op.table, op.key)
        elif op.kind == "increment":
            table = tx.session.table(op.table)
            segment = tx.route(table, op.key)
            rows += len(tx.execute(segment, f"UPDATE {ACCOUNTS} SET balance = balance + %s WHERE id = %s RETURNING 1",
                                   (op.values["balance"], op.key["id"])))
    return rows


class GroundTruthLog:
    """JSON lines, one per finished distributed transaction, in finishing order."""

    def __init__(self, path: Path | None) -> None:
        self._file: IO[str] | None = path.open("a") if path else None
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        if self._file:
            self._file.close()


def read_ground_truth(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for line in f:
            yield json.loads(line)


def run_workload(
    cluster: Cluster,
    spec: WorkloadSpec,
    *,
    ground_truth: Path | None = None,
    progress: Callable[[WorkloadResult], None] | None = None,
) -> WorkloadResult:
    """Run the workload to its duration or count and return what it did."""
    setup_tables(cluster, spec.hot_keys, legacy_markers=spec.legacy_markers)
    highest = max((r[0] for r in cluster.fetch_all(
        f"SELECT max(id) FROM {ACCOUNTS} UNION ALL SELECT max(account_id) FROM {EVENTS}") if r[0] is not None), default=None)
    # The large transaction takes the first stride; thread t the stride after it.
    first_id = first_free_id(highest)
    threads_first_id = first_id + THREAD_STRIDE if spec.large_transaction_rows else first_id
    result = WorkloadResult()
    log = GroundTruthLog(ground_truth)
    lock = threading.Lock()
    remaining = [spec.transactions]
    started = time.monotonic()
    deadline = started + spec.duration if spec.duration is not None else float("inf")
    interval = spec.threads / spec.rate if spec.rate else 0.0
    failures: list[BaseException] = []

    def take_ticket() -> bool:
        with lock:
            if remaining[0] is None:
                return True
            if remaining[0] <= 0:
                return False
            remaining[0] -= 1
            return True

    def run_one(session: Session, planner: ThreadPlanner | None, plan: Plan, thread: int) -> None:
        t0 = time.monotonic()
        tx = session.transaction()
        record: dict[str, Any] = {"gxid": tx.gxid, "thread": thread, "ops": [op.to_json() for op in plan.ops]}
        try:
            rows = apply_plan(tx, plan)
            segments = sorted(tx.touched)
            if plan.outcome == "abort":
                tx.rollback()
            elif plan.outcome == "abort_after_prepare":
                tx.prepare_and_abort()
            else:
                tx.commit()
        except (DistributedTransactionError, psycopg.Error) as e:
            if tx.state == "committed" or "is committed" in str(e):
                raise
            tx.rollback()
            with lock:
                result.failed += 1
                result.errors[type(e.__cause__ or e).__name__] += 1
            log.write({**record, "outcome": "failed"})
            return
        except BaseException:
            tx.rollback()
            raise
        elapsed = time.monotonic() - t0
        outcome = "committed" if plan.outcome == "commit" else "aborted"
        log.write({**record, "outcome": outcome, "segments": segments, "one_phase": len(segments) == 1})
        with lock:
            if outcome == "committed":
                result.committed += 1
                result.rows += rows
                result.one_phase += len(segments) == 1
                result.latencies.append(elapsed)
            else:
                result.aborted += 1
        if planner and outcome == "committed":
            planner.committed(plan)

    def worker(thread: int) -> None:
        planner = ThreadPlanner(spec, thread, cluster.segment_count, threads_first_id)
        next_start = time.monotonic()
        try:
            with Session(cluster, legacy_markers=spec.legacy_markers) as session:
                while time.monotonic() < deadline and not failures and take_ticket():
                    if interval:
                        next_start += interval
                        pause = next_start - time.monotonic()
                        if pause > 0:
                            time.sleep(pause)  # pacing to the target rate
                    run_one(session, planner, planner.next(), thread)
        except BaseException as e:  # surfaced to the caller below
            failures.append(e)

    try:
        if spec.large_transaction_rows:
            with Session(cluster, legacy_markers=spec.legacy_markers) as session:
                run_one(session, None, large_plan(first_id, spec.large_transaction_rows), -1)
        threads = [threading.Thread(target=worker, args=(i,), name=f"workload-{i}") for i in range(spec.threads)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=1.0)
            result.elapsed = time.monotonic() - started
            if progress:
                progress(result)
    finally:
        log.close()
        result.elapsed = time.monotonic() - started
    if failures:
        raise failures[0]
    return result
