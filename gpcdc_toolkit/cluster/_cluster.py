"""A Greenplum-style cluster seen through its coordinator.

Nodes are discovered from ``gp_segment_configuration`` on the coordinator, as on
Greenplum; nothing else names them. Everything the toolkit does to a cluster goes
through this small interface (nodes, connections, catalog, controller functions), so
that another MPP flavour can plug in by subclassing it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import conninfo, sql

from .._sql import Name
from ..errors import ClusterError, UnreachableError, first_line
from ..protocol import COORDINATOR, DECODING_SETTINGS, READING_SETTINGS, DistributedSnapshot, TransactionAssembler
from ._routing import output_text, segment_for

if TYPE_CHECKING:
    from ._writes import WriteSession


@dataclass(frozen=True)
class Node:
    content: int  # -1 for the coordinator, 0..N-1 for segments
    host: str
    port: int
    datadir: str
    role: str = ""  # what messages call a node that is no coordinator or segment (a plain server)

    @property
    def name(self) -> str:
        if self.role:
            return self.role
        return "coordinator" if self.content == COORDINATOR else f"segment {self.content}"

    def __str__(self) -> str:
        return f"{self.name} ({self.host}:{self.port})"


TableRef = str | tuple[str, str]
"""A table named as SQL names it (``'sales."Order Items"'``, case folded unless quoted),
or as a (schema, name) pair exactly as the catalog has them (``("sales", "Order Items")``)."""


@dataclass(frozen=True)
class Table:
    """A distributed table as the coordinator's catalog describes it."""

    name: str  # schema-qualified, quoted where needed (as PostgreSQL prints it)
    columns: tuple[str, ...]
    types: tuple[str, ...]
    distribution_key: tuple[str, ...]
    primary_key: tuple[str, ...]
    parts: tuple[str, str] = ("", "")  # (schema, name) exactly as the catalog has them
    generated: Mapping[str, str] = field(default_factory=dict)  # stored generated column -> its expression
    defaults: Mapping[str, str] = field(default_factory=dict)  # column -> its default's expression
    # Identity columns GENERATED ALWAYS: a row names their values only in an INSERT that
    # overrides the system value, and no UPDATE may set them (see ``Writes.rewrites``).
    always_identity: frozenset[str] = frozenset()

    @property
    def identifier(self) -> sql.Composable:
        return Name(*self.parts)

    @property
    def writable(self) -> tuple[str, ...]:
        """The columns a row is written with: all but generated ones (which the server
        computes, and logical decoding does not carry)."""
        return tuple(c for c in self.columns if c not in self.generated)


def unique_key_index(conn: psycopg.Connection[Any], relation: str, key: Sequence[str]) -> str | None:
    """The unique index by which ``relation`` (as SQL names it) keeps ``key`` unique, its
    columns also NOT NULL, read from the catalog over ``conn``; None when it has none."""
    if not key:
        return None
    row = conn.execute(_KEY_INDEX, {"table": relation, "key": list(key)}).fetchone()
    return None if row is None else str(row[0])


def settings_statement(settings: Mapping[str, str], *, local: bool = False) -> str:
    """The statements that set ``settings`` in a session (``local``: in its transaction)."""
    scope = "SET LOCAL" if local else "SET"
    return "; ".join(f"{scope} {name} = '{value}'" for name, value in settings.items())


# What a session writing the stream's values to a target runs, so that it reads their
# text as capture printed it: a target whose money is 1.234,56 € reads $1,234.56 too.
READ_AS_PRINTED = settings_statement(READING_SETTINGS)


def connection_lost(error: psycopg.Error) -> bool:
    """A connection that failed or that the server ended (shut down, crashed, dropped
    the database), rather than a statement the server refused."""
    return isinstance(error, psycopg.OperationalError) and (error.sqlstate is None
                                                            or error.sqlstate.startswith(("08", "57P")))


def connect_dsn(dsn: str, what: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open a connection, turning a refusal into a one-line UnreachableError."""
    try:
        return psycopg.connect(dsn, connect_timeout=10, **kwargs)
    except psycopg.OperationalError as e:
        reason = first_line(e)
        raise UnreachableError(f"cannot reach {what}: {reason}", fix=_refusal_fix(reason)) from None


def _refusal_fix(reason: str) -> str:
    """What to do about libpq's reason for not connecting: a server that answered and
    refused the login is not one to start."""
    if any(words in reason for words in ("authentication failed", "no password supplied", "password is required")):
        return "correct the user and password in the DSN (or in the password file it uses)"
    if reason.endswith("does not exist") and ("role" in reason or "database" in reason):
        return "correct the user or dbname in the DSN, or create them on the server"
    return "start the server or correct the DSN"


# A valid unique index, neither partial nor on expressions, whose key columns are all
# among the primary key's, each of which is NOT NULL (by a constraint that was
# validated): the key is then unique and never null. Not on a table that others inherit
# from, whose rows a read of it includes and its index does not cover (a partitioned
# table's index covers its partitions). pg_class is not joined: Citus hides its shards
# from it, so a relation it does not show is taken as one others may inherit from.
_KEY_INDEX = sql.SQL("""
SELECT i.indexrelid::regclass::text
FROM pg_index i
WHERE i.indrelid = to_regclass(%(table)s) AND i.indisunique AND i.indisvalid AND i.indisready
  AND i.indpred IS NULL AND i.indexprs IS NULL
  AND (NOT EXISTS (SELECT FROM pg_inherits h WHERE h.inhparent = i.indrelid)
       OR (SELECT r.relkind FROM pg_class r WHERE r.oid = i.indrelid) = 'p')
  AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conrelid = i.indrelid AND c.contype = 'n'
                  AND NOT c.convalidated)
  AND (SELECT bool_and(a.attname = ANY(%(key)s::text[]))
       FROM unnest((i.indkey::int2[])[0:i.indnkeyatts - 1]) AS k(attnum)
       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum)
  AND (SELECT count(*) FILTER (WHERE a.attnotnull) FROM pg_attribute a
       WHERE a.attrelid = i.indrelid AND a.attname = ANY(%(key)s::text[]) AND NOT a.attisdropped)
      = cardinality(%(key)s::text[])
ORDER BY i.indisprimary DESC, i.indexrelid
LIMIT 1""")


class Cluster:
    """A coordinator and its segments. Cheap to create; holds no connection.

    This class is the Greenplum-style cluster (the sandbox): rows routed to segments by
    the toolkit, written in distributed transactions it runs. A target reached through
    a front door (plain PostgreSQL, Citus) is a subclass (``_frontdoor``)."""

    kind = "sandbox"
    # Rows are placed by the toolkit's routing: segment_for, and its SQL form on every
    # node (gp_dist.segment_of), which a placement check asks.
    toolkit_routing = True
    # What a transaction at a node runs first so that its own SET LOCAL settings also hold
    # where it sends statements on (a front door's workers); each node runs its own here.
    settings_reach_workers: tuple[str, ...] = ()

    def __init__(self, coordinator_dsn: str, nodes: Sequence[Node]) -> None:
        self.coordinator_dsn = coordinator_dsn
        self.nodes = tuple(sorted(nodes, key=lambda n: n.content))
        self.coordinator = self.nodes[0]
        self.segments = self.nodes[1:]
        if self.coordinator.content != COORDINATOR or [s.content for s in self.segments] != list(
            range(len(self.segments))
        ):
            contents = [n.content for n in self.nodes]
            raise ClusterError(
                f"gp_segment_configuration lists primaries with content ids {contents}",
                fix="a cluster needs content -1 (coordinator) and 0..N-1 (segments)",
            )

    @classmethod
    def connect(cls, dsn: str) -> Cluster:
        """Discover a cluster from its coordinator's ``gp_segment_configuration``."""
        with connect_dsn(dsn, f"coordinator {_where(dsn)}", autocommit=True) as conn:
            try:
                rows = conn.execute(
                    "SELECT content, hostname, port, datadir FROM gp_segment_configuration "
                    "WHERE role = 'p' ORDER BY content"
                ).fetchall()
            except psycopg.errors.UndefinedTable:
                raise ClusterError(
                    f"{_where(dsn)} has no gp_segment_configuration, so it is not a Greenplum-style coordinator",
                    fix="point the DSN at a coordinator, or create a sandbox with `gpcdc sandbox up`",
                ) from None
            # Rows are routed by segment_for, whose SQL form every node has since the
            # routing hash changed: a sandbox without it placed its rows by another hash.
            if not conn.execute("SELECT to_regprocedure('gp_dist.segment_of(integer, text[])') IS NOT NULL").fetchone()[0]:  # type: ignore[index]
                raise ClusterError(f"the sandbox at {_where(dsn)} has no gp_dist.segment_of: it was made by an older "
                                   "version, which placed rows by another hash",
                                   fix="make the sandbox again (`gpcdc sandbox down --remove`, then `gpcdc sandbox up`)")
        if not rows:
            raise ClusterError(f"gp_segment_configuration on {_where(dsn)} lists no primaries")
        return cls(dsn, [Node(int(c), str(h), int(p), str(d)) for c, h, p, d in rows])

    @property
    def segment_count(self) -> int:
        return len(self.segments)

    def describe(self) -> str:
        """What the cluster is, for a person: its kind and where its rows are stored."""
        return f"{self.kind}, {self.segment_count} segments, coordinator {self.coordinator.host}:{self.coordinator.port}"

    def table_names(self) -> list[str]:
        """The names (as SQL names them) of the tables that hold distributed data."""
        with self.coordinator_connection() as conn:
            return [r[0] for r in conn.execute("SELECT localoid::regclass::text FROM gp_distribution_policy ORDER BY 1")]

    def dsn(self, node: Node, **overrides: Any) -> str:
        params = conninfo.conninfo_to_dict(self.coordinator_dsn)
        params.update(host=node.host, port=str(node.port), **overrides)
        params.pop("hostaddr", None)
        return conninfo.make_conninfo("", **params)

    def connect_node(self, node: Node, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection[Any]:
        return connect_dsn(self.dsn(node), str(node), autocommit=autocommit, **kwargs)

    @contextmanager
    def coordinator_connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self.connect_node(self.coordinator) as conn:
            yield conn

    def check_logical_decoding(self) -> None:
        """Raise ClusterError naming the fix when a node cannot run change capture."""
        for node in self.nodes:
            with self.connect_node(node) as conn:
                settings = dict(
                    conn.execute(
                        "SELECT name, setting FROM pg_settings WHERE name IN "
                        "('wal_level', 'max_prepared_transactions', 'max_replication_slots')"
                    ).fetchall()
                )
            if settings["wal_level"] != "logical":
                raise ClusterError(
                    f"{node} has wal_level={settings['wal_level']}",
                    fix="set wal_level = logical in its postgresql.conf and restart it",
                )
            if int(settings["max_prepared_transactions"]) == 0:
                raise ClusterError(
                    f"{node} has max_prepared_transactions=0, so it cannot take part in two-phase commits",
                    fix="set max_prepared_transactions (e.g. to max_connections) in its postgresql.conf and restart it",
                )
            if int(settings["max_replication_slots"]) == 0:
                raise ClusterError(
                    f"{node} has max_replication_slots=0",
                    fix="set max_replication_slots to at least 2 in its postgresql.conf and restart it",
                )

    def table(self, name: TableRef) -> Table:
        """A table's columns and keys, from the catalog of the coordinator (or front door)."""
        with self.coordinator_connection() as conn:
            # Defaults printed as the toolkit's values are, which a target reads back alike.
            conn.execute(settings_statement(DECODING_SETTINGS))
            if isinstance(name, tuple):
                found = conn.execute(
                    "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s", name).fetchone()
                if found is None:
                    raise ClusterError(f"no table {quoted(*name)} on the {self.coordinator.name}")
                oid = found[0]
            else:
                how = "a name is read as SQL reads it: quote one with capitals or spaces ('\"Order Items\"'), or " \
                      "pass (schema, name)"
                if name.strip().isdigit():  # which regclass would take for an object's id
                    raise ClusterError(f"{name!r} is not a valid table name", fix=how)
                try:
                    oid = conn.execute("SELECT %s::regclass::oid", (name,)).fetchone()[0]  # type: ignore[index]
                except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
                    raise ClusterError(f"no table {name} on the {self.coordinator.name}", fix=how) from None
                except (psycopg.errors.InvalidName, psycopg.errors.SyntaxError, psycopg.errors.FeatureNotSupported):
                    # FeatureNotSupported: a name of three parts, another database's.
                    raise ClusterError(f"{name!r} is not a valid table name", fix=how) from None
            schema, relname, qualified = conn.execute(  # type: ignore[misc]
                "SELECT nspname, relname, quote_ident(nspname) || '.' || quote_ident(relname) "
                "FROM pg_class c JOIN pg_namespace n ON n.oid = relnamespace WHERE c.oid = %s", (oid,)).fetchone()
            columns = conn.execute(
                "SELECT attname, format_type(atttypid, atttypmod), "
                "CASE WHEN attgenerated <> '' THEN pg_get_expr(d.adbin, d.adrelid) END, "
                "CASE WHEN attgenerated = '' THEN pg_get_expr(d.adbin, d.adrelid) END, attidentity = 'a' "
                "FROM pg_attribute a "
                "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
                "WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                (oid,),
            ).fetchall()
            distribution_key = self._distribution_key(conn, oid, qualified)
            pkey = conn.execute(
                "SELECT a.attname FROM pg_index x, unnest(x.indkey) WITH ORDINALITY k(attnum, i) "
                "JOIN pg_attribute a ON a.attnum = k.attnum WHERE x.indrelid = %s AND x.indisprimary "
                "AND a.attrelid = %s ORDER BY k.i",
                (oid, oid),
            ).fetchall()
        return Table(
            name=qualified,
            columns=tuple(c for c, *_ in columns),
            types=tuple(t for _, t, *_ in columns),
            distribution_key=distribution_key,
            primary_key=tuple(c for c, in pkey),
            parts=(schema, relname),
            generated={c: expression for c, _, expression, _, _ in columns if expression is not None},
            defaults={c: default for c, _, _, default, _ in columns if default is not None},
            always_identity=frozenset(c for c, *_, always in columns if always),
        )

    def _distribution_key(self, conn: psycopg.Connection[Any], oid: int, qualified: str) -> tuple[str, ...]:
        distkey = conn.execute(
            "SELECT a.attname FROM gp_distribution_policy p, unnest(p.distkey) WITH ORDINALITY k(attnum, i) "
            "JOIN pg_attribute a ON a.attnum = k.attnum WHERE p.localoid = %s AND a.attrelid = %s ORDER BY k.i",
            (oid, oid),
        ).fetchall()
        if not distkey:
            raise ClusterError(f"table {qualified} has no distribution policy on the coordinator",
                               fix="create it through the toolkit with DISTRIBUTED BY (...)")
        return tuple(c for c, in distkey)

    # -- capturing: what a source needs ---------------------------------------------
    # The bootstrap methods this cluster supports (see gpcdc_toolkit.bootstrap).
    bootstrap_methods: tuple[str, ...] = ("peaceful", "snapshot")
    # Whether slots decode prepared transactions at their PREPARE (two-phase decoding).
    two_phase_decoding = False

    def check_source(self) -> None:
        """Raise ClusterError naming the fix when the cluster cannot be captured."""
        self.check_logical_decoding()

    def local_ddl(self, conn: psycopg.Connection[Any]) -> None:
        """Make DDL on ``conn`` stay on its node (for a node's own publication)."""

    def publication_scope(self, node: Node) -> str:
        """What a node's publication holds: segments every table, the coordinator
        nothing (its records are logical messages)."""
        return "" if node.content == COORDINATOR else "FOR ALL TABLES"

    def decoding_options(self) -> dict[str, str]:
        """pgoutput's options beyond the publication (protocol 1, logical messages)."""
        return {"proto_version": "1", "messages": "true"}

    def translator(self, node: Node, **settings: Any) -> TransactionAssembler:
        """What turns the node's decoding stream into protocol events."""
        return TransactionAssembler(node.content, **settings)

    def gxid_of(self, gid: str) -> int | None:
        """The gxid of a prepared part, from its gid (None: not a distributed transaction's)."""
        from ._dtx import gxid_of

        return gxid_of(gid)

    def unowned_prepared(self) -> list[str]:
        """Prepared transactions that no running distributed transaction owns (they
        would hold a slot's creation back forever), named with their nodes.

        Read prepared, then running, then prepared again: a transaction that prepares or
        finishes meanwhile is not mistaken for an orphan; a real orphan stays put."""
        first = {(node.content, gid): node for node, gid, _ in self.prepared_transactions()}
        if not first:
            return []
        with self.coordinator_connection() as conn:
            running = {r[0] for r in conn.execute("SELECT gp_dist.running_gxids()")}
        still = {(node.content, gid) for node, gid, _ in self.prepared_transactions()}
        return [f"{gid!r} on {node}" for (content, gid), node in sorted(first.items(), key=lambda kv: kv[0])
                if (content, gid) in still and self.gxid_of(gid) not in running]

    @contextmanager
    def commit_pause(self, controller: psycopg.Connection[Any], timeout: float) -> Iterator[DistributedSnapshot | None]:
        """Hold every distributed commit phase back (those in flight finish first) for
        as long as the block runs: a consistent cut. Yields the distributed snapshot at
        the cut, when the cluster has one."""
        controller.execute("SELECT set_config('lock_timeout', %s, false)", (f"{int(timeout * 1000)}ms",))
        controller.execute("SELECT gp_acquire_commit_lock()")
        try:
            # No commit phase and no gxid assignment runs now: xmax before the running set.
            xmax = controller.execute("SELECT gp_dist.next_gxid()").fetchone()[0]  # type: ignore[index]
            running = frozenset(r[0] for r in controller.execute("SELECT gp_dist.running_gxids()"))
            yield DistributedSnapshot(int(xmax), running)
        finally:
            controller.execute("SELECT gp_release_commit_lock()")

    # -- sync points: a cut of the source marked in its stream ---------------------------
    @contextmanager
    def syncpoint_gxid(self) -> Iterator[int]:
        """The gxid of a sync point about to be taken: a distributed transaction's, marked
        running (so that in-doubt resolution knows it) for as long as the block runs."""
        from ._dtx import Session

        with Session(self) as session:
            tx = session.transaction()
            try:
                yield tx.gxid
            finally:
                tx.rollback()  # it wrote nothing through the session; this ends its gxid

    def mark_syncpoint(self, gxid: int, pin: Callable[[], object], lock_timeout: float) -> tuple[float, dict[int, int]]:
        """Cut the source under its commit pause, write the sync point ``gxid`` (a part
        on every segment, a commit record with each node's WAL position) and call
        ``pin`` while nothing that changes a table commits; returns (stall ms, the WAL
        positions). See ``gpcdc_toolkit.validate._syncpoint``."""
        from ._dtx import mark_syncpoint

        return mark_syncpoint(self, gxid, pin, lock_timeout)

    def snapshot_locks(self, tables: Sequence[Table]) -> tuple[sql.Composable, ...]:
        """What a validation's snapshots lock against TRUNCATE and rewrites: the tables."""
        return tuple(t.identifier for t in tables)

    # -- writing: what a replay needs of a target ------------------------------------
    def session(self) -> WriteSession:
        """A session for writing (one distributed transaction at a time)."""
        from ._dtx import Session

        return Session(self)

    def home_of(self, values: Sequence[object]) -> int:
        """The node that takes the writes of rows with these distribution-key values."""
        return segment_for(values, self.segment_count)

    def writer_of(self, content: int) -> int:
        """The node that takes the writes of rows stored on node ``content``."""
        return content

    def resolve_in_doubt(self) -> tuple[list[str], list[str]]:
        """Finish prepared parts that lost their transaction (see ``_dtx.resolve_in_doubt``)."""
        from ._dtx import resolve_in_doubt

        return resolve_in_doubt(self)

    # -- reading the data where it is stored ------------------------------------------
    def relation(self, node: Node, info: Table) -> sql.Composable:
        """What holds a table's rows on a segment: the table itself."""
        return info.identifier

    def misplaced_test(self, node: Node, info: Table) -> sql.Composable | None:
        """A condition on a row ``t`` of :meth:`relation` on ``node``: true when the
        distribution key routes the row elsewhere; None where no such condition can be
        written, so that :meth:`misplaced_rows` has to look. A checksum's first round
        counts with it, in the scan that hashes the rows."""
        if not info.distribution_key:
            return sql.SQL("false")  # randomly distributed: any segment is the right one
        key = sql.SQL(", ").join(output_text(Name("t", c), info.types[info.columns.index(c)])
                                 for c in info.distribution_key)
        return sql.SQL("gp_dist.segment_of({}, VARIADIC ARRAY[{}]) <> {}").format(
            sql.Literal(self.segment_count), key, sql.Literal(node.content))

    def key_index(self, node: Node, conn: psycopg.Connection[Any], info: Table) -> str | None:
        """The unique index by which ``node`` itself keeps ``info``'s primary key unique,
        its columns also NOT NULL there, read from the node's catalog over ``conn``; None
        when it keeps no such index (a validation then counts duplicates and nulls)."""
        return unique_key_index(conn, quoted(*info.parts), info.primary_key)

    def misplaced_rows(self, node: Node, conn: psycopg.Connection[Any], info: Table,
                       select: sql.Composable) -> list[tuple[sql.Composable, tuple[Any, ...]]]:
        """The rows on ``node`` that the distribution key routes elsewhere, each with the
        relation that holds it there and ``select`` over it (as ``t``), found by the node
        itself: its ``gp_dist.segment_of`` routes as :func:`segment_for` does."""
        if not info.distribution_key:
            return []  # randomly distributed: any segment is the right one
        try:
            rows = conn.execute(sql.SQL("SELECT {} FROM {} t WHERE {}").format(
                select, info.identifier, self.misplaced_test(node, info))).fetchall()
        except psycopg.errors.UndefinedFunction:
            raise ClusterError(f"{node} has no gp_dist.segment_of, the routing function every sandbox node has since "
                               "placement is checked in SQL: the sandbox was made by an older version",
                               fix="make the sandbox again (`gpcdc sandbox down --remove`, then `gpcdc sandbox up`)") from None
        return [(info.identifier, row) for row in rows]

    def fetch_all(self, query: str | sql.SQL | sql.Composed, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a read-only query on every segment and return all rows, segment by segment."""
        rows: list[tuple[Any, ...]] = []
        for node in self.segments:
            with self.connect_node(node) as conn:
                rows.extend(conn.execute(query, params).fetchall())
        return rows

    def rows_by_segment(self, table: str) -> dict[int, list[tuple[Any, ...]]]:
        """Every row of a table, keyed by the segment that stores it."""
        info = self.table(table)
        query = sql.SQL("SELECT * FROM {}").format(info.identifier)
        out: dict[int, list[tuple[Any, ...]]] = {}
        for node in self.segments:
            with self.connect_node(node) as conn:
                out[node.content] = conn.execute(query).fetchall()
        return out

    def row_counts(self, table: TableRef) -> dict[int, int]:
        """How many rows of a table each segment stores."""
        query = sql.SQL("SELECT count(*) FROM {}").format(self.table(table).identifier)
        out: dict[int, int] = {}
        for node in self.segments:
            with self.connect_node(node) as conn:
                out[node.content] = int(conn.execute(query).fetchone()[0])  # type: ignore[index]
        return out

    def prepared_transactions(self) -> list[tuple[Node, str, str]]:
        """Every prepared transaction on every node: (node, gid, database)."""
        found = []
        for node in self.nodes:
            with self.connect_node(node) as conn:
                for gid, database in conn.execute("SELECT gid, database FROM pg_prepared_xacts ORDER BY gid"):
                    found.append((node, gid, database))
        return found


def quoted(schema: str, name: str) -> str:
    """A (schema, name) pair as SQL text, both quoted."""
    return sql.Identifier(schema, name).as_string(None)


_SECRETS = (re.compile(r"(password\s*=?\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE),
            re.compile(r"(://[^:/@\s]*:)([^@\s]*)(@)"))


def masked(text: str, dsn: str | None = None) -> str:
    """A DSN, or a message quoting one (``dsn``), with its passwords replaced by ***."""
    source = text if dsn is None else dsn
    secrets = [m.group(2) for pattern in _SECRETS for m in pattern.finditer(source) if m.group(2)]
    for pattern in _SECRETS:
        text = pattern.sub(lambda m: m.group(1) + "***" + (m.group(3) if m.lastindex == 3 else ""), text)
    for secret in secrets:  # quoted elsewhere, e.g. by libpq's complaint
        text = text.replace(secret.strip("'"), "***")

    def part_of_a_secret(token: re.Match[str]) -> str:  # libpq may quote a piece of one
        piece = token.group(1)
        shared = any(piece[i:i + 3] in secret for secret in secrets for i in range(max(1, len(piece) - 2)))
        return '"***"' if piece and shared else token.group(0)

    return re.sub(r'"([^"]*)"', part_of_a_secret, text) if secrets else text


def _where(dsn: str) -> str:
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise ClusterError(f"malformed DSN {masked(dsn)!r} ({masked(first_line(e), dsn)})",
                           fix="use 'host=... port=... dbname=...' or a postgresql:// URL") from None
    return f"{params.get('host', 'localhost')}:{params.get('port', '5432')}"
