"""The row-writing statements of a transaction, shared by every kind of target.

A :class:`Writes` builds each statement once (bulk inserts, upserts, deletes by key,
updates, and the move of a row whose distribution key changes) and sends it to the
connection that holds the row: a segment's part of a distributed transaction, or the
one connection of a front door, which routes rows itself.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, LiteralString, Protocol, Self

import psycopg
from psycopg import sql

from .._sql import Name
from ..errors import DistributedTransactionError
from ._cluster import Cluster, Table, TableRef
from ._routing import output_text

Statement = sql.SQL | sql.Composed  # what psycopg runs, built with psycopg.sql


class Catalog(Protocol):
    """What writing needs of a session: tables, and where a key's rows live."""

    def table(self, name: TableRef) -> Table: ...

    def home(self, values: Sequence[object]) -> int: ...


class Writes:
    """A transaction's row writes, routed by distribution key; a subclass names the
    connection of a segment (``_segment``), whether a changed key moves a row
    (``moves``), and how it commits. As a context manager it commits on success and
    rolls back on error."""

    session: Catalog
    state: str  # active, committed, aborted, or in_doubt

    def commit(self) -> None:
        raise NotImplementedError

    def rollback(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.state != "active":
            return
        if exc_type is None:
            self.commit()
        else:
            self.rollback()

    def _segment(self, segment: int) -> psycopg.Connection[Any]:
        raise NotImplementedError

    def moves(self, table: Table, key: Mapping[str, Any], new_key: Mapping[str, Any]) -> bool:
        """Whether a row whose distribution key goes from ``key`` to ``new_key`` must be
        deleted where it is and inserted anew (an UPDATE cannot move it)."""
        return self.route(table, key) != self.route(table, new_key)

    def rewrites(self, table: Table, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
        """Whether a row going from ``old`` to ``new`` (each with the distribution key) is
        deleted and inserted anew: it moves, or ``old`` shows an identity column GENERATED
        ALWAYS changing, which an UPDATE can only set to DEFAULT."""
        return (any(c in old and c in new and new[c] != old[c] for c in table.always_identity)
                or self.moves(table, old, new))

    def execute(self, segment: int, query: str | Statement, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run a statement on one segment inside this transaction; returns its rows."""
        cur = self._segment(segment).execute(sql.SQL(query) if isinstance(query, str) else query, params)
        return cur.fetchall() if cur.description else []

    def route(self, table: Table, row: Mapping[str, Any]) -> int:
        try:
            values = [row[c] for c in table.distribution_key]
        except KeyError as e:
            raise DistributedTransactionError(f"a row for {table.name} lacks distribution-key column {e.args[0]}") from None
        return self.session.home(values)

    def insert(self, table_name: TableRef, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert rows (mappings of column to value); returns the number inserted."""
        table = self.session.table(table_name)
        groups: dict[tuple[int, tuple[str, ...]], list[Mapping[str, Any]]] = defaultdict(list)
        for row in rows:
            groups[(self.route(table, row), tuple(row))].append(row)
        for (segment, columns), seg_rows in groups.items():
            _values(self._segment(segment), insert_into(table, columns), columns, seg_rows, sql.SQL(""))
        return sum(len(r) for r in groups.values())

    def _where(self, table: Table, key: Mapping[str, Any]) -> tuple[sql.Composable, list[Any]]:
        missing = [c for c in table.distribution_key if c not in key]
        if missing:
            raise DistributedTransactionError(
                f"a key for {table.name} must include its distribution key; missing {', '.join(missing)}"
            )
        clause = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(Name(c)) for c in key)
        return clause, list(key.values())

    def update(self, table_name: TableRef, key: Mapping[str, Any], values: Mapping[str, Any]) -> int:
        """Update the rows matching ``key`` (which includes the distribution key).

        When ``values`` changes the distribution key so that the row belongs on another
        segment, the row moves: deleted on its segment, inserted on the new one. So is a
        row whose identity column GENERATED ALWAYS holds another value than ``values``
        gives it (the source set it anew), which no UPDATE may write.
        """
        table = self.session.table(table_name)
        where, params = self._where(table, key)
        segment = self.route(table, key)
        if self.rewrites(table, key, {**key, **values}):
            return self._rewrite(table_name, table, segment, where, params, values)
        assign, values_set = assignments(table, key, values)
        held = [c for c in table.always_identity if c in values and c not in key]  # which the row must hold already
        guard = sql.SQL("").join(sql.SQL(" AND {} IS NOT DISTINCT FROM %s").format(Name(c)) for c in held)
        query = sql.SQL("UPDATE {} SET {} WHERE {}{}").format(table.identifier, assign, where, guard)
        count = self._segment(segment).execute(query, [*values_set, *params, *(values[c] for c in held)]).rowcount
        if count or not held:
            return count
        return self._rewrite(table_name, table, segment, where, params, values)

    def _rewrite(self, table_name: TableRef, table: Table, segment: int, where: sql.Composable, params: list[Any],
                 values: Mapping[str, Any]) -> int:
        """Delete the rows ``where`` finds on ``segment`` and insert them with ``values``
        over them (where their key sends them); returns how many."""
        # As PostgreSQL's text: written back, every type reads as it was (a jsonb string,
        # an array, bytes), which Python values of some types would not.
        deleted = self.execute(
            segment,
            sql.SQL("DELETE FROM {} WHERE {} RETURNING {}").format(
                table.identifier, where, sql.SQL(", ").join(
                    output_text(Name(c), table.types[table.columns.index(c)]) for c in table.writable)),
            params,
        )
        moved = [{**dict(zip(table.writable, row)), **values} for row in deleted]
        return self.insert(table_name, moved)

    def delete(self, table_name: TableRef, key: Mapping[str, Any]) -> int:
        table = self.session.table(table_name)
        where, params = self._where(table, key)
        query = sql.SQL("DELETE FROM {} WHERE {}").format(table.identifier, where)
        return self._segment(self.route(table, key)).execute(query, params).rowcount

    def upsert(self, table_name: TableRef, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert rows, or overwrite the row with the same primary key; in bulk, multi-row
        statements per segment and column set. Returns the rows written."""
        table = self.session.table(table_name)
        if not table.primary_key:
            raise DistributedTransactionError(f"cannot upsert into {table.name}: it has no primary key")
        groups: dict[tuple[int, tuple[str, ...]], list[Mapping[str, Any]]] = defaultdict(list)
        for row in rows:
            groups[(self.route(table, row), tuple(row))].append(row)
        for (segment, columns), seg_rows in groups.items():
            others = [c for c in columns if c not in table.primary_key and c not in table.always_identity]
            if held := [c for c in columns if c in table.always_identity and c not in table.primary_key]:
                # Which ON CONFLICT's update cannot set either: a row holding another value
                # (the source set it anew) is deleted first, and inserted below.
                self._delete_unless_holding(table, segment, held, seg_rows)
            action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(Name(c)) for c in others)) if others else sql.SQL("DO NOTHING")
            tail = sql.SQL(" ON CONFLICT ({}) {}").format(sql.SQL(", ").join(map(Name, table.primary_key)),
                                                          action)
            _values(self._segment(segment), insert_into(table, columns), columns, seg_rows, tail)
        return sum(len(r) for r in groups.values())

    def _delete_unless_holding(self, table: Table, segment: int, columns: Sequence[str],
                               rows: Sequence[Mapping[str, Any]]) -> None:
        """Delete the rows of ``rows``' primary keys that do not hold their values of ``columns``."""
        where, _ = self._where(table, {c: None for c in table.primary_key})
        differs = sql.SQL(" OR ").join(sql.SQL("{} IS DISTINCT FROM %s").format(Name(c)) for c in columns)
        query = sql.SQL("DELETE FROM {} WHERE {} AND ({})").format(table.identifier, where, differs)
        with self._segment(segment).cursor() as cur:
            cur.executemany(query, [[*(r[c] for c in table.primary_key), *(r[c] for c in columns)] for r in rows])

    def held(self, table_name: TableRef, keys: Sequence[Mapping[str, Any]]) -> list[bool]:
        """Whether the target holds the row of each primary key of ``keys`` (each
        including the distribution key), in bulk. A row found stays locked against
        deletes and key changes until the transaction ends, so that what was found still
        holds when it writes."""
        return self._per_key(table_name, keys, "SELECT 1 FROM {} WHERE {} FOR KEY SHARE")

    def delete_keys(self, table_name: TableRef, keys: Sequence[Mapping[str, Any]]) -> list[bool]:
        """Delete the rows with these keys (each including the distribution key), in
        bulk. Returns, per key, whether it found a row."""
        return self._per_key(table_name, keys, "DELETE FROM {} WHERE {}")

    def _per_key(self, table_name: TableRef, keys: Sequence[Mapping[str, Any]], statement: LiteralString) -> list[bool]:
        """Run ``statement`` (its table and key condition left as ``{}``) for each key:
        one pipelined statement per segment and key shape. Returns, per key, whether its
        statement met a row."""
        table = self.session.table(table_name)
        groups: dict[tuple[int, tuple[str, ...]], list[int]] = defaultdict(list)
        for i, key in enumerate(keys):
            groups[(self.route(table, key), tuple(key))].append(i)
        found = [False] * len(keys)
        for (segment, columns), positions in groups.items():
            where, _ = self._where(table, keys[positions[0]])
            query = sql.SQL(statement).format(table.identifier, where)
            with self._segment(segment).cursor() as cur:
                cur.executemany(query, [[keys[i][c] for c in columns] for i in positions], returning=True)
                for i in positions:  # each statement's own result: the rows it returned or changed
                    found[i] = cur.rowcount > 0
                    cur.nextset()
        return found


def insert_into(table: Table, columns: Sequence[str]) -> sql.Composed:
    """``INSERT INTO table (columns) VALUES``, overriding the system's value where the
    table has an identity column GENERATED ALWAYS: a replica writes the source's."""
    overriding = sql.SQL(" OVERRIDING SYSTEM VALUE") if table.always_identity else sql.SQL("")
    return sql.SQL("INSERT INTO {} ({}){} VALUES ").format(
        table.identifier, sql.SQL(", ").join(map(Name, columns)), overriding)


def assignments(table: Table, old: Mapping[str, Any], values: Mapping[str, Any]) -> tuple[sql.Composable, list[Any]]:
    """The ``SET`` list writing ``values`` over a row that held ``old``. A distribution-key
    column whose value stays is left out, since a front door (Citus) refuses to set one
    at all, and so is every identity column GENERATED ALWAYS (which only DEFAULT may set:
    a row whose value changes is written anew, see ``Writes.update``); an update left
    with nothing to set sets a plain column to itself, so that it still finds, and
    counts, its row."""
    changed = {c: v for c, v in values.items() if c not in table.always_identity
               and (c not in table.distribution_key or c not in old or v != old[c])}
    if not changed:
        itself = next((c for c in (*values, *table.columns) if c not in table.always_identity and c not in table.generated),
                      None)
        if itself is None:
            raise DistributedTransactionError(f"{table.name} has no column an UPDATE may set to itself")
        return sql.SQL("{0} = {0}").format(Name(itself)), []
    return (sql.SQL(", ").join(sql.SQL("{} = %s").format(Name(c)) for c in changed),
            list(changed.values()))


# Rows per INSERT statement: as many as keep its parameters within the number whose
# parsing psycopg caches (50); such statements go pipelined, one executemany per chunk
# size. One statement per row costs a protocol round of its own per row; one statement
# of thousands of rows is parsed again, in Python, at every execution.
_CACHED_PARAMETERS = 50


def _values(conn: psycopg.Connection[Any], head: sql.Composable, columns: Sequence[str],
            rows: Sequence[Mapping[str, Any]], tail: sql.Composable) -> None:
    """``head VALUES (row), (row), ... tail`` for every row, a few rows per statement."""
    per = max(1, _CACHED_PARAMETERS // max(1, len(columns)))
    around = (head.as_bytes(conn), tail.as_bytes(conn))
    whole = len(rows) - len(rows) % per
    chunks = [rows[i:i + per] for i in range(0, whole, per)]
    with conn.cursor() as cur:
        if chunks:
            cur.executemany(_statement(*around, len(columns), per),
                            [[r[c] for r in chunk for c in columns] for chunk in chunks])
        if whole < len(rows):
            rest = rows[whole:]
            cur.execute(_statement(*around, len(columns), len(rest)), [r[c] for r in rest for c in columns])


@functools.lru_cache(maxsize=256)
def _statement(head: bytes, tail: bytes, columns: int, rows: int) -> bytes:
    row = b"(" + b", ".join([b"%s"] * columns) + b")"
    return head + b", ".join([row] * rows) + tail


class WriteSession(Catalog, Protocol):
    """What a replay writes through: transactions one at a time, and DDL (with more
    writes in its transaction, by ``then``), at a sandbox's segments or a front door."""

    @property
    def cluster(self) -> Cluster: ...

    def transaction(self) -> Writes: ...

    def ddl(self, statement: str, *, timeout: float = 60.0, then: Callable[[Writes], object] | None = None) -> int: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...
