"""Run a workload against a cluster: threads of distributed transactions."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

from ..cluster import Cluster, DistributedTransaction, Session, resolve_in_doubt
from ..errors import ClusterError, DistributedTransactionError, UnreachableError
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

log = logging.getLogger(__name__)

_CHUNK = 10_000  # rows per INSERT batch of the large transaction


@dataclass
class WorkloadResult:
    committed: int = 0
    aborted: int = 0
    failed: int = 0  # aborted by an error (a conflict, a lost connection), not by plan
    in_doubt: int = 0  # a connection lost at the moment of the decision: committed or not
    reconnects: int = 0  # times a thread found the coordinator unreachable and waited
    one_phase: int = 0
    rows: int = 0  # row changes, a row moved to another segment counting two (see apply_plan)
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
            f"{self.aborted} aborted, {self.failed} failed, {self.in_doubt} in doubt, {self.rows} row changes in {self.elapsed:.1f} s: "
            f"{self.rate:.0f} dtx/s; latency p50 {self.percentile(50) * 1e3:.1f} ms, "
            f"p95 {self.percentile(95) * 1e3:.1f} ms, p99 {self.percentile(99) * 1e3:.1f} ms"
        )


def setup_tables(cluster: Cluster, hot_keys: int, *, legacy_markers: bool = False) -> None:
    """Create the workload's tables unless they exist, and its hot accounts (a
    transaction only when some are missing: the stream carries no empty one of ours)."""
    with Session(cluster, legacy_markers=legacy_markers) as session, cluster.coordinator_connection() as conn:
        existing = {r[0] for r in conn.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s) AND relkind = 'r'",
                                                ([ACCOUNTS, EVENTS],))}
        for table, ddl in zip((ACCOUNTS, EVENTS), DDL):
            if table not in existing:
                session.ddl(ddl)
        have = {r[0] for r in cluster.fetch_all(f"SELECT id FROM {ACCOUNTS} WHERE id <= %s", (hot_keys,))} if hot_keys else set()
        missing = [{"id": k, "balance": 0, "note": "hot"} for k in range(1, hot_keys + 1) if k not in have]
        if missing:
            with session.transaction() as tx:
                tx.insert(ACCOUNTS, missing)


def reset_tables(cluster: Cluster) -> None:
    """Drop the workload's tables (a distributed DDL transaction each)."""
    with Session(cluster) as session:
        for table in (ACCOUNTS, EVENTS):
            session.ddl(f"DROP TABLE IF EXISTS {table}")


def apply_plan(tx: DistributedTransaction, plan: Plan) -> int:
    """Execute a plan's writes in ``tx``; returns the row changes made, as the segments
    log them (and capture carries them): a row moved to another segment is two, its
    delete there and its insert here."""
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
            updated = tx.update(op.table, op.key, op.values)
            table = tx.session.table(op.table)
            moved = tx.moves(table, op.key, {c: op.values.get(c, op.key[c]) for c in table.distribution_key})
            rows += 2 * updated if moved else updated
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
    stop: threading.Event | None = None,
) -> WorkloadResult:
    """Run the workload to its duration or count, or until ``stop`` is set, and return
    what it did.

    A lost connection (a node restarted) ends the transaction it was in, which the log
    records as failed or, when it went at the moment of the decision, in doubt; the
    thread then starts afresh, waiting for the coordinator while it cannot be reached.
    """
    setup_tables(cluster, spec.hot_keys, legacy_markers=spec.legacy_markers)
    highest = max((r[0] for r in cluster.fetch_all(
        f"SELECT max(id) FROM {ACCOUNTS} UNION ALL SELECT max(account_id) FROM {EVENTS}") if r[0] is not None), default=None)
    # The large transaction takes the first stride; thread t the stride after it.
    first_id = first_free_id(highest)
    threads_first_id = first_id + THREAD_STRIDE if spec.large_transaction_rows else first_id
    result = WorkloadResult()
    truth = GroundTruthLog(ground_truth)
    lock = threading.Lock()
    remaining = [spec.transactions]
    started = time.monotonic()
    deadline = started + spec.duration if spec.duration is not None else float("inf")
    interval = spec.threads / spec.rate if spec.rate else 0.0
    failures: list[BaseException] = []
    ended = stop or threading.Event()

    def running() -> bool:
        return time.monotonic() < deadline and not failures and not ended.is_set()

    def take_ticket() -> bool:
        with lock:
            if remaining[0] is None:
                return True
            if remaining[0] <= 0:
                return False
            remaining[0] -= 1
            return True

    def begin(session: Session) -> DistributedTransaction | None:
        """A new distributed transaction, once the coordinator answers; None if the run
        ends first."""
        pause = 0.05
        while running():
            try:
                return session.transaction()
            except (UnreachableError, psycopg.OperationalError):
                session.close()
                with lock:
                    result.reconnects += 1
                ended.wait(min(pause, max(0.0, deadline - time.monotonic())))  # the coordinator is restarting
                pause = min(pause * 2, 1.0)
        return None

    unsettled = threading.Event()  # prepared parts may have lost their transaction

    def settle() -> None:
        """Finish prepared parts that lost their transaction, as Greenplum's coordinator
        does on recovery (until then they hold their rows' locks). While a node is away
        it is asked again: by the next thread to begin, and about once a second by the
        main thread, since every thread may be waiting behind those locks."""
        unsettled.clear()
        try:
            # On the nodes the coordinator lists now: a mirror may have taken a failed
            # primary's place, with the parts it had prepared.
            resolve_in_doubt(type(cluster).connect(cluster.coordinator_dsn))
        except (ClusterError, psycopg.Error):
            unsettled.set()

    def run_one(session: Session, tx: DistributedTransaction, planner: ThreadPlanner | None, plan: Plan,
                thread: int) -> None:
        """Run ``plan`` in ``tx`` and log it; an error that ended it leaves the parts it
        may have left prepared to be settled."""
        t0 = time.monotonic()
        record: dict[str, Any] = {"gxid": tx.gxid, "thread": thread, "ops": [op.to_json() for op in plan.ops]}
        rows = 0
        try:
            rows = apply_plan(tx, plan)
            if plan.outcome == "abort":
                tx.rollback()
            elif plan.outcome == "abort_after_prepare":
                tx.prepare_and_abort()
            else:
                tx.commit()
            outcome = "committed" if plan.outcome == "commit" else "aborted"
        except (DistributedTransactionError, UnreachableError, psycopg.Error) as e:
            unsettled.set()
            if tx.state == "active":
                with contextlib.suppress(psycopg.Error):
                    tx.rollback()
            # committed: the record is durable, a part's COMMIT PREPARED failed (the
            # recovery finishes it); in_doubt: the connection went at the decision.
            outcome = {"committed": "committed", "in_doubt": "in_doubt"}.get(tx.state, "failed")
            session.close()  # which of its connections survived is not worth guessing
            with lock:
                result.errors[type(e.__cause__ or e).__name__] += 1
                result.failed += outcome == "failed"
                result.in_doubt += outcome == "in_doubt"
        except BaseException:
            tx.rollback()
            raise
        segments = sorted(tx.touched)
        if outcome == "failed":
            truth.write({**record, "outcome": outcome})
            return
        truth.write({**record, "outcome": outcome, "segments": segments, "one_phase": len(segments) == 1})
        with lock:
            if outcome == "committed":
                result.committed += 1
                result.rows += rows
                result.one_phase += len(segments) == 1
                result.latencies.append(time.monotonic() - t0)
            elif outcome == "aborted":
                result.aborted += 1
        if planner and outcome == "committed":
            planner.committed(plan)

    def worker(thread: int) -> None:
        planner = ThreadPlanner(spec, thread, cluster.segment_count, threads_first_id)
        next_start = time.monotonic()
        try:
            with Session(cluster, legacy_markers=spec.legacy_markers) as session:
                while running() and take_ticket():
                    if interval:
                        next_start += interval
                        pause = next_start - time.monotonic()
                        if pause > 0:
                            ended.wait(pause)  # pacing to the target rate
                    if unsettled.is_set():
                        settle()
                    tx = begin(session)
                    if tx is None:
                        break
                    run_one(session, tx, planner, planner.next(), thread)
        except BaseException as e:  # surfaced to the caller below
            failures.append(e)

    try:
        if spec.large_transaction_rows:
            with Session(cluster, legacy_markers=spec.legacy_markers) as session:
                tx = begin(session)
                if tx is not None:
                    run_one(session, tx, None, large_plan(first_id, spec.large_transaction_rows), -1)
        threads = [threading.Thread(target=worker, args=(i,), name=f"workload-{i}") for i in range(spec.threads)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=1.0)
            if unsettled.is_set():
                settle()
            result.elapsed = time.monotonic() - started
            if progress:
                progress(result)
        give_up = time.monotonic() + 60
        while unsettled.is_set() and time.monotonic() < give_up:
            settle()
            if unsettled.is_set():
                threading.Event().wait(0.5)  # a node is still away
        if unsettled.is_set():
            log.warning("prepared parts may be left behind: run gpcdc_toolkit.cluster.resolve_in_doubt")
    finally:
        truth.close()
        result.elapsed = time.monotonic() - started
    if failures:
        raise failures[0]
    return result
