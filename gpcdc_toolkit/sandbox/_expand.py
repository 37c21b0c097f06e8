"""A sandbox's expansion, as Greenplum's gpexpand does it: new segments get the tables'
definitions and join the catalog, then each table's rows that now belong on a new
segment move there, one distributed transaction per table.

All of it runs while the expansion holds the transaction-start lock and no distributed
transaction runs: a writer routes its rows over the segments the catalog lists when its
transaction starts (``gp_dist.dtx_begin``), so none routes over a count that changes
under it, and no DDL slips between the definitions copied and the catalog changed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from .._sql import Name
from ..cluster import COORDINATOR, Cluster, Node, settings_statement
from ..cluster._dtx import Session
from ..errors import SandboxError
from ..protocol import DECODING_SETTINGS


@dataclass
class Expansion:
    """What an expansion did: the new segments' content ids, and per table the rows moved
    to them and the gxid of the distributed transaction that moved them."""

    added: list[int]
    moved: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (rows, gxid)

    @property
    def rows_moved(self) -> int:
        return sum(rows for rows, _ in self.moved.values())


def expand_cluster(coordinator_dsn: str, new_nodes: Sequence[tuple[int, int, str]], pg_bin: Path,
                   listed: Callable[[], None], *, timeout: float) -> Expansion:
    """Join ``new_nodes`` ((content, port, datadir), servers started and empty) to the
    cluster and redistribute every table. ``listed`` is called once the catalog lists
    them (from then on the cluster has them, whatever happens next). With no new
    nodes, only the redistribution: it finishes one that stopped half-way."""
    before = Cluster.connect(coordinator_dsn)
    expansion = Expansion([content for content, _, _ in new_nodes])
    with Session(before) as session:
        # The expansion's own transactions start on this connection, whose start lock
        # does not stand in their way (a session's locks never conflict with each other).
        lock = session.connection(COORDINATOR)
        lock.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(timeout * 1000)}ms",))
        try:
            lock.execute("SELECT gp_dist.gp_acquire_transaction_start_lock()")
        except psycopg.errors.LockNotAvailable:
            raise SandboxError(f"the transaction-start lock was not granted within {timeout:g} s: a bootstrap or "
                               "another expansion holds it", fix="wait for it to finish, then expand again") from None
        # Granted: the redistribution's commit phases wait for any cut as long as it takes.
        lock.execute("SELECT set_config('lock_timeout', '0', false)")
        try:
            try:
                lock.execute("SELECT gp_dist.gp_wait_running_transaction_end(0, %s)", (timeout,))
            except psycopg.errors.RaiseException as e:
                raise SandboxError(f"cannot expand: {e.diag.message_primary}",
                                   fix="let those transactions finish, then expand again") from None
            for content, port, _ in new_nodes:
                _copy_definitions(before, port, pg_bin, content)
            if new_nodes:
                with lock.transaction():
                    lock.execute(
                        "INSERT INTO gp_dist.gp_segment_configuration "
                        "SELECT (SELECT max(dbid) FROM gp_dist.gp_segment_configuration) + n, content, 'p', 'p', "
                        "'n', 'u', port, '127.0.0.1', '127.0.0.1', datadir FROM unnest(%s::smallint[], %s::int[], "
                        "%s::text[]) WITH ORDINALITY AS a(content, port, datadir, n)",
                        ([c for c, _, _ in new_nodes], [p for _, p, _ in new_nodes], [d for _, _, d in new_nodes]))
                listed()
            after = Cluster.connect(coordinator_dsn)
            for table in after.table_names():
                moved = _redistribute(session, after, table)
                if moved is not None:
                    expansion.moved[table] = moved
        finally:
            if not lock.closed:
                lock.execute("SELECT gp_dist.gp_release_transaction_start_lock()")
    return expansion


def _copy_definitions(cluster: Cluster, port: int, pg_bin: Path, content: int) -> None:
    """The tables (and whatever else the database defines) of segment 0, on a new
    segment: its schema as pg_dump prints it, without publications (a pipeline makes its
    own on each node it captures)."""
    source = cluster.dsn(cluster.segments[0])
    target = cluster.dsn(Node(content, cluster.segments[0].host, port, ""))
    dump = subprocess.run([str(pg_bin / "pg_dump"), "--schema-only", "--no-publications", "--no-subscriptions",
                           "--no-owner", "-d", source], capture_output=True, text=True)
    if dump.returncode != 0:
        raise SandboxError(f"pg_dump of segment 0's definitions failed: {_last_line(dump.stderr)}",
                           fix="check segment 0 answers (`gpcdc sandbox status`), then expand again")
    restore = subprocess.run([str(pg_bin / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", target],
                             input=dump.stdout, capture_output=True, text=True)
    if restore.returncode != 0:
        raise SandboxError(f"the definitions could not be created on new segment {content}: "
                           f"{_last_line(restore.stderr)}", fix="see the segment's log, then expand again")


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(no output)"


def _redistribute(session: Session, cluster: Cluster, table: str) -> tuple[int, int] | None:
    """Move a table's rows that belong on another segment now, in one distributed
    transaction (deleted where they were, inserted where they belong); returns (rows
    moved, its gxid), or None when none moves."""
    info = cluster.table(table)
    select = sql.SQL("t.ctid::text, {}").format(sql.SQL(", ").join(sql.SQL("t.{}").format(Name(c))
                                                                     for c in info.writable))
    leaving: dict[int, list[tuple[Any, ...]]] = {}
    for node in cluster.segments:
        with cluster.connect_node(node, autocommit=False) as conn:  # its keys are read by a cursor
            conn.execute(settings_statement(DECODING_SETTINGS, local=True))  # the text the session reads back alike
            rows = [row for _, row in cluster.misplaced_rows(node, conn, info, select)]
            conn.rollback()
        if rows:
            leaving[node.content] = rows
    if not leaving:
        return None
    with session.transaction() as tx:
        for content, rows in leaving.items():
            deleted = tx.execute(content, sql.SQL("DELETE FROM {} WHERE ctid::text = ANY(%s) RETURNING 1").format(
                info.identifier), [[row[0] for row in rows]])
            if len(deleted) != len(rows):
                raise SandboxError(f"redistributing {info.name}: {len(deleted)} of {len(rows)} rows to move were "
                                   f"still on segment {content} (changed outside a distributed transaction)")
        moved = tx.insert(info.parts, [dict(zip(info.writable, row[1:])) for rows in leaving.values() for row in rows])
    return moved, tx.gxid
