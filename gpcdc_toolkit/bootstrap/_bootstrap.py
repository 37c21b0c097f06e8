"""Logical replication slots on every node, at a distributed-transaction-consistent point.

Creating a slot on each node one after another is not enough: each slot starts at its
own point, so a distributed transaction that commits between two slot creations is
decoded on one segment and not on another (:func:`create_slots_naively` shows it).
Two methods avoid it:

*peaceful*: take the transaction-start lock exclusively (new distributed transactions
wait at their start), wait until no distributed transaction runs but the snapshotting
one, create every slot, release the lock. Every distributed transaction then lies
wholly before all slots or wholly after. New transactions wait for as long as the
running ones take to finish, plus the slot creations.

*snapshot*: create the slots without holding anyone back, then take a consistent cut
(the commit lock exclusively, for as long as one commit phase lasts): a distributed
snapshot (gxid xmax and the running gxids) and, per node, an exported snapshot and
its WAL position. Capture drops every part the distributed snapshot sees; those are
in the initial snapshot.

Both write the start point (``start_point.json``) and export the initial snapshot
before they let go of the exported snapshots. On any failure they drop the slots they
created; the locks go with the controller's connection.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import psycopg2
import psycopg2.extras
from psycopg import sql

from .._runtime import read_json, write_json
from ..cluster import COORDINATOR, Cluster, Node, Session
from ..errors import GpcdcError
from ..protocol import DistributedSnapshot, NodeStart, Repair, StartPoint, format_lsn, parse_lsn
from ._snapshot import distributed_tables, export_tables, write_manifest

log = logging.getLogger(__name__)
_PARALLEL_SLOTS = 16  # slots created at once: the waits overlap, the nodes are not all asked at the same moment

METHODS = ("peaceful", "snapshot")
PLUGIN = "pgoutput"


class BootstrapError(GpcdcError):
    """A bootstrap could not complete; nothing of it is left behind."""


@dataclass(frozen=True)
class Pipeline:
    """Where a capture pipeline (one topic prefix) keeps its state."""

    work_dir: Path
    prefix: str

    @property
    def slot(self) -> str:
        return "gpcdc_" + re.sub(r"[^a-z0-9_]", "_", self.prefix.lower())

    @property
    def publication(self) -> str:
        return self.slot

    @property
    def directory(self) -> Path:
        return self.work_dir / "capture" / self.prefix

    @property
    def start_point_file(self) -> Path:
        return self.directory / "start_point.json"

    @property
    def snapshot_dir(self) -> Path:
        return self.directory / "snapshot"

    @property
    def skipped_ddl_file(self) -> Path:
        """The DDL statements a replay skipped (``--skip-ddl``), one JSON line each."""
        return self.directory / "skipped_ddl.jsonl"

    @property
    def syncpoints_dir(self) -> Path:
        """Each sync point's record: the source's per-table digests as of its cut."""
        return self.directory / "syncpoints"

    @property
    def repairs_dir(self) -> Path:
        return self.directory / "repairs"

    def repair_dir(self, content: int, number: int) -> Path:
        """Where repair ``number`` of segment ``content`` keeps its record and copied rows."""
        return self.repairs_dir / f"seg{content}-{number}"

    def start_point(self) -> StartPoint:
        """The start point, with the latest repair of each repaired segment."""
        if not self.start_point_file.is_file():
            raise GpcdcError(f"no start point for pipeline {self.prefix!r} in {self.directory}",
                             fix="run `gpcdc bootstrap create --method peaceful|snapshot` first")
        latest: dict[int, Repair] = {}
        for path in self.repairs_dir.glob("seg*-*/repair.json"):
            repair = Repair.from_json(read_json(path))
            if repair.node.content not in latest or repair.number > latest[repair.node.content].number:
                latest[repair.node.content] = repair
        start = StartPoint.from_json(read_json(self.start_point_file))
        return dataclasses.replace(start, repairs=tuple(latest[c] for c in sorted(latest)))


def replication_connection(cluster: Cluster, node: Node) -> Any:
    try:
        return psycopg2.connect(cluster.dsn(node), connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                connect_timeout=10)
    except psycopg2.OperationalError as e:
        from ..errors import UnreachableError

        raise UnreachableError(f"cannot open a replication connection to {node}: {str(e).strip().splitlines()[0]}",
                               fix="check max_wal_senders and pg_hba.conf replication entries") from None


def _existing_slots(cluster: Cluster, slot: str) -> dict[int, int]:
    """content -> confirmed_flush LSN of the nodes that have the slot."""
    found = {}
    for node in cluster.nodes:
        with cluster.connect_node(node) as conn:
            row = conn.execute("SELECT confirmed_flush_lsn::text, plugin FROM pg_replication_slots WHERE slot_name = %s",
                               (slot,)).fetchone()
        if row:
            found[node.content] = parse_lsn(row[0]) if row[0] else 0
    return found


def _ensure_publications(cluster: Cluster, publication: str) -> None:
    """Each node's publication, as the cluster scopes it (``publication_scope``)."""
    for node in cluster.nodes:
        with cluster.connect_node(node) as conn:
            if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone():
                continue
            cluster.local_ddl(conn)
            conn.execute(f'CREATE PUBLICATION "{publication}" {cluster.publication_scope(node)}')


class _Slot:
    """A slot being created over a replication connection, kept open while its
    exported snapshot is in use."""

    def __init__(self, cluster: Cluster, node: Node, name: str) -> None:
        self.cluster, self.node, self.name = cluster, node, name
        self.conn = replication_connection(cluster, node)
        self.consistent_lsn = 0
        self.snapshot_name: str | None = None
        self.identity: dict[str, Any] = {}  # the server's system identifier and timeline

    def create(self, export: bool, timeout: float) -> None:
        """CREATE_REPLICATION_SLOT; it waits for every transaction holding an xid on the
        node, so it is cancelled after ``timeout`` with the reason spelled out."""
        timer = threading.Timer(timeout, self.conn.cancel)
        timer.start()
        try:
            options = [f"SNAPSHOT '{'export' if export else 'nothing'}'"]
            if self.cluster.two_phase_decoding:
                options.append("TWO_PHASE")
            with self.conn.cursor() as cur:
                cur.execute("IDENTIFY_SYSTEM")
                system_identifier, timeline, _, _ = cur.fetchone()
                cur.execute(f'CREATE_REPLICATION_SLOT "{self.name}" LOGICAL {PLUGIN} ({", ".join(options)})')
                _, lsn, snapshot, _ = cur.fetchone()
        except psycopg2.errors.QueryCanceled:
            raise BootstrapError(
                f"creating slot {self.name} on {self.node} did not finish within {timeout:g} s: it waits for "
                f"every transaction holding an xid there; {_blockers(self.cluster, self.node)}",
                fix="end or resolve those transactions (COMMIT PREPARED / ROLLBACK PREPARED an orphaned GID, "
                    "after checking the coordinator's commit record), then run the bootstrap again",
            ) from None
        except psycopg2.errors.DuplicateObject:
            raise BootstrapError(f"slot {self.name} already exists on {self.node}",
                                 fix="run `gpcdc bootstrap drop` first, or use another --kafka-topic-prefix") from None
        finally:
            timer.cancel()
        self.consistent_lsn = parse_lsn(lsn)
        self.snapshot_name = snapshot
        self.identity = {"system_identifier": str(system_identifier), "timeline": int(timeline)}

    def close(self) -> None:
        self.conn.close()


def _blockers(cluster: Cluster, node: Node) -> str:
    with cluster.connect_node(node) as conn:
        prepared = conn.execute(
            "SELECT gid, round(extract(epoch FROM now() - prepared)) FROM pg_prepared_xacts ORDER BY prepared").fetchall()
        running = conn.execute(
            "SELECT pid, backend_xid::text, left(query, 60) FROM pg_stat_activity "
            "WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() AND backend_type = 'client backend'").fetchall()
    parts = [f"prepared transaction {gid!r} (prepared {age:.0f} s ago)" for gid, age in prepared]
    parts += [f"backend {pid} holding xid {xid} ({query!r})" for pid, xid, query in running]
    return "still waiting on " + ("; ".join(parts) if parts else "transactions that ended meanwhile")


def drop_slots(cluster: Cluster, slot: str, *, publication: str | None = None) -> list[int]:
    """Drop the slot (and publication) on every node that has it; returns their contents."""
    dropped = []
    for node in cluster.nodes:
        with cluster.connect_node(node) as conn:
            active = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
            if active:
                if active[0]:
                    conn.execute("SELECT pg_terminate_backend(%s)", (active[0],))
                _drop_when_released(conn, slot)
                dropped.append(node.content)
            if publication:
                cluster.local_ddl(conn)
                conn.execute(f'DROP PUBLICATION IF EXISTS "{publication}"')
    return dropped


def _drop_when_released(conn: psycopg.Connection[Any], slot: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # the terminated walsender is still releasing the slot


@contextmanager
def _cleanup_on_failure(cluster: Cluster, slot: str, publication: str) -> Iterator[list[_Slot]]:
    slots: list[_Slot] = []
    try:
        yield slots
    except BaseException:
        for s in slots:
            s.close()
        try:
            drop_slots(cluster, slot, publication=publication)
        except Exception as e:  # report the original failure, not this one
            log.warning("could not drop slot %s after a failed bootstrap: %s", slot, e)
        raise


def bootstrap(
    cluster: Cluster,
    pipeline: Pipeline,
    method: str,
    *,
    timeout: float = 60.0,
    on_reuse: Callable[[StartPoint], None] | None = None,
    slots_created: Callable[[], None] | None = None,
) -> StartPoint:
    """Create the pipeline's slots with ``method`` and export the initial snapshot.

    If every node already has the slot and the recorded start point names them, the
    recorded start point is returned (capture resumes from the slots); slots without
    a matching record are an error. ``slots_created`` is called once every slot
    exists and before the start point is fixed (the snapshot method's cut); writers
    may run meanwhile.
    """
    if method not in METHODS:
        raise BootstrapError(f"unknown bootstrap method {method!r}", fix=f"use one of {', '.join(METHODS)}")
    if method not in cluster.bootstrap_methods:
        raise BootstrapError(f"a {cluster.kind} cluster has no gate that holds distributed transactions at their "
                             f"start, which the {method} method needs",
                             fix=f"use --method {' or '.join(cluster.bootstrap_methods)}")
    if not 0 < timeout < math.inf:
        raise BootstrapError(f"the timeout must be a positive number of seconds, not {timeout}",
                             fix="give --timeout in seconds, e.g. 60")
    cluster.check_source()
    existing = _existing_slots(cluster, pipeline.slot)
    if existing:
        return _reuse(cluster, pipeline, existing, on_reuse)
    orphans = cluster.unowned_prepared()  # before anything is created: a refusal leaves nothing behind
    if orphans:
        raise BootstrapError(
            f"orphaned prepared transactions would hold slot creation back forever: {', '.join(orphans)}",
            fix="COMMIT PREPARED or ROLLBACK PREPARED each on its node (commit only when the coordinator's "
                "commit record for its gxid exists), then run the bootstrap again",
        )
    created_directory = not pipeline.directory.exists()
    pipeline.directory.mkdir(parents=True, exist_ok=True)
    try:
        with _cleanup_on_failure(cluster, pipeline.slot, pipeline.publication) as slots:
            _ensure_publications(cluster, pipeline.publication)
            if method == "peaceful":
                start = _peaceful(cluster, pipeline, slots, timeout)
            else:
                start = _snapshot_filter(cluster, pipeline, slots, timeout, slots_created)
            write_json(pipeline.start_point_file, start.to_json())
    except BaseException:
        if created_directory:  # a partial snapshot is worth nothing
            shutil.rmtree(pipeline.directory, ignore_errors=True)
        raise
    return start


def _reuse(cluster: Cluster, pipeline: Pipeline, existing: dict[int, int],
           on_reuse: Callable[[StartPoint], None] | None) -> StartPoint:
    contents = sorted(n.content for n in cluster.nodes)
    try:
        start = pipeline.start_point()
    except GpcdcError:
        start = None
    if start is None or sorted(existing) != contents or [n.content for n in start.captured_nodes] != contents:
        where = ", ".join("coordinator" if c == COORDINATOR else f"segment {c}" for c in sorted(existing))
        raise BootstrapError(
            f"slot {pipeline.slot} exists on {where}, but "
            + ("no start point records it" if start is None else "it does not match the recorded start point"),
            fix="run `gpcdc bootstrap drop` to remove it, or use another --kafka-topic-prefix",
        )
    if on_reuse:
        on_reuse(start)
    return start


def _open_slots(cluster: Cluster, pipeline: Pipeline, slots: list[_Slot]) -> None:
    """A replication connection per node, each listed for the clean-up as it opens."""
    for node in cluster.nodes:
        slots.append(_Slot(cluster, node, pipeline.slot))


def _create_all(slots: list[_Slot], export: bool, timeout: float) -> None:
    """Create every slot at once: each waits for the transactions holding an xid on its
    node, and one after the other the waits (and the peaceful method's window, in which
    no transaction may begin) would add up with the segments."""
    with ThreadPoolExecutor(max_workers=min(_PARALLEL_SLOTS, len(slots))) as pool:
        creating = {pool.submit(s.create, export, timeout): s for s in slots}
        try:
            for done in as_completed(creating):
                done.result()
        except BaseException:
            # The first failure stops the others (the clean-up drops what was made):
            # those not begun are not, those waiting are cancelled on their servers.
            for future, slot in creating.items():
                if not future.cancel() and not future.done():
                    slot.conn.cancel()
            raise


def _export_initial_snapshot(cluster: Cluster, pipeline: Pipeline, snapshots: dict[int, str],
                             positions: dict[int, int]) -> None:
    tables = distributed_tables(cluster)
    manifest: dict[str, Any] = {"tables": {}, "positions": {str(c): format_lsn(p) for c, p in positions.items()}}
    with ExitStack() as stack:
        for node in cluster.segments:
            conn = stack.enter_context(cluster.connect_node(node, autocommit=False))
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshots[node.content])))
            export_tables(conn, node.content, [(t, cluster.relation(node, t)) for t in tables], pipeline.snapshot_dir,
                          manifest)
            conn.rollback()
    write_manifest(pipeline.snapshot_dir, manifest)


def _set_lock_timeout(conn: psycopg.Connection[Any], seconds: float) -> None:
    conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(seconds * 1000)}ms",))


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _peaceful(cluster: Cluster, pipeline: Pipeline, slots: list[_Slot], timeout: float) -> StartPoint:
    with Session(cluster) as session, cluster.coordinator_connection() as controller:
        snapshotting = session.transaction()  # it runs through the lock window; it writes nothing
        try:
            _open_slots(cluster, pipeline, slots)  # before the window: writers need not wait for it
            _set_lock_timeout(controller, timeout)
            locked_at = time.monotonic()
            controller.execute("SELECT gp_acquire_transaction_start_lock()")
            try:
                controller.execute("SELECT gp_wait_running_transaction_end(%s, %s)", (snapshotting.gxid, timeout))
            except psycopg.errors.RaiseException as e:
                raise BootstrapError(f"peaceful bootstrap: {e.diag.message_primary}",
                                     fix="wait for those transactions to end, raise --timeout, or use --method snapshot") from None
            _create_all(slots, export=True, timeout=timeout)
            # Nothing ran or started since the wait: every gxid below xmax is wholly
            # before the slots, every later one wholly after.
            xmax = controller.execute("SELECT gp_dist.next_gxid()").fetchone()[0]  # type: ignore[index]
            controller.execute("SELECT gp_release_transaction_start_lock()")
            window_ms = (time.monotonic() - locked_at) * 1000
        finally:
            snapshotting.rollback()
    snapshots = {s.node.content: s.snapshot_name for s in slots}
    _export_initial_snapshot(cluster, pipeline, snapshots, {s.node.content: s.consistent_lsn for s in slots})  # type: ignore[arg-type]
    for s in slots:
        s.close()
    return StartPoint(
        method="peaceful", created_at=_now(), lock_window_ms=round(window_ms, 1), publication=pipeline.publication,
        snapshot=DistributedSnapshot(int(xmax), frozenset({snapshotting.gxid})),
        nodes=tuple(NodeStart(s.node.content, s.name, s.consistent_lsn, s.consistent_lsn, s.snapshot_name, **s.identity)
                    for s in slots),
    )


def _snapshot_filter(cluster: Cluster, pipeline: Pipeline, slots: list[_Slot], timeout: float,
                     slots_created: Callable[[], None] | None) -> StartPoint:
    _open_slots(cluster, pipeline, slots)
    _create_all(slots, export=False, timeout=timeout)
    for s in slots:
        s.close()
    if slots_created:
        slots_created()
    with ExitStack() as stack:
        controller = stack.enter_context(cluster.coordinator_connection())
        holders = {node.content: stack.enter_context(cluster.connect_node(node, autocommit=False)) for node in cluster.nodes}
        cut_started = time.monotonic()
        with cluster.commit_pause(controller, timeout) as snapshot:
            # Pin each node's snapshot, its WAL position, and what the snapshot sees.
            exported: dict[int, tuple[str, int, str]] = {}
            for content, conn in holders.items():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                name, lsn, visible = conn.execute(  # type: ignore[misc]
                    "SELECT pg_export_snapshot(), pg_current_wal_lsn()::text, pg_current_snapshot()::text").fetchone()
                exported[content] = (name, parse_lsn(lsn), visible)
        cut_ms = (time.monotonic() - cut_started) * 1000
        _export_initial_snapshot(cluster, pipeline, {c: e[0] for c, e in exported.items()},
                                 {c: e[1] for c, e in exported.items()})
    return StartPoint(
        method="snapshot", created_at=_now(), publication=pipeline.publication, snapshot=snapshot,
        nodes=tuple(NodeStart(s.node.content, s.name, s.consistent_lsn, exported[s.node.content][1],
                              exported[s.node.content][0], exported[s.node.content][2], **s.identity)
                    for s in slots),
        extra={"cut_ms": round(cut_ms, 1)},
    )


def create_slots_naively(cluster: Cluster, pipeline: Pipeline,
                         between: Callable[[Node], None] | None = None) -> dict[int, int]:
    """Create the slots one node after another with no coordination (unsafe).

    For comparison only: a distributed transaction that commits between two slot
    creations is decoded on some of its segments and not on others. ``between`` is
    called after each slot, to schedule such a transaction. Returns each node's
    consistent LSN.
    """
    _ensure_publications(cluster, pipeline.publication)
    lsns = {}
    with _cleanup_on_failure(cluster, pipeline.slot, pipeline.publication) as slots:
        for node in cluster.nodes:
            slot = _Slot(cluster, node, pipeline.slot)
            slots.append(slot)
            slot.create(export=False, timeout=60)
            slot.close()
            lsns[node.content] = slot.consistent_lsn
            if between:
                between(node)
    return lsns
