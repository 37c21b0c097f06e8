"""Distributed transactions over a cluster's nodes.

A :class:`Session` holds one connection per node (opened on first use) and runs one
distributed transaction at a time; use one session per thread. The protocol of a
distributed transaction, as Greenplum runs it:

1. ``gp_dist.dtx_begin()`` on the coordinator: pass the transaction-start lock, take
   a gxid, mark the transaction running, and read how many segments rows are routed
   over;
2. on each segment at first touch: ``BEGIN`` and the gxid marker, then the writes;
3. commit: one segment touched: the one-phase marker and ``COMMIT``. Several:
   ``PREPARE TRANSACTION`` on each, the coordinator's commit record, then
   ``COMMIT PREPARED`` on each. The commit phase holds the commit lock shared;
4. ``gp_dist.dtx_end()`` on the coordinator releases the transaction's locks.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..errors import ClusterError, DistributedTransactionError, GpcdcError, SyncPointError, UnreachableError
from ..protocol import COORDINATOR, DdlError, parse_create_table, parse_lsn
from ..protocol import _markers as markers
from ._cluster import READ_AS_PRINTED, Cluster, Node, Table, TableRef
from ._routing import segment_for
from ._writes import Statement, Writes

log = logging.getLogger(__name__)

_DDL_LOCK_WAIT = "500ms"

COMMIT_LOCK = 1196450636  # 'GPcL', key 1 of the controller's commit lock (see controller.sql)
START_LOCK = 1196454761  # 'GPsi', key 1 of its transaction-start lock


def syncpoint_lock(pipeline: str, gxid: int) -> tuple[int, int]:
    """The keys of a sync point's lock on its target: a validator holds it from before
    the cut; the replayer, having applied the sync point, waits for it. Key 1 is named
    by the pipeline, since two pipelines' gxids meet; key 2 by the gxid (its low 31
    bits: a Citus sync point's gxid is wider than the key, and only the few sync points
    of one pipeline in flight at once need telling apart)."""
    digest = hashlib.blake2b(f"gpcdc.syncpoint {pipeline}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF, gxid & 0x7FFFFFFF

_GID_PREFIX = "gpcdc_"


def gid(gxid: int) -> str:
    """The GID under which a segment prepares its part of a distributed transaction."""
    return f"{_GID_PREFIX}{gxid}"


def gxid_of(name: str) -> int | None:
    """The gxid of a prepared part's GID; None for a GID the toolkit did not give."""
    digits = name.removeprefix(_GID_PREFIX)
    return int(digits) if digits != name and digits.isascii() and digits.isdigit() else None


def _emit(marker: markers.Marker) -> sql.Composed:
    prefix, content = markers.encode(marker)
    return sql.SQL("SELECT pg_logical_emit_message(true, {}, {})").format(sql.Literal(prefix), sql.Literal(content))


class Session:
    """One connection per node, for running distributed transactions one at a time."""

    def __init__(self, cluster: Cluster, *, legacy_markers: bool = False) -> None:
        self.cluster = cluster
        self.legacy_markers = legacy_markers
        self._connections: dict[int, psycopg.Connection[Any]] = {}
        self._tables: dict[TableRef, Table] = {}

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    def connection(self, content: int) -> psycopg.Connection[Any]:
        conn = self._connections.get(content)
        if conn is None or conn.closed:
            node = self.cluster.coordinator if content == COORDINATOR else self.cluster.segments[content]
            conn = self._connections[content] = self.cluster.connect_node(node)
            conn.execute(READ_AS_PRINTED)
        return conn

    def table(self, name: TableRef) -> Table:
        """A table's catalog entry, cached until this session runs DDL (see :data:`TableRef`)."""
        if name not in self._tables:
            self._tables[name] = self.cluster.table(name)
        return self._tables[name]

    def home(self, values: Sequence[object]) -> int:
        """The segment that stores rows with these distribution-key values."""
        return segment_for(values, self.cluster.segment_count)

    def transaction(self) -> DistributedTransaction:
        """Start a distributed transaction; commit it with ``with`` or :meth:`commit`.

        Rows are routed over the segments the catalog lists when it starts: a cluster
        expanded since this session's was found is found again (see ``dtx_begin``)."""
        try:
            gxid, segments = self.connection(COORDINATOR).execute(  # type: ignore[misc]
                "SELECT gxid, segments FROM gp_dist.dtx_begin()").fetchone()
        except psycopg.errors.UndefinedColumn:
            raise ClusterError(f"{self.cluster.coordinator} has the controller functions of an earlier version "
                               "(gp_dist.dtx_begin returns no segment count)",
                               fix="create the sandbox again (`gpcdc sandbox down --name <name> --remove`, then "
                                   "`gpcdc sandbox up`)") from None
        if segments != self.cluster.segment_count:
            self.cluster = type(self.cluster).connect(self.cluster.coordinator_dsn)
        return DistributedTransaction(self, int(gxid))

    def ddl(self, statement: str, *, timeout: float = 60.0,
            then: Callable[[Writes], object] | None = None) -> int:
        """Run a DDL statement on the coordinator and every segment as one distributed
        transaction, with a DDL record on the coordinator. Returns the gxid.

        ``CREATE TABLE`` takes Greenplum's ``DISTRIBUTED BY (columns)`` clause. ``then``
        writes more in the same transaction (it commits with the statement or not at all).
        """
        try:
            create = parse_create_table(statement)
        except DdlError as e:
            raise GpcdcError(str(e)) from None
        dispatched = create.statement if create else statement
        deadline = time.monotonic() + timeout
        backoff = 0.05
        while True:
            tx = self.transaction()
            try:
                for segment in range(self.cluster.segment_count):
                    # Each segment grants its table lock on its own, so a DDL waiting on
                    # one segment while holding another could close a cycle with a
                    # transaction spanning both, which no server would see. Waiting
                    # briefly and starting over breaks any such cycle.
                    tx.execute(segment, sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(_DDL_LOCK_WAIT)))
                    tx.execute(segment, dispatched)
                if then is not None:
                    then(tx)
                break
            except psycopg.errors.LockNotAvailable:
                tx.rollback()
                if time.monotonic() > deadline:
                    raise DistributedTransactionError(
                        f"DDL could not lock its table on every segment within {timeout:g} s: {statement[:80]}",
                        fix="retry when the tables are less busy, or raise the timeout") from None
                time.sleep(backoff)  # backoff before retrying the DDL
                backoff = min(backoff * 2, 1.0)
            except BaseException:
                tx.rollback()
                raise
        tx.coordinator_work = [sql.SQL(dispatched), _emit(markers.DdlRecord(tx.gxid, statement))]
        if create:
            tx.coordinator_work.append(
                sql.SQL("SELECT gp_dist.set_distribution_policy({}, {})").format(
                    sql.Literal(create.table), sql.Literal(list(create.distribution_key))
                )
            )
        tx.coordinator_work.append(
            sql.SQL("DELETE FROM gp_dist.gp_distribution_policy WHERE localoid NOT IN (SELECT oid FROM pg_class)")
        )
        try:
            tx.commit()
        except DistributedTransactionError as e:
            refused = e.__cause__
            if isinstance(refused, psycopg.errors.RaiseException):
                # The catalog refused the statement; nothing was committed anywhere.
                raise GpcdcError(refused.diag.message_primary or str(refused), fix=refused.diag.message_hint) from None
            raise
        finally:
            self._tables.clear()
        return tx.gxid


class DistributedTransaction(Writes):
    """Writes routed to segments by distribution key, committed atomically."""

    session: Session

    def __init__(self, session: Session, gxid: int) -> None:
        self.session = session
        self.gxid = gxid
        # The session that marks the gxid running. Never another: once it is lost, a
        # consistent cut may already have taken the gxid for finished, so it must not
        # commit (a commit record from a new session would be a transaction seen late).
        self.coordinator = session.connection(COORDINATOR)
        self.touched: list[int] = []  # segments, in first-touch order
        # Each part's session: a part lives and dies with it, so it is never reopened.
        self._parts: dict[int, psycopg.Connection[Any]] = {}
        self.coordinator_work: list[Statement] = []  # run in the commit record's transaction
        # active, committed, aborted, or in_doubt: a connection failed at the moment of
        # the decision, so only the servers know (resolve_in_doubt finishes prepared parts).
        self.state = "active"

    # -- writes ---------------------------------------------------------------------
    def _segment(self, segment: int) -> psycopg.Connection[Any]:
        if self.state != "active":
            raise DistributedTransactionError(f"distributed transaction {self.gxid} is {self.state}")
        if segment in self._parts:
            return self._parts[segment]  # closed when lost: using it fails, as it must
        conn = self.session.connection(segment)
        start: list[Statement] = [sql.SQL("BEGIN")]
        if not self.session.legacy_markers:
            start.append(_emit(markers.GxidMarker(self.gxid)))
        conn.execute(sql.SQL("; ").join(start))
        self._parts[segment] = conn
        self.touched.append(segment)
        return conn

    # -- outcome ----------------------------------------------------------------------
    @property
    def one_phase(self) -> bool:
        return len(self.touched) == 1 and not self.coordinator_work

    def commit(self) -> None:
        if self.state != "active":
            raise DistributedTransactionError(f"distributed transaction {self.gxid} is {self.state}")
        try:
            if not self.touched and not self.coordinator_work:
                self.state = "committed"
                return
            if self.one_phase:
                self._commit_one_phase()
            else:
                self._commit_two_phase()
            self.state = "committed"
        finally:
            if self.state == "active":
                self.state = "aborted"
            self._end()

    def _commit_one_phase(self) -> None:
        (segment,) = self.touched
        conn = self._parts[segment]
        finish: list[Statement] = []
        if not self.session.legacy_markers:
            finish.append(_emit(markers.OnePhaseMarker(self.gxid)))
        finish.append(sql.SQL("COMMIT"))
        try:
            self.coordinator.execute(
                "SELECT gp_dist.dtx_commit_phase(%s, %s, false, %s)", (self.gxid, self.touched, self.session.legacy_markers)
            )
            conn.execute(sql.SQL("; ").join(finish))
        except psycopg.Error as e:
            if conn.broken:
                # The COMMIT may have been sent and applied before the connection went:
                # only the segment knows.
                self.state = "in_doubt"
                raise DistributedTransactionError(
                    f"gxid {self.gxid} is in doubt: the connection to segment {segment} failed during its "
                    f"one-phase commit ({str(e).strip()})",
                    fix="its rows show on the segment whether it committed") from e
            self._abandon([segment], prepared=[])
            raise DistributedTransactionError(f"one-phase commit of gxid {self.gxid} on segment {segment} failed: {e}".strip()) from e

    def _commit_two_phase(self) -> None:
        prepared: list[int] = []
        try:
            for segment in self.touched:
                self._parts[segment].execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid(self.gxid))))
                prepared.append(segment)
            self._write_commit_record()
        except (psycopg.Error, GpcdcError) as e:
            if len(prepared) == len(self.touched) and self.coordinator.broken:
                # The coordinator went away while writing the record, which may be
                # durable or not: only in-doubt resolution can tell; the parts stay.
                self.state = "in_doubt"
                raise DistributedTransactionError(
                    f"gxid {self.gxid} is in doubt: the coordinator connection failed while writing its commit "
                    f"record ({str(e).strip()}); its parts stay prepared on segments {prepared}",
                    fix="resolve it with gpcdc_toolkit.cluster.resolve_in_doubt (a replay does on start)") from e
            self._abandon([s for s in self.touched if s not in prepared], prepared)
            raise DistributedTransactionError(
                f"gxid {self.gxid} aborted before its commit record (prepared on segments {prepared} of {self.touched}): {e}".strip()
            ) from e
        # The commit record is durable: the transaction is committed and every segment
        # must commit its part. A failure here leaves an in-doubt prepared transaction.
        self.state = "committed"
        failed = []
        for segment in self.touched:
            try:
                self.session.connection(segment).execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid(self.gxid))))
            except (psycopg.Error, UnreachableError) as e:
                failed.append((segment, str(e).strip()))
        if failed:
            raise DistributedTransactionError(
                f"gxid {self.gxid} is committed but COMMIT PREPARED '{gid(self.gxid)}' failed on "
                + ", ".join(f"segment {s} ({why})" for s, why in failed),
                fix=f"run COMMIT PREPARED '{gid(self.gxid)}' on those segments",
            )

    def _write_commit_record(self) -> None:
        coordinator = self.coordinator
        record = sql.SQL("SELECT gp_dist.dtx_commit_phase({}, {}, true, {})").format(
            sql.Literal(self.gxid), sql.Literal(sorted(self.touched)), sql.Literal(self.session.legacy_markers)
        )
        if not self.coordinator_work:
            coordinator.execute(record)
            return
        with coordinator.transaction():
            for statement in self.coordinator_work:
                coordinator.execute(statement)
            coordinator.execute(record)

    def prepare_and_abort(self) -> None:
        """Prepare every part, then roll all of them back (the abort-after-PREPARE path)."""
        prepared = []
        try:
            for segment in self.touched:
                self._parts[segment].execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid(self.gxid))))
                prepared.append(segment)
        finally:
            left = self._abandon([s for s in self.touched if s not in prepared], prepared)
            self.state = "aborted"
            self._end()
        if left:
            raise DistributedTransactionError(
                f"gxid {self.gxid} is aborted but its parts stay prepared on segments {left}, holding their rows' locks",
                fix="finish them with gpcdc_toolkit.cluster.resolve_in_doubt")

    def rollback(self) -> None:
        if self.state != "active":
            return
        try:
            self._abandon(self.touched, prepared=[])
        finally:
            self.state = "aborted"
            self._end()

    def _abandon(self, active: Sequence[int], prepared: Sequence[int]) -> list[int]:
        """Roll back open parts and prepared parts; returns the segments whose prepared
        part could not be rolled back (it stays for :func:`resolve_in_doubt`). An open
        part whose connection is lost ended with it."""
        for segment in active:
            conn = self._parts.get(segment)
            if conn is not None and not conn.closed:
                self._try(segment, conn, sql.SQL("ROLLBACK"))
        left = []
        for segment in prepared:
            try:  # a prepared part belongs to no session: any connection finishes it
                conn = self.session.connection(segment)
            except UnreachableError as e:
                log.warning("gxid %s: its part stays prepared on segment %s: %s", self.gxid, segment, e)
                left.append(segment)
                continue
            if not self._try(segment, conn, sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid(self.gxid)))):
                left.append(segment)
        return left

    def _try(self, segment: int, conn: psycopg.Connection[Any], statement: Statement) -> bool:
        try:
            conn.execute(statement)
        except psycopg.Error as e:
            log.warning("gxid %s: %s on segment %s failed: %s", self.gxid, statement.as_string(None), segment, e)
            conn.close()
            return False
        return True

    def _end(self) -> None:
        """Mark the gxid no longer running: its session's lock, gone if the session is."""
        if self.coordinator.closed:
            return
        try:
            self.coordinator.execute("SELECT gp_dist.dtx_end(%s)", (self.gxid,))
        except psycopg.Error:
            self.coordinator.close()  # its session locks go with it
            raise


def resolve_in_doubt(cluster: Cluster, *, timeout: float = 30.0) -> tuple[list[str], list[str]]:
    """Finish the prepared parts that no running distributed transaction owns (its client
    died between PREPARE and the last COMMIT PREPARED): commit those whose commit record
    was written, roll back the rest, as Greenplum's coordinator does on recovery.

    A part whose gxid still shows running when first seen is waited for, up to
    ``timeout`` seconds: its client may have just died, and its coordinator session not
    yet noticed. Returns the GIDs committed and rolled back.
    """
    with cluster.coordinator_connection() as conn:
        database = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
    done: tuple[list[str], list[str]] = ([], [])
    watched: set[int] | None = None
    deadline = time.monotonic() + timeout
    while True:
        prepared = _prepared_parts(cluster, database)
        # Read after the prepared list: a part prepared by a live transaction shows it running.
        with cluster.coordinator_connection() as conn:
            running = {r[0] for r in conn.execute("SELECT gp_dist.running_gxids()")}
            orphans = {gxid for _node, gxid in prepared} - running
            committed = {r[0] for r in conn.execute(
                "SELECT gxid FROM gp_dist.committed_gxids WHERE gxid = ANY(%s)", (sorted(orphans),))}
            # Finished under the commit lock, as a commit phase is: a consistent cut sees
            # every part of a distributed transaction committed, or none.
            conn.execute("SELECT pg_advisory_lock_shared(%s, 0)", (COMMIT_LOCK,))
            try:
                for node, gxid in prepared:
                    if gxid in orphans and _finish_prepared(cluster, node, gxid, commit=gxid in committed):
                        (done[0] if gxid in committed else done[1]).append(f"{gid(gxid)} on segment {node.content}")
            finally:
                conn.execute("SELECT pg_advisory_unlock_shared(%s, 0)", (COMMIT_LOCK,))
        live = {gxid for _node, gxid in prepared} & running
        watched = live if watched is None else watched & live
        if not watched:
            break
        if time.monotonic() > deadline:
            raise DistributedTransactionError(
                f"prepared parts of gxids {sorted(watched)} still belong to running distributed transactions "
                f"after {timeout:g} s", fix="if their client is gone, end its coordinator session "
                "(pg_terminate_backend) and start again")
        time.sleep(0.05)  # polling for those sessions to end or finish
    _prune_commit_records(cluster, database)
    for what, gids in zip(("committed", "rolled back"), done):
        if gids:
            log.warning("in-doubt prepared transactions %s: %s", what, ", ".join(gids))
    return done


def _prepared_parts(cluster: Cluster, database: str) -> list[tuple[Node, int]]:
    return [(node, gxid) for node, name, in_database in cluster.prepared_transactions()
            if node.content != COORDINATOR and in_database == database and (gxid := gxid_of(name)) is not None]


def _prune_commit_records(cluster: Cluster, database: str) -> None:
    """Forget the commit records no resolution can need: of transactions that had
    finished (below every running and every future gxid) when the bound was taken, and
    have no prepared part left (listed after it, so a part left then is seen)."""
    with cluster.coordinator_connection() as conn:
        bound = conn.execute("SELECT LEAST((SELECT min(g) FROM gp_dist.running_gxids() AS g), "
                             "gp_dist.next_gxid())").fetchone()[0]  # type: ignore[index]
    keep = sorted({gxid for _node, gxid in _prepared_parts(cluster, database)})
    with cluster.coordinator_connection() as conn:
        conn.execute("DELETE FROM gp_dist.committed_gxids WHERE gxid < %s AND gxid <> ALL(%s)", (bound, keep))


def _finish_prepared(cluster: Cluster, node: Node, gxid: int, *, commit: bool) -> bool:
    with cluster.connect_node(node) as conn:
        try:
            conn.execute(sql.SQL("{} PREPARED {}").format(sql.SQL("COMMIT" if commit else "ROLLBACK"),
                                                          sql.Literal(gid(gxid))))
        except psycopg.errors.UndefinedObject:
            return False  # finished meanwhile by its owner
    return True


__all__ = ["Session", "DistributedTransaction", "gid", "gxid_of", "Node", "resolve_in_doubt"]


def mark_syncpoint(cluster: Cluster, gxid: int, pin: Callable[[], object],
                   lock_timeout: float) -> tuple[float, dict[int, int]]:
    """A sync point's cut on a sandbox (see ``gpcdc_toolkit.validate._syncpoint``): under
    the commit lock, the sync point committed as a two-phase distributed transaction of
    empty parts (so that one interrupted is finished or rolled back by in-doubt
    resolution, as any other), then ``pin`` (every segment's snapshot). Returns the
    stall (ms the commit lock was requested until released) and each node's WAL
    position at the cut."""
    from contextlib import ExitStack, suppress

    with ExitStack() as stack:
        writers = [stack.enter_context(cluster.connect_node(node)) for node in cluster.segments]
        controller = stack.enter_context(cluster.connect_node(cluster.coordinator))
        controller.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{int(lock_timeout * 1000)}ms")))
        name = gid(gxid)
        requested = time.monotonic()
        try:
            controller.execute("SELECT pg_advisory_lock(%s, 0)", (COMMIT_LOCK,))
        except psycopg.errors.LockNotAvailable:
            raise SyncPointError(f"the commit lock was not granted within {lock_timeout:g} s: a commit phase is stuck",
                                 fix=f"find the session holding advisory lock {COMMIT_LOCK} in pg_locks") from None
        prepared: list[psycopg.Connection[Any]] = []
        recorded = False
        try:
            _refuse_in_doubt(controller, writers)
            lsns = {}
            for content, conn in enumerate(writers):
                conn.execute("BEGIN")
                conn.execute(_emit(markers.GxidMarker(gxid)))
                lsns[content] = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
                conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(name)))
                prepared.append(conn)
            lsns[COORDINATOR] = parse_lsn(controller.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
            record = markers.CommitRecord(gxid, tuple(range(len(writers))), tuple(sorted(lsns.items())))
            with controller.transaction():
                controller.execute("INSERT INTO gp_dist.committed_gxids VALUES (%s)", (gxid,))
                controller.execute(_emit(record))
            recorded = True
            for conn in prepared:
                conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(name)))
            pin()
        except BaseException:
            for conn in prepared:  # finish what can be finished now; in-doubt resolution does the rest
                with suppress(psycopg.Error):
                    conn.execute(sql.SQL("{} PREPARED {}").format(sql.SQL("COMMIT" if recorded else "ROLLBACK"),
                                                                  sql.Literal(name)))
            raise
        finally:
            controller.execute("SELECT pg_advisory_unlock(%s, 0)", (COMMIT_LOCK,))
        return round((time.monotonic() - requested) * 1000, 2), lsns


def _refuse_in_doubt(controller: psycopg.Connection[Any], writers: list[psycopg.Connection[Any]]) -> None:
    """A distributed transaction whose record is written but whose part is still
    prepared (its COMMIT PREPARED failed) would be torn by the cut: refuse."""
    prepared = {g for conn in writers for (name,) in conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()") if (g := gxid_of(name)) is not None}
    if prepared:
        doubtful = [r[0] for r in controller.execute(
            "SELECT gxid FROM gp_dist.committed_gxids WHERE gxid = ANY(%s) ORDER BY 1", (sorted(prepared),))]
        if doubtful:
            raise SyncPointError(f"distributed transactions {doubtful} are committed but still prepared on a segment "
                                 "(in doubt), so no consistent cut exists now",
                                 fix="resolve them (`gpcdc replay` does on start; or "
                                     "gpcdc_toolkit.cluster.resolve_in_doubt), then take the sync point again")
