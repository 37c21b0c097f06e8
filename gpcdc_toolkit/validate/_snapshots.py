"""A cluster's segments read at one pinned snapshot each.

Every read of a validation goes through a :class:`Snapshots`: one connection per
segment, each in a read-only REPEATABLE READ transaction, so that a comparison's many
queries see one state. The snapshots are pinned by :meth:`Snapshots.pin` (at a sync
point, while nothing commits) or imported from names another process exported (the
Spark mode's workers, a held sync point); exported names are what workers import.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql

from ..cluster import Cluster, Node, Table, settings_statement
from ..errors import GpcdcError
from ..protocol import DECODING_SETTINGS, READING_SETTINGS, parse_lsn

# Values are compared by their text: print them as the stream does, whatever each
# server's defaults, and read the fix's values back as printed.
SESSION = settings_statement({**DECODING_SETTINGS, **READING_SETTINGS})


class Snapshots:
    """One connection per segment of ``cluster``; :meth:`pin` starts their snapshots."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.names: dict[int, str] = {}  # segment content -> exported snapshot name
        self._connections: dict[int, psycopg.Connection[Any]] = {}
        self._relations: dict[tuple[int, str], sql.Composable] = {}
        self._begun = False
        try:
            for node in cluster.segments:
                conn = self._connections[node.content] = cluster.connect_node(node)
                conn.execute(SESSION)
        except BaseException:
            self.close()
            raise

    def begin(self, tables: Sequence[sql.Composable] = ()) -> None:
        """Open every segment's transaction and lock ``tables`` against TRUNCATE and
        rewrites, which a snapshot taken earlier does not survive; the snapshot itself
        starts at :meth:`pin`. Waits for DDL running on those tables to end."""
        if self._begun:
            return
        for conn in self._connections.values():
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if tables:
                conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(sql.SQL(", ").join(tables)))
        self._begun = True

    def pin(self, imported: Mapping[int, str] | None = None) -> dict[int, int]:
        """Start every segment's snapshot (or import the ones named) and export it;
        returns each segment's WAL position at that moment."""
        self.begin()
        lsns = {}
        for content, conn in self._connections.items():
            if imported is not None:
                try:
                    conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(imported[content])))
                except psycopg.Error as e:
                    raise GpcdcError(f"segment {content}'s snapshot {imported[content]!r} cannot be imported: "
                                     f"{str(e).strip().splitlines()[0]}",
                                     fix="the process that holds it has ended; take a new sync point") from None
            name, lsn = conn.execute("SELECT pg_export_snapshot(), pg_current_wal_lsn()::text").fetchone()  # type: ignore[misc]
            self.names[content] = name
            lsns[content] = parse_lsn(lsn)
        return lsns

    def relation(self, node: Node, info: Table) -> sql.Composable:
        """What holds ``info``'s rows on ``node`` (``Cluster.relation``), asked once per
        table: every read of this side sees the same placement of its rows."""
        key = (node.content, info.name)
        if key not in self._relations:
            self._relations[key] = self.cluster.relation(node, info)
        return self._relations[key]

    @property
    def server_version(self) -> int:
        """The lowest ``server_version_num`` of the segments."""
        return min(conn.info.server_version for conn in self._connections.values())

    def connections(self) -> list[psycopg.Connection[Any]]:
        """The segments' connections, in segment order (not necessarily pinned)."""
        return [self._connections[node.content] for node in self.cluster.segments]

    def lost(self) -> list[Node]:
        """The segments whose connection broke (their server went away, or the network)."""
        return [node for node in self.cluster.segments
                if (conn := self._connections.get(node.content)) is not None and conn.broken]

    def segments(self) -> Iterator[tuple[Node, psycopg.Connection[Any]]]:
        """Each segment with its connection, pinned on first use when not yet."""
        if not self.names:
            self.pin()
        for node in self.cluster.segments:
            yield node, self._connections[node.content]

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()  # ends the snapshot's transaction
        self._connections.clear()

    def __enter__(self) -> Snapshots:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
