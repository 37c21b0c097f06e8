"""Targets reached through one front door: a plain PostgreSQL server, or a Citus coordinator.

Such a server takes every statement itself: plain PostgreSQL stores the rows, Citus
routes them to the shards on its workers and commits a write that spans workers with
its own two-phase commit. So a :class:`FrontDoorSession` writes each transaction as
one local transaction at the door (:class:`LocalTransaction`), with the same
statements a distributed transaction sends to its segments, and DDL goes to the door
too (Citus propagates it). What the door cannot give is a read of each store in its
own snapshot: validation reads the stores directly, the server itself, or each Citus
worker's shard placements (:meth:`FrontDoor.relation`).

A Greenplum coordinator could be driven the same way (it dispatches and two-phase
commits by itself), with ``DISTRIBUTED BY`` kept and ``gp_distribution_policy`` read.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import conninfo, sql

from .._sql import Name, Quoted
from ..citus import COORDINATOR_GROUP, DECISIONS, CitusGidError, CitusStream, gxid_of_gid, syncpoint_gxid
from ..errors import ClusterError, DistributedTransactionError, GpcdcError, SyncPointError
from ..protocol import COORDINATOR, READING_SETTINGS, DdlError, DistributedSnapshot, TransactionAssembler, parse_create_table, parse_lsn
from ..protocol import _markers as markers
from ._cluster import Cluster, Node, Table, TableRef, _where, connect_dsn, settings_statement, unique_key_index
from ._writes import Writes


class FrontDoor(Cluster):
    """A plain PostgreSQL server: the door is the only store of rows. Its one store is
    listed as segment 0, the same server, so that validation reads it as any store."""

    kind = "postgres"
    toolkit_routing = False

    @classmethod
    def connect(cls, dsn: str) -> FrontDoor:
        with connect_dsn(dsn, f"target {_where(dsn)}", autocommit=True):
            pass  # reachable; a front door needs no catalog of its own
        door = _door(dsn, role="server")
        return cls(dsn, [door, Node(0, door.host, door.port, "", role="server")])

    def dsn(self, node: Node, **overrides: Any) -> str:
        if node.host == self.coordinator.host and node.port == self.coordinator.port and not overrides:
            return self.coordinator_dsn  # the door as given (hostaddr, service, sockets)
        return super().dsn(node, **overrides)

    def describe(self) -> str:
        return f"{self.kind} at {self.coordinator.host}:{self.coordinator.port}"

    def table_names(self) -> list[str]:
        """Every ordinary or partitioned table outside the system's and Citus's schemas."""
        with self.coordinator_connection() as conn:
            return [r[0] for r in conn.execute(
                "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND n.nspname NOT LIKE 'pg\\_%' "
                "AND n.nspname NOT IN ('information_schema', 'citus', 'citus_internal', 'columnar', "
                "'columnar_internal') ORDER BY 1")]

    # -- writing ------------------------------------------------------------------------
    def session(self) -> FrontDoorSession:
        return FrontDoorSession(self)

    def home_of(self, values: Sequence[object]) -> int:
        return COORDINATOR  # the door routes every row itself

    def writer_of(self, content: int) -> int:
        return COORDINATOR

    def resolve_in_doubt(self) -> tuple[list[str], list[str]]:
        return [], []  # a local transaction commits whole or not at all

    def moves_rows(self) -> bool:
        """Whether an UPDATE that changes a row's distribution key must be sent as a
        delete and an insert (the door refuses to move the row itself)."""
        return False

    def prepare_ddl(self, tx: LocalTransaction) -> None:
        """Set up a transaction that runs DDL together with writes."""

    def distribute(self, tx: LocalTransaction, table: str, key: Sequence[str]) -> None:
        """Give a table created through the door its distribution (``key``, from the
        statement's ``DISTRIBUTED BY``): none on plain PostgreSQL."""

    def _distribution_key(self, conn: psycopg.Connection[Any], oid: int, qualified: str) -> tuple[str, ...]:
        return ()

    # -- reading the data where it is stored ------------------------------------------
    def fetch_all(self, query: str | sql.SQL | sql.Composed, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.coordinator_connection() as conn:
            return conn.execute(query, params).fetchall()

    # Read at the door, which sees every store's rows: keyed by the door (-1). A Citus
    # worker's copy of a distributed table is a shell that would read every worker.
    def rows_by_segment(self, table: str) -> dict[int, list[tuple[Any, ...]]]:
        return {COORDINATOR: self.fetch_all(sql.SQL("SELECT * FROM {}").format(self.table(table).identifier))}

    def row_counts(self, table: TableRef) -> dict[int, int]:
        query = sql.SQL("SELECT count(*) FROM {}").format(self.table(table).identifier)
        return {COORDINATOR: int(self.fetch_all(query)[0][0])}

    def misplaced_test(self, node: Node, info: Table) -> sql.Composable | None:
        return sql.SQL("false")  # one store: no row can be in the wrong place

    def misplaced_rows(self, node: Node, conn: psycopg.Connection[Any], info: Table,
                       select: sql.Composable) -> list[tuple[sql.Composable, tuple[Any, ...]]]:
        return []


class CitusCluster(FrontDoor):
    """A Citus coordinator and its workers: distributed tables split into shards, each
    shard placed on a node group (``pg_dist_shard``, ``pg_dist_placement``,
    ``pg_dist_node``). The stores are the active primary nodes, numbered 0..N-1 by group
    id: the workers, and the coordinator itself (group 0) where it holds placements
    (reference tables, or a single-node cluster).

    As a source, each worker's slot decodes two-phase (``gpcdc_toolkit.citus``): a part's
    gxid comes from its gid, and the coordinator's ``pg_dist_transaction`` inserts are
    the commit records. There is no gate at a distributed transaction's start, so only
    the snapshot method bootstraps it, under :meth:`commit_pause`."""

    kind = "citus"
    bootstrap_methods = ("snapshot",)
    two_phase_decoding = True
    # Citus sends no SET LOCAL on to the workers unless asked: a statement at the door
    # would print a row's values there in the workers' own time zone, say.
    settings_reach_workers = ("SET LOCAL citus.propagate_set_commands = 'local'",)

    def __init__(self, coordinator_dsn: str, nodes: Sequence[Node], groups: Mapping[int, int]) -> None:
        super().__init__(coordinator_dsn, nodes)
        self.groups = dict(groups)  # node group id -> store (segment) content

    @classmethod
    def connect(cls, dsn: str) -> CitusCluster:
        with connect_dsn(dsn, f"Citus coordinator {_where(dsn)}", autocommit=True) as conn:
            # The coordinator's group is a store only where it holds placements.
            stores = conn.execute("SELECT groupid, nodename, nodeport FROM pg_dist_node n "
                                  "WHERE noderole = 'primary' AND isactive AND (groupid <> 0 OR EXISTS "
                                  "(SELECT FROM pg_dist_placement p WHERE p.groupid = n.groupid)) "
                                  "ORDER BY groupid").fetchall()
        if not stores:
            raise ClusterError(f"the Citus coordinator {_where(dsn)} lists no active primary node in pg_dist_node",
                               fix="add workers with citus_add_node(host, port)")
        nodes = [_door(dsn), *(Node(i, str(h), int(p), "") for i, (_group, h, p) in enumerate(stores))]
        return cls(dsn, nodes, {int(group): i for i, (group, _h, _p) in enumerate(stores)})

    def describe(self) -> str:
        workers = sum(group != 0 for group in self.groups)
        return f"{super().describe()}, {workers} workers"

    def table_names(self) -> list[str]:
        """The hash-distributed tables (``pg_dist_partition``)."""
        with self.coordinator_connection() as conn:
            return [r[0] for r in conn.execute("SELECT logicalrelid::regclass::text FROM pg_dist_partition "
                                               "WHERE partmethod = 'h' ORDER BY 1")]

    # -- capturing -------------------------------------------------------------------------
    def check_source(self) -> None:
        super().check_source()
        if COORDINATOR_GROUP in self.groups:
            raise ClusterError(
                f"the Citus coordinator {_where(self.coordinator_dsn)} holds shard placements (reference tables, or "
                "distributed tables on a coordinator with shards), whose writes commit inside its own transactions: "
                "capture reads the workers' shards only",
                fix="move them to workers (SELECT citus_drain_node(...) on a coordinator set to have no shards), or "
                    "capture a cluster without reference tables")

    def local_ddl(self, conn: psycopg.Connection[Any]) -> None:
        # A publication made on one node stays there: Citus would propagate it to all.
        conn.execute("SET citus.enable_ddl_propagation TO off")

    def publication_scope(self, node: Node) -> str:
        if node.content == COORDINATOR:
            return "FOR TABLE {}.{}".format(*DECISIONS)  # the commit decisions
        return "FOR ALL TABLES"  # the shards, named back to their tables by the stream

    def decoding_options(self) -> dict[str, str]:
        return {"proto_version": "3", "two_phase": "on", "messages": "true"}

    def translator(self, node: Node, **settings: Any) -> TransactionAssembler:
        return CitusStream(node.content, shards=self.shard_tables(), groups=self.groups, **settings)

    def gxid_of(self, gid: str) -> int | None:
        try:
            return gxid_of_gid(gid)
        except CitusGidError:
            return None  # another node's transaction: not one the records can name

    def unowned_prepared(self) -> list[str]:
        return []  # Citus's own recovery finishes them; a slot's creation names any it waits on

    def shard_tables(self) -> Callable[[str, str], tuple[str, str] | None]:
        """``(schema, relation) -> (schema, table)`` of a worker's shard relation, None
        for any other relation. A shard is ``<table>_<shard id>`` in its table's schema
        (Citus shortens a long table name, never the id); the map of shard ids is read
        from the coordinator, and again when a relation names an unknown one (a table
        distributed since)."""
        shards: dict[int, tuple[str, str]] = {}

        def load() -> None:
            with self.coordinator_connection() as conn:
                shards.update({int(shard): (str(schema), str(table)) for shard, schema, table in conn.execute(
                    "SELECT s.shardid, n.nspname, c.relname FROM pg_dist_shard s JOIN pg_dist_partition p "
                    "USING (logicalrelid) JOIN pg_class c ON c.oid = s.logicalrelid "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.partmethod = 'h'")})

        def table_of(schema: str, relation: str) -> tuple[str, str] | None:
            match = re.search(r"_(\d+)$", relation)
            if match is None:
                return None
            shard = int(match[1])
            if shard not in shards:
                load()
            table = shards.get(shard)
            return table if table is not None and table[0] == schema else None

        return table_of

    @contextmanager
    def commit_pause(self, controller: psycopg.Connection[Any], timeout: float) -> Iterator[DistributedSnapshot | None]:
        """Hold Citus's two-phase commits back, as ``citus_create_restore_point`` does:
        ``pg_dist_transaction`` locked exclusively, so a commit waits before its first
        PREPARE (it logs each part there first); then wait until the workers hold no
        prepared part of a decided transaction (its COMMIT PREPARED in flight). A
        single-shard commit is not held: it is one local transaction, split exactly by
        each node's own snapshot. Citus has no distributed snapshot: yields None."""
        controller.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(timeout * 1000)}ms",))
        with controller.transaction():
            controller.execute("LOCK TABLE pg_catalog.pg_dist_transaction IN EXCLUSIVE MODE")
            self._wait_decided_parts(controller, timeout)
            yield None

    def _wait_decided_parts(self, controller: psycopg.Connection[Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            prepared = [(self.group_of(node), gid) for node in self.segments
                        for gid, in self.fetch_on(node, "SELECT gid FROM pg_prepared_xacts WHERE left(gid, 6) = 'citus_'")]
            decided = [(g, gid) for g, gid in prepared if controller.execute(
                "SELECT FROM pg_catalog.pg_dist_transaction WHERE groupid = %s AND gid = %s", (g, gid)).fetchone()]
            if not decided:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{len(decided)} parts of committed Citus transactions are still prepared on the workers after "
                    f"{timeout:g} s: {', '.join(repr(gid) for _g, gid in decided[:5])}",
                    fix="run SELECT recover_prepared_transactions() on the coordinator, then try again")
            time.sleep(0.01)  # their COMMIT PREPARED is on its way

    # -- sync points ---------------------------------------------------------------------------
    @contextmanager
    def syncpoint_gxid(self) -> Iterator[int]:
        yield syncpoint_gxid(time.time_ns() // 1000)

    def snapshot_locks(self, tables: Sequence[Table]) -> tuple[sql.Composable, ...]:
        return ()  # a worker holds shards, not the tables: its snapshot locks nothing (a TRUNCATE spoils it)

    def mark_syncpoint(self, gxid: int, pin: Callable[[], object], lock_timeout: float) -> tuple[float, dict[int, int]]:
        """The cut of a Citus source. A one-phase (single-shard) commit takes no lock
        Citus's two-phase pause would hold, and racing the cut it could land in a
        worker's snapshot after the sync point's part in its log; so the cut pauses the
        writes themselves. A write through the coordinator holds its distributed table
        (ROW EXCLUSIVE, on the coordinator) before it touches a shard and until its
        coordinator transaction ends, so the cut locks the captured tables there in
        SHARE mode: new writers wait at their first statement; those in flight finish
        first. Then it waits for what they finish after their coordinator transaction
        (the ``COMMIT PREPARED`` of decided parts) and for any lock still held on a
        shard; writes the sync point's parts (a gxid marker on every worker), prepared;
        calls ``pin``; commits the record (a ``gpcdc.commit`` marker listing every
        worker, with each node's WAL position), then the parts; and only then lets the
        writers go, so every write after the cut follows the sync point in its worker's
        log. Writes that bypass the coordinator are not paused."""
        tables = [self.table(t) for t in self.table_names()]
        shards = {content: [name for table in tables for c, name in self._shard_names(table) if c == content]
                  for content in range(self.segment_count)}
        name = f"gpcdc_{gxid}"
        deadline = time.monotonic() + lock_timeout
        requested = time.monotonic()
        with contextlib.ExitStack() as stack:
            parts = {n.content: stack.enter_context(self.connect_node(n)) for n in self.segments}
            pause = stack.enter_context(self.coordinator_connection())
            recorder = stack.enter_context(self.coordinator_connection())
            pause.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{int(lock_timeout * 1000)}ms")))
            prepared: list[psycopg.Connection[Any]] = []
            recorded = False
            try:
                with pause.transaction():
                    try:
                        pause.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(
                            sql.SQL(", ").join(t.identifier for t in tables)))
                    except psycopg.errors.LockNotAvailable:
                        raise SyncPointError(f"the writers of the captured tables did not pause within "
                                             f"{lock_timeout:g} s", fix="find the long transaction writing them, or "
                                                                        "raise validate.lock_timeout") from None
                    self._wait_decided_parts(pause, max(0.0, deadline - time.monotonic()))
                    self._wait_shards_free(parts, shards, deadline)
                    lsns: dict[int, int] = {}
                    for content, conn in parts.items():
                        conn.execute("BEGIN")
                        conn.execute("SELECT pg_logical_emit_message(true, %s, %s)",
                                     markers.encode(markers.GxidMarker(gxid)))
                        lsns[content] = parse_lsn(conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
                        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(name)))
                        prepared.append(conn)
                    pin()  # nothing that changes a captured shard commits now
                    lsns[COORDINATOR] = parse_lsn(recorder.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
                    record = markers.CommitRecord(gxid, tuple(sorted(parts)), tuple(sorted(lsns.items())))
                    recorder.execute("SELECT pg_logical_emit_message(true, %s, %s)", markers.encode(record))
                    recorded = True
                    for conn in prepared:
                        conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(name)))
                    prepared.clear()
            except BaseException:
                for conn in prepared:  # no part of it is left prepared
                    with contextlib.suppress(psycopg.Error):
                        conn.execute(sql.SQL("{} PREPARED {}").format(sql.SQL("COMMIT" if recorded else "ROLLBACK"),
                                                                      sql.Literal(name)))
                raise
        return round((time.monotonic() - requested) * 1000, 2), lsns

    def _shard_names(self, info: Table) -> list[tuple[int, str]]:
        """(store content, the shard's name as SQL names it) of each shard of a table."""
        return [(content, shard.text) for content, shard, _low, _high in self._placements(info)]

    def _wait_shards_free(self, parts: Mapping[int, psycopg.Connection[Any]], shards: Mapping[int, list[str]],
                          deadline: float) -> None:
        """Until no session holds a write lock on a captured shard: what a writer does
        after its coordinator transaction (a one-phase COMMIT on its way)."""
        query = ("SELECT count(*) FROM pg_locks WHERE granted AND relation = ANY(%s::regclass[]) "
                 "AND mode IN ('RowExclusiveLock', 'ShareUpdateExclusiveLock', 'ShareRowExclusiveLock', "
                 "'ExclusiveLock', 'AccessExclusiveLock') AND pid IS DISTINCT FROM pg_backend_pid()")
        for content, conn in parts.items():
            while shards[content] and conn.execute(query, (shards[content],)).fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise SyncPointError(f"writes to worker {content}'s shards did not end while the captured tables "
                                         "were paused (writes that bypass the coordinator?)",
                                         fix="find the sessions holding them in the worker's pg_locks")
                time.sleep(0.005)  # their COMMIT is on its way

    def group_of(self, node: Node) -> int:
        return next(group for group, content in self.groups.items() if content == node.content)

    def fetch_on(self, node: Node, query: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.connect_node(node) as conn:
            return conn.execute(query, params).fetchall()

    def resolve_in_doubt(self) -> tuple[list[str], list[str]]:
        # Citus's own recovery: a worker's prepared part whose gid the coordinator's
        # pg_dist_transaction holds is committed, any other rolled back.
        with self.coordinator_connection() as conn:
            conn.execute("SELECT recover_prepared_transactions()")
        return [], []

    def moves_rows(self) -> bool:
        return True  # Citus refuses to modify a row's distribution column

    def prepare_ddl(self, tx: LocalTransaction) -> None:
        # DDL and writes to distributed tables in one transaction must use one
        # connection per worker, or Citus refuses the later of them.
        tx.execute(COORDINATOR, "SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")

    def distribute(self, tx: LocalTransaction, table: str, key: Sequence[str]) -> None:
        if len(key) != 1:
            raise GpcdcError(f"{table} is distributed by {len(key)} columns ({', '.join(key)}), but Citus distributes "
                             "a table by one column",
                             fix=f"create {table} on the target by hand, empty, with create_distributed_table() on "
                                 "one column of its primary key, then replay again")
        tx.execute(COORDINATOR, "SELECT create_distributed_table(%s::regclass, %s)",
                   (table, key[0]))  # the column as the catalog names it, unquoted

    def _distribution_key(self, conn: psycopg.Connection[Any], oid: int, qualified: str) -> tuple[str, ...]:
        found = conn.execute("SELECT column_to_column_name(logicalrelid, partkey) FROM pg_dist_partition "
                             "WHERE logicalrelid = %s AND partmethod = 'h'", (oid,)).fetchone()
        return (str(found[0]),) if found else ()

    def _placements(self, info: Table) -> list[tuple[int, Quoted, int, int]]:
        """Each shard of a table: (store content, the shard's relation, hash range low,
        high). The shard's name is Citus's own (``shard_name``: qualified and quoted,
        shortened as Citus shortens long ones)."""
        with self.coordinator_connection() as conn:
            # One placement of each shard: a reference table's shard, or a shard kept
            # in several copies, is read once.
            rows = conn.execute(
                "SELECT DISTINCT ON (s.shardid) p.groupid, shard_name(s.logicalrelid, s.shardid), "
                "s.shardminvalue::bigint, s.shardmaxvalue::bigint FROM pg_dist_shard s "
                "JOIN pg_dist_placement p USING (shardid) WHERE s.logicalrelid = %s::regclass AND p.shardstate = 1 "
                "ORDER BY s.shardid, p.groupid", (info.name,)).fetchall()
        if not rows:
            raise ClusterError(f"{info.name} has no shard placements on the Citus workers",
                               fix="distribute it with create_distributed_table()")
        unknown = sorted({g for g, *_ in rows if g not in self.groups})
        if unknown:
            raise ClusterError(f"shards of {info.name} are placed on groups {unknown}, which are not active nodes",
                               fix="move them to workers with citus_move_shard_placement(), or activate the nodes")
        return [(self.groups[group], Quoted(shard), low, high) for group, shard, low, high in rows]

    def relation(self, node: Node, info: Table) -> sql.Composable:
        """The table's rows stored on a worker: its shard placements, together."""
        shards = [sql.SQL("SELECT * FROM {}").format(shard)
                  for content, shard, _low, _high in self._placements(info) if content == node.content]
        if not shards:  # a worker without a placement of the table: no rows, of the table's type
            shards = [sql.SQL("SELECT {} WHERE false").format(sql.SQL(", ").join(
                sql.SQL("NULL::{} AS {}").format(sql.SQL(t), Name(c)) for c, t in zip(info.columns, info.types)))]
        return sql.SQL("({})").format(sql.SQL(" UNION ALL ").join(shards))

    def key_index(self, node: Node, conn: psycopg.Connection[Any], info: Table) -> str | None:
        """Each shard keeps an index of its own (Citus names it after the table's, with
        the shard's id), and holds its own range of the distribution key's hash: the
        worker keeps the key when every shard of the table it holds does."""
        names = set()
        for content, shard, _low, _high in self._placements(info):
            if content == node.content:
                if (name := unique_key_index(conn, shard.text, info.primary_key)) is None:
                    return None
                names.add(re.sub(r'_\d+("?)$', r"\1", name))  # the table's index, named without the shard
        return ", ".join(sorted(names))

    def misplaced_test(self, node: Node, info: Table) -> sql.Composable | None:
        return None  # a shard's range decides, and the union of a worker's shards loses which shard a row is in

    def misplaced_rows(self, node: Node, conn: psycopg.Connection[Any], info: Table,
                       select: sql.Composable) -> list[tuple[sql.Composable, tuple[Any, ...]]]:
        """Rows of a worker's shards whose distribution value Citus hashes outside the
        shard's range, found by the worker itself (``worker_hash``)."""
        if not info.distribution_key:
            return []
        column = Name(info.distribution_key[0])
        out: list[tuple[sql.Composable, tuple[Any, ...]]] = []
        for content, shard, low, high in self._placements(info):
            if content == node.content:
                out += [(shard, row) for row in conn.execute(
                    sql.SQL("SELECT {} FROM {} t WHERE worker_hash({}) NOT BETWEEN %s AND %s").format(
                        select, shard, column), (low, high)).fetchall()]
        return out


def _door(dsn: str, role: str = "") -> Node:
    """The door's node, from its DSN (the first host of several)."""
    params = conninfo.conninfo_to_dict(dsn)
    host = str(params.get("host") or params.get("hostaddr") or "localhost").split(",")[0]
    port = str(params.get("port") or "5432").split(",")[0]
    if not port.isdigit():
        raise ClusterError(f"the target DSN's port {port!r} is not a number", fix="correct the DSN")
    return Node(COORDINATOR, host, int(port), "", role)


class FrontDoorSession:
    """One connection to the door, for running local transactions one at a time."""

    def __init__(self, cluster: FrontDoor) -> None:
        self.cluster = cluster
        self._connection: psycopg.Connection[Any] | None = None
        self._tables: dict[TableRef, Table] = {}

    def __enter__(self) -> FrontDoorSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def connection(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            self._connection = self.cluster.connect_node(self.cluster.coordinator)
        return self._connection

    def table(self, name: TableRef) -> Table:
        """A table's catalog entry, cached until this session runs DDL."""
        if name not in self._tables:
            self._tables[name] = self.cluster.table(name)
        return self._tables[name]

    def home(self, values: Sequence[object]) -> int:
        return self.cluster.home_of(values)

    def transaction(self) -> LocalTransaction:
        return LocalTransaction(self)

    def ddl(self, statement: str, *, timeout: float = 60.0,
            then: Callable[[Writes], object] | None = None) -> int:
        """Run a DDL statement at the door, with ``then``'s writes, in one transaction;
        a ``CREATE TABLE`` loses its ``DISTRIBUTED BY`` clause and is distributed as the
        door does it. Returns the target's transaction id."""
        try:
            create = parse_create_table(statement)
        except DdlError as e:
            raise GpcdcError(str(e)) from None
        try:
            with self.transaction() as tx:
                tx.execute(COORDINATOR, sql.SQL("SET LOCAL lock_timeout = {}").format(
                    sql.Literal(f"{int(timeout * 1000)}ms")))
                self.cluster.prepare_ddl(tx)
                tx.execute(COORDINATOR, create.statement if create else statement)
                if create:
                    self.cluster.distribute(tx, create.table, create.distribution_key)
                if then is not None:
                    then(tx)
                xid = int(tx.execute(COORDINATOR, "SELECT txid_current()")[0][0])
        finally:
            self._tables.clear()
        return xid


class LocalTransaction(Writes):
    """A transaction at the door: every statement on one connection, committed at once."""

    session: FrontDoorSession

    def __init__(self, session: FrontDoorSession) -> None:
        self.session = session
        self._conn = session.connection()
        self._conn.execute("BEGIN")
        # The values' text read as capture printed it, on Citus's workers too. Apart from
        # BEGIN: Citus sends the whole statement that sets them on to its workers.
        self._conn.execute("; ".join([*session.cluster.settings_reach_workers,
                                      settings_statement(READING_SETTINGS, local=True)]))
        self.state = "active"  # active, committed, aborted, or in_doubt (the COMMIT's answer was lost)

    def _segment(self, segment: int) -> psycopg.Connection[Any]:
        if self.state != "active":
            raise DistributedTransactionError(f"the transaction at the target's door is {self.state}")
        return self._conn

    def moves(self, table: Table, key: Mapping[str, Any], new_key: Mapping[str, Any]) -> bool:
        return self.session.cluster.moves_rows() and any(key[c] != new_key[c] for c in table.distribution_key)

    def commit(self) -> None:
        if self.state != "active":
            raise DistributedTransactionError(f"the transaction at the target's door is {self.state}")
        try:
            self._conn.execute("COMMIT")
        except psycopg.Error as e:
            self.state = "in_doubt" if self._conn.broken else "aborted"
            raise DistributedTransactionError(f"COMMIT at the target's door failed ({str(e).strip()})"
                                              + ("; whether it committed, only the target knows" if self._conn.broken
                                                 else "")) from e
        self.state = "committed"

    def rollback(self) -> None:
        if self.state != "active":
            return
        self.state = "aborted"
        if not self._conn.closed:
            try:
                self._conn.execute("ROLLBACK")
            except psycopg.Error:
                self._conn.close()  # a lost connection ended the transaction with it


__all__ = ["FrontDoor", "CitusCluster", "FrontDoorSession", "LocalTransaction"]
