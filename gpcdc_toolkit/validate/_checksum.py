"""A table on the target compared with the source by checksums computed in each
database: rows leave the databases only where their chunk differs.

Every segment of both clusters computes, per chunk of the key space (``_chunks``), a
row count and the sum of a 64-bit hash of each row (``ROW_HASHES``: values that print
differently never hash alike; NULL and '' differ, floats compare exactly as printed,
1.0 and 1.00 differ). Chunks that differ are bisected until they hold
few rows; those rows are fetched and diffed: by primary key (rows missing, extra,
changed, with the changed columns), or as a multiset for a table without one. The
statements that would make the target equal are produced per target node (where each
row lives, or where the target's distribution sends it), quoted by psycopg's ``sql``
module; nothing is applied.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from .._sql import Name
from ..cluster import COORDINATOR, Cluster, Node, TableRef, quoted
from ..cluster._cluster import Table
from ..cluster._routing import output_text
from ..cluster._writes import insert_into
from ..errors import ClusterError, GpcdcError
from ..sandbox._functions import ROW_HASH_SYMBOL
from ._chunks import (
    EMPTY,
    LEVELS,
    MOD,
    Chunk,
    Digest,
    LoneRow,
    Reply,
    bisect,
    differing,
    first_level,
    lone_rows,
    settled,
    summed,
    without,
    xored,
)
from ._diff import EXAMPLES, DifferingRow, TableDiff, Text
from ._snapshots import SESSION, Snapshots

FETCH_ROWS = 1000  # bisect until a differing chunk holds at most this many rows
_FIX_SESSION = [setting.replace("SET ", "SET LOCAL ", 1) for setting in SESSION.split("; ")]  # for its transaction alone

# The steps of a node's fix, in the order they run: every delete first, so that no
# insert meets a copy still there (under a unique index), then the updates, then the inserts.
DELETE, UPDATE, INSERT = 0, 1, 2


@dataclass(frozen=True)
class Fix:
    """One statement of a table's fix: the differing row it mends, the target node it
    runs on, and its step (``DELETE``, ``UPDATE`` or ``INSERT``)."""

    row: DifferingRow
    node: int
    step: int
    statement: sql.Composable


class ValidationError(GpcdcError):
    """A table cannot be compared (it differs in shape between source and target)."""


def target_table(target: Cluster, table: TableRef) -> Table:
    """The target's table of a source table's name; one the target lacks, said so."""
    try:
        return target.table(table)
    except ClusterError:
        name = quoted(*table) if isinstance(table, tuple) else table
        raise ValidationError(f"the target has no table {name}, which the source has",
                              fix="replay creates it (its initial load, or the stream's CREATE TABLE); or leave it "
                                  "out by naming the tables to compare with --tables") from None


@dataclass(frozen=True)
class ChecksumResult:
    table: str
    diff: TableDiff
    rounds: int  # bisection levels measured
    chunks: int  # chunks whose rows were fetched
    fetched: int  # rows fetched from both sides
    seconds: float
    fix: dict[int, list[str]] = field(default_factory=dict)  # target node content -> statements
    schema: tuple[str, ...] = ()  # how the target's definition differs beyond its rows (column defaults)
    # Per bisection round: (level, chunks measured, chunks differing); at level 1 the
    # differing include the chunks then settled by key.
    levels: tuple[tuple[int, int, int], ...] = ()
    parts: tuple[str, str] = ("", "")  # (schema, name) as the catalog has them
    settled: int = 0  # first-level chunks whose one differing row was looked up by its key
    columns: tuple[str, ...] = ()  # of the rows in diff.rows
    key_columns: tuple[str, ...] = ()  # of their keys: the primary key, or every column

    def differing_rows(self, causes: Sequence[tuple[str | None, str, str | None]] | None = None) -> list[dict[str, Any]]:
        """Every differing row as a record: its key and each side's row as JSON objects
        of column to text, the changed columns, the segments, and its cause with what
        shows it and the source events that wrote its key (``causes``, one (cause,
        detail, events as JSON) per row; none: not classified)."""
        import json

        def obj(names: Sequence[str], values: Sequence[str | None] | None) -> str | None:
            return None if values is None else json.dumps(dict(zip(names, values)))

        return [{"table": self.table, "kind": row.kind, "key": obj(self.key_columns, row.key),
                 "key_text": ", ".join(f"{c}={'NULL' if v is None else v}" for c, v in zip(self.key_columns, row.key)),
                 "changed_columns": list(row.columns), "source": obj(self.columns, row.source),
                 "target": obj(self.columns, row.target), "source_segment": row.source_segment,
                 "target_segment": row.target_segment, "cause": cause, "cause_detail": detail, "events": events}
                for row, (cause, detail, events) in zip(self.diff.rows,
                                                        causes or [(None, "", None)] * len(self.diff.rows))]

    @property
    def equal(self) -> bool:
        return self.diff.equal and not self.schema

    def lines(self) -> list[str]:
        """What differs, for a terminal: the rows' line, then each schema difference."""
        return [self.diff.line(), *(f"{self.table}: {what}" for what in self.schema)]

    def fix_lines(self, target: Cluster) -> list[str]:
        """The fix as SQL lines, one section per target node (none when equal)."""
        lines = [f"-- Statements that would make {self.table} on the target equal to the source.",
                 "-- Review them; nothing was applied. Run each section on the node it names."]
        for content in sorted(self.fix):
            node = target.nodes[content + 1]
            lines += ["", f"-- node: {node}", "BEGIN;", *(s + ";" for s in self.fix[content]), "COMMIT;"]
        return lines

    def write_fix(self, path: Path, target: Cluster) -> None:
        """The fix as a SQL file (see :meth:`fix_lines`)."""
        path.write_text("\n".join(self.fix_lines(target)) + "\n")


def _row(info: Table) -> sql.Composable:
    return sql.SQL("ROW({})::text").format(sql.SQL(", ").join(Name(c) for c in info.columns))


def _texts(info: Table) -> sql.Composable:
    """Each column's text as its type prints it: the text a row is routed by (a key's
    cast to text is not always it) and written back from."""
    return sql.SQL(", ").join(output_text(Name(c), t) for c, t in zip(info.columns, info.types))


# Types whose own extended hash is equality as their text shows it: hashed as they are.
# Any other is hashed by its text, so that values that print differently never pass for
# equal: floats and numerics (1.0 and 1.00), jsonb and arrays (whose hashes ignore
# nesting and bounds), json, character(n), intervals... Text is hashed under "C", in
# case a column's collation is nondeterministic.
_HASHED_AS_IS = ("smallint", "integer", "boolean", "date", "uuid", "bytea")
# 64-bit types whose own hash folds the value to 32 bits before hashing it
# (``hashint8extended``: 1 and 4294967296 hash alike): hashed by the 8 bytes their send
# function gives.
_HASHED_SENT = {"bigint": "int8send", "timestamp without time zone": "timestamp_send",
                "timestamp with time zone": "timestamptz_send"}
_TEXT = ("text", "character varying")

# How a row is hashed, fastest first; a comparison uses the first that every segment of
# both sides can compute, since both must hash alike:
#   stored: ``gp_dist.row_hash`` (the sandbox's C function): the bytes each value is
#           stored as where they are its value, else its text;
#   record: ``hash_record_extended`` over the columns (PostgreSQL 14+), by their types'
#           hash functions where those see what the text shows, else by the text;
#   text:   the row's whole text.
ROW_HASHES = ("stored", "record", "text")
# ``record`` as sync points were recorded until 2026-11-28: 64-bit integers and
# timestamps by their own hashes, the row's hash hashed again by ``hashint8extended``,
# each folding 64 bits to 32. Computed only to check such a record; never offered.
RECORD_32 = "record-32"
_STORED = sql.SQL("""(SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure('gp_dist.row_hash("any")')) = {}"""
                  ).format(sql.Literal(ROW_HASH_SYMBOL))  # the form this toolkit's sandboxes compute
_CHUNKED = sql.SQL("to_regprocedure('gp_dist.chunk_digests(bigint,bigint)') IS NOT NULL")
# A key the first level's digests XOR together (``_chunks.LoneRow``): one column of these.
_INTEGER_KEYS = ("smallint", "integer", "bigint")
_MAX_ARGUMENTS = 100  # PostgreSQL's FUNC_MAX_ARGS: wider rows are hashed in runs of columns


def _column_for_hash(column: str, type_name: str, form: str) -> sql.Composable:
    # The name as the catalog prints it: an array's brackets follow the element's
    # modifier ("character varying(8)[]"), which cutting at "(" would drop, leaving the
    # array to its own hash (blind to bounds and nesting). Records of before were
    # written that way, and are checked as they were written.
    array = type_name.endswith("]") and form != RECORD_32
    base = "array" if array else type_name.split("(")[0]
    if base in _HASHED_AS_IS or (form == RECORD_32 and base in _HASHED_SENT):
        return Name(column)
    if base in _HASHED_SENT:
        return sql.SQL("{}({})").format(sql.SQL(_HASHED_SENT[base]), Name(column))
    if base in _TEXT:
        return sql.SQL('{} COLLATE "C"').format(Name(column))
    return sql.SQL("{}::text").format(Name(column))


def row_hashes(side: Snapshots) -> tuple[str, ...]:
    """The row hashes (``ROW_HASHES``) that every segment of ``side`` computes."""
    offered = ["text"]
    if side.server_version >= 140000:
        offered.append("record")
    if _on_every_segment(side, _STORED):
        offered.append("stored")
    return tuple(h for h in ROW_HASHES if h in offered)


def _on_every_segment(side: Snapshots, test: sql.Composable) -> bool:
    return all(conn.execute(sql.SQL("SELECT {}").format(test)).fetchone()[0]  # type: ignore[index]
               for _node, conn in side.segments())


def _integer_key(info: Table) -> str | None:
    """The table's key where it is one integer column, whose value the first level's
    digests carry: a chunk's lone row is then looked up by it."""
    if len(info.primary_key) == 1 and info.types[info.columns.index(info.primary_key[0])] in _INTEGER_KEYS:
        return info.primary_key[0]
    return None


def _keyed(source: Snapshots, target: Snapshots, info: Table) -> str | None:
    """The integer key whose XOR the first level's digests carry, where both sides can
    XOR it (the sandbox's aggregate; ``bit_xor``, PostgreSQL 14+)."""
    return _integer_key(info) if min(source.server_version, target.server_version) >= 140000 else None


def first_level_in_one_pass(side: Snapshots) -> bool:
    """Whether every segment of ``side`` computes the first level's chunk digests in one
    pass (``gp_dist.chunk_digests``, the sandbox's), rather than by grouping."""
    return _on_every_segment(side, _CHUNKED)


def _row_hash(info: Table, form: str) -> sql.Composable:
    """A row's 64-bit hash, as ``form`` (one of ``ROW_HASHES``, or ``RECORD_32``)
    computes it.

    ``hash_record_extended`` is linear (31 times the hash so far, plus the next
    column's), so sums of it over rows would not see values swapped between rows: each
    row's hash is hashed again, as 8 bytes, before it is summed. ``gp_dist.row_hash``
    folds the whole row into one state and finalizes it, which is not linear."""
    if form == "stored" and not info.columns:  # a function needs an argument: ROW() has none
        form = "record"
    if form == "stored":
        columns: list[sql.Composable] = [Name(c) for c in info.columns]
        hashed = sql.SQL("gp_dist.row_hash({})").format(sql.SQL(", ").join(columns[:_MAX_ARGUMENTS]))
        for start in range(_MAX_ARGUMENTS, len(columns), _MAX_ARGUMENTS - 1):  # the hash so far, then the next run
            hashed = sql.SQL("gp_dist.row_hash({})").format(
                sql.SQL(", ").join([hashed, *columns[start:start + _MAX_ARGUMENTS - 1]]))
        return hashed
    if form in ("record", RECORD_32):
        columns = [_column_for_hash(c, t, form) for c, t in zip(info.columns, info.types)]
        record = sql.SQL("hash_record_extended(ROW({}), 0)").format(sql.SQL(", ").join(columns))
        if form == RECORD_32:
            return sql.SQL("hashint8extended({}, 0)").format(record)
        return sql.SQL("hash_record_extended(ROW(int8send({})), 0)").format(record)
    if form == "text":
        return sql.SQL("hashtextextended({}, 0)").format(_row(info))
    raise ValueError(f"a row hash is one of {', '.join(ROW_HASHES)}, not {form!r}")


def _prefix(shift: int) -> sql.Composable:
    """A chunk's prefix from the row hash (bigint): unsigned, except at the last level."""
    if shift == 64:
        return sql.SQL("0")
    if shift == 0:
        return sql.SQL("gpcdc_row_hash")
    return sql.SQL("((gpcdc_row_hash >> {}) & {})").format(sql.Literal(shift), sql.Literal((1 << (64 - shift)) - 1))


def _signed(prefix: int, shift: int) -> int:
    return prefix - MOD if shift == 0 and prefix >= 1 << 63 else prefix


def _within(query: sql.Composed, chunks: Sequence[Chunk]) -> sql.Composed:
    """``query`` (over rows with their ``gpcdc_row_hash``) limited to the rows of ``chunks``."""
    if not chunks or chunks[0].level == 0:
        return query
    shift = chunks[0].shift
    # A constant, not a parameter: the server then looks each row's prefix up in a hash
    # table of them, rather than comparing it with every one.
    prefixes = sql.Literal("{" + ",".join(str(_signed(c.prefix, shift)) for c in chunks) + "}")
    return sql.SQL("{} WHERE {} = ANY({}::bigint[])").format(query, _prefix(shift), prefixes)


def _digests(side: Snapshots, info: Table, hashed: sql.Composable, level: int,
             parents: tuple[Chunk, ...], misplaced: Mapping[int, sql.Composable | None] | None = None,
             one_pass: bool = False, key: str | None = None) -> list[Query]:
    """Each segment's query for its chunks' digests at ``level``: rows (prefix, count,
    sum of hashes), given an integer ``key`` column the XOR of the rows' keys too; or
    with ``one_pass`` (level 1) one row of ``gp_dist.chunk_digests`` (of the keys, or of
    0); and, given ``misplaced`` (a segment's test of a row's placement), a last column:
    how many rows the test found misplaced."""
    shift = 64 - level * 16
    digests = (sql.SQL("gp_dist.chunk_digests(gpcdc_row_hash, gpcdc_key)") if one_pass else
               sql.SQL("{} AS prefix, count(*), sum(gpcdc_row_hash)::text{}").format(
                   _prefix(shift), sql.SQL(", bit_xor(gpcdc_key)") if key else sql.SQL("")))
    # A NULL key (only where a segment's table lost its NOT NULL) counts as 0: its chunk's
    # guess is then wrong, fails its proof and is bisected.
    carried = (sql.SQL(", {} AS gpcdc_key").format(
        sql.SQL("coalesce({}::bigint, 0)").format(Name(key)) if key else sql.SQL("0::bigint"))
        if one_pass or key else sql.SQL(""))
    # Grouped, the hash is named twice (prefix and sum): OFFSET 0 keeps the subquery
    # whole, or pulled up, its hash would be computed twice. Named once, the subquery is
    # left to be pulled up, so that each of a segment's parallel workers adds its share:
    # kept whole, its rows would all be summed by one process.
    whole = sql.SQL(" OFFSET 0") if level and not one_pass else sql.SQL("")
    queries = []
    for node, conn in side.segments():
        test = (misplaced or {}).get(node.content)
        counted = sql.SQL(", count(*) FILTER (WHERE gpcdc_misplaced)") if test is not None else sql.SQL("")
        tested = sql.SQL(", {} AS gpcdc_misplaced").format(test) if test is not None else sql.SQL("")
        query = _within(sql.SQL("SELECT {}{} FROM (SELECT {} AS gpcdc_row_hash{}{} FROM {} t{}) s").format(
            digests, counted, hashed, carried, tested,
            side.relation(node, info), whole), parents)
        if level and not one_pass:
            query = sql.SQL("{} GROUP BY 1").format(query)
        queries.append((conn, query))
    return queries


def whole_digest(side: Snapshots, info: Table, form: str) -> Digest:
    """A table's digest as ``side`` reads it: its rows' count and hashes' sum, by row
    hash ``form`` (the first round of a comparison)."""
    results = _run_all(_digests(side, info, _row_hash(info, form), 0, ()))
    return summed(_digest_rows(0, rows) for rows in results).get(0, EMPTY)


def _digest_rows(level: int, rows: list[tuple[Any, ...]]) -> list[tuple[int, int, int]]:
    """(prefix, rows, sum of hashes) of each chunk a node reported, as ``summed`` takes them."""
    if level == LEVELS:  # the prefix is the whole hash: signed in SQL
        return [(prefix % MOD, count, int(total or 0)) for prefix, count, total, *_ in rows]
    return [(prefix, count, int(total or 0)) for prefix, count, total, *_ in rows]


Query = tuple[psycopg.Connection[Any], sql.Composed]
FetchedRow = tuple[int, tuple[str | None, ...], str]  # (node content, the row's columns as text, its text)
Fetched = list[FetchedRow]


def _run_all(queries: list[Query]) -> list[list[tuple[Any, ...]]]:
    """Run each query on its connection, all at once (one thread per connection)."""
    def run(query: Query) -> list[tuple[Any, ...]]:
        conn, statement = query
        # Binary: a node's chunk digests come as their bytes, not as hexadecimal text twice their size.
        return conn.execute(statement, binary=True).fetchall()

    if len(queries) == 1:
        return [run(queries[0])]
    with ThreadPoolExecutor(len(queries)) as pool:
        return list(pool.map(run, queries))


def _fetch(side: Snapshots, info: Table, hashed: sql.Composable,
           chunks: list[Chunk]) -> list[Query]:
    """Queries for the rows of ``chunks``: each row's columns as text, then its text."""
    columns = _texts(info)
    queries = []
    for shift in sorted({c.shift for c in chunks}):
        for node, conn in side.segments():
            query = _within(sql.SQL("SELECT {}, {} FROM (SELECT *, {} AS gpcdc_row_hash FROM {} t) s").format(
                columns, _row(info), hashed, side.relation(node, info)), [c for c in chunks if c.shift == shift])
            queries.append((conn, query))
    return queries


def _fetched(side: Snapshots, chunks: list[Chunk], results: list[list[tuple[Any, ...]]]) -> Fetched:
    """(node content, the row's columns as text, the row's text) from ``_fetch``'s results."""
    nodes = [node.content for _shift in sorted({c.shift for c in chunks}) for node in side.cluster.segments]
    return [(node, tuple(row[:-1]), row[-1]) for node, rows in zip(nodes, results) for row in rows]


def _under_keys(side: Snapshots, info: Table, keys: Sequence[Text], hashed: sql.Composable) -> list[Query]:
    """Queries for every row under ``keys`` (primary-key values as text) on every node of
    ``side``, found through the key's index rather than by reading the table: each row's
    columns as text, its text and its hash."""
    columns = _texts(info)
    whole = [k for k in keys if None not in k]
    tests: list[sql.Composable] = []
    # Each key column's values as one array, so that the server looks them up in a hash
    # of them (= ANY) or joins them (unnest), rather than testing each row against each key.
    types = [info.types[info.columns.index(c)] for c in info.primary_key]

    def array(i: int, of: str) -> sql.Composable:
        return sql.SQL("ARRAY[{}]::{}[]").format(sql.SQL(", ").join(sql.Literal(k[i]) for k in whole), sql.SQL(of))

    if whole and len(types) == 1 and not types[0].endswith("]"):
        tests.append(sql.SQL("{} = ANY({})").format(Name(info.primary_key[0]), array(0, types[0])))
    elif whole:  # each value cast alone: an array's text is no element of an array of arrays
        names = [Name(f"k{i}") for i in range(len(types))]
        tests.append(sql.SQL("({}) IN (SELECT {} FROM unnest({}) u({}))").format(
            sql.SQL(", ").join(map(Name, info.primary_key)),
            sql.SQL(", ").join(sql.SQL("{}::{}").format(n, sql.SQL(t)) for n, t in zip(names, types)),
            sql.SQL(", ").join(array(i, "text") for i in range(len(types))), sql.SQL(", ").join(names)))
    # A NULL in a key (a segment's table lost its NOT NULL) is found by IS NULL, which = never matches.
    tests += [_where(info, info.primary_key, k) for k in keys if None in k]
    return [(conn, sql.SQL("SELECT {}, {}, {} FROM {} t WHERE {}").format(
                columns, _row(info), hashed, side.relation(node, info), sql.SQL(" OR ").join(tests)))
            for node, conn in side.segments()]


def _looked_up(sides: tuple[Snapshots, Snapshots], infos: tuple[Table, Table], hashes: tuple[sql.Composable, sql.Composable],
               keys: Sequence[Text]) -> tuple[list[tuple[FetchedRow, int]], list[tuple[FetchedRow, int]]]:
    """Every row of both sides under ``keys``, each with its hash."""
    queries = [_under_keys(side, info, keys, hashed) for side, info, hashed in zip(sides, infos, hashes)]
    results = iter(_run_all(queries[0] + queries[1]))
    found: tuple[list[tuple[FetchedRow, int]], list[tuple[FetchedRow, int]]] = ([], [])
    for side in (0, 1):
        for node, _conn in sides[side].segments():
            found[side].extend(((node.content, tuple(columns), text), row_hash) for *columns, text, row_hash in next(results))
    return found


def _settle(sides: tuple[Snapshots, Snapshots], infos: tuple[Table, Table], hashes: tuple[sql.Composable, sql.Composable],
            key: str, lone: dict[int, LoneRow]) -> tuple[set[int], tuple[Fetched, Fetched]]:
    """The lone rows looked up by their ``key`` column on every node of both sides: the
    chunks ``settled`` proves, and each side's rows under those chunks' keys."""
    at = infos[0].columns.index(key)
    rows = _looked_up(sides, infos, hashes, [(str(k),) for k in sorted({row.key for row in lone.values()})])
    found: tuple[dict[int, list[int]], dict[int, list[int]]] = ({}, {})
    for side in (0, 1):
        for (_node, columns, _text), row_hash in rows[side]:
            found[side].setdefault(int(columns[at]), []).append(row_hash % MOD)  # type: ignore[arg-type]
    proven = settled(lone, found)
    keys_settled = {str(lone[prefix].key) for prefix in proven}
    source_rows, target_rows = ([r for r, _hash in side_rows if r[1][at] in keys_settled] for side_rows in rows)
    return proven, (source_rows, target_rows)


def _every_copy(sides: tuple[Snapshots, Snapshots], infos: tuple[Table, Table], hashes: tuple[sql.Composable, sql.Composable],
                fetched: tuple[Fetched, Fetched], known: tuple[Fetched, Fetched]) -> tuple[Fetched, Fetched]:
    """Each side's rows of the fetched chunks, with every other row under the keys whose
    fetched rows differ, joined to the rows ``known`` already (settled by key: every
    copy). A key held twice, where a node lost its unique index, may have a copy in a
    chunk that did not differ; a key whose rows were all fetched alike on both sides
    has none such (its other copy's chunk would differ)."""
    at = [infos[0].columns.index(c) for c in infos[0].primary_key]
    have = {tuple(r[1][i] for i in at) for side in known for r in side}
    under: tuple[dict[Text, Counter[Text]], dict[Text, Counter[Text]]] = ({}, {})
    for side, rows in zip(under, fetched):
        for _node, row, _text in rows:
            side.setdefault(tuple(row[i] for i in at), Counter())[row] += 1
    keys = sorted((k for k in under[0].keys() | under[1].keys() if k not in have and under[0].get(k) != under[1].get(k)),
                  key=repr)
    looked = _looked_up(sides, infos, hashes, keys) if keys else ([], [])
    return (_joined(fetched[0], known[0] + [r for r, _hash in looked[0]]),
            _joined(fetched[1], known[1] + [r for r, _hash in looked[1]]))


def _joined(fetched: Fetched, looked_up: Fetched) -> Fetched:
    """Rows of fetched chunks and rows looked up by key, each row once: a looked-up row may
    be in a fetched chunk too. Copies of one row on one node (where a node holds a key
    twice) hash alike, so they are in the same chunk, whose fetch brings every node's
    rows of it: ``fetched`` holds them all, and only looked-up rows are dropped."""
    have = set(fetched)
    return fetched + [row for row in looked_up if row not in have]


def _check_shapes(source: Table, target: Table) -> None:
    if source.columns != target.columns or source.types != target.types:
        raise ValidationError(
            f"{source.name} has columns {list(zip(source.columns, source.types))} on the source and "
            f"{list(zip(target.columns, target.types))} on the target", fix="make the target's table match first")
    if source.primary_key != target.primary_key:
        raise ValidationError(f"{source.name} has primary key {list(source.primary_key)} on the source and "
                              f"{list(target.primary_key)} on the target", fix="make the target's table match first")


def _schema(source: Table, target: Table) -> tuple[list[str], list[sql.Composed]]:
    """Column defaults that differ, and the statements that would set the source's.

    The defaults are the source catalog's own expressions, written into the fix as they
    are: review them before running it."""
    said, statements = [], []
    for column in source.columns:
        want, have = source.defaults.get(column), target.defaults.get(column)
        if want != have:
            said.append(f"column {column!r} defaults to {have or 'NULL'} on the target, {want or 'NULL'} on the source")
            change = sql.SQL("SET DEFAULT {}").format(sql.SQL(want)) if want is not None else sql.SQL("DROP DEFAULT")
            statements.append(sql.SQL("ALTER TABLE {} ALTER COLUMN {} {}").format(
                target.identifier, Name(column), change))
    return said, statements


def compare_checksums(source: Cluster | Snapshots, target: Cluster | Snapshots, table: TableRef, *,
                      fetch_rows: int = FETCH_ROWS, placement: bool = True,
                      row_hash: str | None = None) -> ChecksumResult:
    """Compare one table, source against target: each side read at its ``Snapshots``
    (a sync point's), or, given a cluster, at snapshots taken now on its segments one
    after the other (equal then only when neither side changes meanwhile). With
    ``placement``, every target row's distribution key is also read, to find rows on
    a segment their key does not name (the sums cannot see where a row is). Rows are
    hashed by ``row_hash`` (one of ``ROW_HASHES``), by default the fastest both sides
    compute."""
    with ExitStack() as stack:
        sides = [side if isinstance(side, Snapshots) else stack.enter_context(Snapshots(side))
                 for side in (source, target)]
        return _compare(sides[0], sides[1], table, fetch_rows, placement, _common_hash(sides[0], sides[1], row_hash))


def _common_hash(source: Snapshots, target: Snapshots, wanted: str | None) -> str:
    offered = row_hashes(target)
    both = [h for h in row_hashes(source) if h in offered]
    if wanted is None:
        return both[0]  # every server hashes rows by their text
    if wanted not in ROW_HASHES:
        raise ValidationError(f"row hash {wanted!r} is not one of {', '.join(ROW_HASHES)}",
                              fix=f"use one of {', '.join(ROW_HASHES)}, or none for the fastest both sides have")
    if wanted not in both:
        raise ValidationError(f"row hash {wanted!r} is not computed by both sides (both compute {', '.join(both)})",
                              fix=f"use one of {', '.join(both)}")
    return wanted


_THIS_MACHINE = ("127.0.0.1", "localhost", "::1")


def _share_cores(sides: Sequence[Snapshots]) -> None:
    """Where every node of both sides runs on this machine, as a sandbox's do, and all
    read at once: as many parallel workers per node as the machine has cores to spare
    (none on two cores for five nodes), in each node's transaction. A worker beyond the
    cores only takes turns with the others: on two cores, five segments each with two
    workers took 1.6 times as long over the first level's chunks as with none, each
    process's 1.5 MB of digests evicting the others' from the caches (docs/benchmarks.md)."""
    nodes = [node for side in sides for node in side.cluster.segments]
    if all(node.host in _THIS_MACHINE or node.host.startswith("/") for node in nodes):
        workers = max(0, len(os.sched_getaffinity(0)) // len(nodes) - 1)
        for side in sides:
            for _node, conn in side.segments():
                conn.execute(sql.SQL("SET LOCAL max_parallel_workers_per_gather = {}").format(sql.Literal(workers)))


def _compare(source: Snapshots, target: Snapshots, table: TableRef, fetch_rows: int,
             placement: bool, form: str) -> ChecksumResult:
    started = time.monotonic()
    info, target_info = source.cluster.table(table), target_table(target.cluster, table)
    _check_shapes(info, target_info)
    _share_cores((source, target))
    hashed, target_hashed = _row_hash(info, form), _row_hash(target_info, form)
    # Not in the first round: a flat array of 65,536 digests per node costs more than the
    # whole table's sum, and most tables compared are equal (docs/benchmarks.md).
    one_pass = first_level_in_one_pass(source) and first_level_in_one_pass(target)
    steps = bisect(fetch_rows)
    request = next(steps)
    key = _keyed(source, target, info)
    rounds, totals = 0, (0, 0)
    levels: list[tuple[int, int, int]] = []
    src: Fetched = []  # each side's rows: looked up by key, then of the chunks fetched
    tgt: Fetched = []
    settled_chunks = 0
    # Placement is tested in the first round's scan where the target's nodes can; the
    # rows themselves are then looked for only on the nodes that found some.
    tests = {node.content: target.cluster.misplaced_test(node, target_info) for node in target.cluster.segments}
    suspects = [node for node in target.cluster.segments if tests[node.content] is None] if placement else []
    try:
        while True:
            level, parents = request
            first = not rounds  # the first round covers the whole table
            aggregated = one_pass and level == 1  # within the whole table: level 0 has one chunk
            level_key = key if level == 1 else None  # where a chunk's lone row is looked for
            queries = (_digests(source, info, hashed, level, parents, one_pass=aggregated, key=level_key),
                       _digests(target, target_info, target_hashed, level, parents,
                                tests if placement and first else None, one_pass=aggregated, key=level_key))
            results = _run_all(queries[0] + queries[1])
            source_rows, target_rows = results[:len(queries[0])], results[len(queries[0]):]
            reply: Reply
            if aggregated:
                measured = first_level([rows[0][0] for rows in source_rows], [rows[0][0] for rows in target_rows],
                                       keyed=level_key is not None)
                reply, chunks_measured, lone = measured.reply, measured.chunks, measured.lone
            else:
                reply = (summed(_digest_rows(level, rows) for rows in source_rows),
                         summed(_digest_rows(level, rows) for rows in target_rows))
                chunks_measured = len(reply[0].keys() | reply[1].keys())
                # Each node's rows: (prefix, count, sum, XOR of the keys).
                prefix_and_keys = ([(row[0], row[3]) for row in rows] for rows in source_rows + target_rows)
                lone = lone_rows(reply, xored(prefix_and_keys)) if level_key else {}
                if first:
                    totals = (sum(d.rows for d in reply[0].values()), sum(d.rows for d in reply[1].values()))
            if first and placement:
                suspects += [node for node, rows in zip(target.cluster.segments, target_rows)
                             if tests[node.content] is not None and rows and rows[0][-1]]
            rounds += 1
            levels.append((level, chunks_measured, len(differing(*reply))))
            if lone and level_key:
                proven, (src, tgt) = _settle((source, target), (info, target_info), (hashed, target_hashed), level_key,
                                             lone)
                reply, settled_chunks = without(reply, proven), len(proven)
            request = steps.send(reply)
    except StopIteration as done:
        chunks: list[Chunk] = done.value
    if chunks:
        fetches = (_fetch(source, info, hashed, chunks), _fetch(target, target_info, target_hashed, chunks))
        results = _run_all(fetches[0] + fetches[1])
        fetched = (_fetched(source, chunks, results[:len(fetches[0])]), _fetched(target, chunks, results[len(fetches[0]):]))
        if info.primary_key:
            src, tgt = _every_copy((source, target), (info, target_info), (hashed, target_hashed), fetched, (src, tgt))
        else:
            src, tgt = fetched
    misplaced = _misplaced(target, target_info, suspects)
    # The statements follow the target's own description (its distribution key).
    diff, fixes = (_by_key if info.primary_key else _as_multiset)(target_info, target, src, tgt, misplaced)
    result = finish(info, target, target_info, diff, fixes, misplaced, totals, rounds=rounds, chunks=len(chunks),
                    fetched=len(src) + len(tgt), started=started)
    return dataclasses.replace(result, levels=tuple(levels), settled=settled_chunks)


MisplacedRow = tuple[int, sql.Composable, Text, str]  # (node, the relation holding it there, columns as text, its text)


def finish(info: Table, target: Snapshots, target_info: Table, diff: TableDiff, fixes: list[Fix],
           misplaced: Sequence[MisplacedRow], totals: tuple[int, int], *, rounds: int, chunks: int, fetched: int,
           started: float) -> ChecksumResult:
    """A table's result from its row differences (either mode's): misplaced rows and
    schema differences added, with their fix statements (``planned``)."""
    moved, fixes = planned(target, target_info, diff, fixes, misplaced)
    examples = diff.examples + tuple(f"row {row.target!r} on segment {row.target_segment}, which its distribution key "
                                     "does not name" for row in moved[:EXAMPLES])
    diff = dataclasses.replace(diff, expected=totals[0], actual=totals[1], misplaced=len(moved), examples=examples,
                               rows=diff.rows + tuple(moved))
    schema, alter = _schema(info, target_info)
    # Each node's statements run in the session the rows' text was read in: a row is
    # found by its text, which the time zone, the date style... would print otherwise.
    session = [*target.cluster.settings_reach_workers, *_FIX_SESSION]
    rendered = {node: [*session, *said] for node, said in _rendered(target, [(f.node, f.statement) for f in fixes]).items()}
    for node, said in _rendered(target, [(COORDINATOR, statement) for statement in alter]).items():
        # DDL: the coordinator sends it to the segments; a default's value read as printed.
        rendered.setdefault(node, list(session)).extend(said)
    return ChecksumResult(info.name, diff, rounds, chunks, fetched, time.monotonic() - started, rendered,
                          tuple(schema), parts=info.parts, columns=info.columns, key_columns=info.primary_key or info.columns)


def planned(target: Snapshots, info: Table, diff: TableDiff, fixes: list[Fix],
            misplaced: Sequence[MisplacedRow]) -> tuple[list[DifferingRow], list[Fix]]:
    """The rows found misplaced that the diff does not name, and the whole fix in the
    order it runs on each node (``DELETE``, ``UPDATE``, ``INSERT``).

    A misplaced row that the diff names too (extra, or a changed version) is counted
    once, by the diff, and mended by its move alone: deleted where it is, and what goes
    to its home is the source's version, or nothing for an extra row. Each row the diff
    names takes one misplaced copy at most."""
    named: dict[tuple[int | None, Text | None], list[DifferingRow]] = {}
    for differing_row in diff.rows:
        if differing_row.kind in ("extra", "changed"):
            named.setdefault((differing_row.target_segment, differing_row.target), []).append(differing_row)
    key = [info.columns.index(c) for c in info.primary_key] or range(len(info.columns))
    moves: list[tuple[MisplacedRow, DifferingRow]] = []
    moved: list[DifferingRow] = []
    for row in misplaced:
        if by_diff := named.get((row[0], row[2])):
            moves.append((row, by_diff.pop()))
        else:
            moved.append(DifferingRow("misplaced", tuple(row[2][i] for i in key), target=row[2], target_segment=row[0]))
            moves.append((row, moved[-1]))
    # The diff's own statements, but for the rows their moves mend: all those of each
    # (a row written anew has two), of each of equal rows (twins) as many as it mends.
    statements, instances = Counter(fix.row for fix in fixes), Counter(diff.rows)
    mended: Counter[DifferingRow] = Counter()
    for _row, by_move in moves:
        mended[by_move] += statements[by_move] // max(1, instances[by_move])
    kept = []
    for fix in fixes:
        if mended[fix.row]:
            mended[fix.row] -= 1
        else:
            kept.append(fix)
    return moved, sorted(_moves(target, info, moves) + kept, key=lambda fix: fix.step)


def _misplaced(target: Snapshots, info: Table, nodes: Sequence[Node] | None = None) -> list[MisplacedRow]:
    """Rows of the target stored where its distribution does not send their key: (node,
    the relation holding it there, columns as text, row text), on ``nodes`` (by default
    every segment). How to tell is the target's own (``Cluster.misplaced_rows``)."""
    columns = _texts(info)
    select = sql.SQL("{}, {}").format(columns, _row(info))

    def on(pair: tuple[Node, psycopg.Connection[Any]]) -> list[MisplacedRow]:
        node, conn = pair
        return [(node.content, relation, tuple(r[:-1]), r[-1])
                for relation, r in target.cluster.misplaced_rows(node, conn, info, select)]

    asked = {node.content for node in (target.cluster.segments if nodes is None else nodes)}
    pairs = [(node, conn) for node, conn in target.segments() if node.content in asked]
    if not pairs:
        return []
    with ThreadPoolExecutor(len(pairs)) as pool:  # every node at once, each on its own connection
        return [row for rows in pool.map(on, pairs) for row in rows]


def _one_copy(relation: sql.Composable, pin: sql.Composable, info: Table, text: str) -> sql.Composable:
    """A delete of one row of ``relation`` whose text is ``text``. A row is found by its
    table and ctid together: a ctid alone names a row in each partition or child of a
    partitioned or inherited table."""
    return sql.SQL("DELETE FROM {} WHERE {}(tableoid, ctid) IN (SELECT tableoid, ctid FROM {} t WHERE {}{} = {} LIMIT 1)"
                   ).format(relation, pin, relation, pin, _row(info), sql.Literal(text))


def _moves(target: Snapshots, info: Table, moves: list[tuple[MisplacedRow, DifferingRow]]) -> list[Fix]:
    """Each misplaced row deleted where it is and inserted where it belongs: itself, or
    where the diff names it too, the source's version (none for an extra row)."""
    fixes = []
    for (node, relation, row, text), differing_row in moves:  # deleted where it is, on that node, whatever the door
        fixes.append(Fix(differing_row, node, DELETE, _one_copy(relation, sql.SQL(""), info, text)))
        home = row if differing_row.kind == "misplaced" else differing_row.source
        if home is not None:
            fixes.append(Fix(differing_row, *_insert(info, target, home)))
    return fixes


def _typed(info: Table, column: str, text: str | None) -> sql.Composable:
    """A value's text as a literal of its column's type."""
    return sql.SQL("{}::{}").format(sql.Literal(text), sql.SQL(info.types[info.columns.index(column)]))


def _equal(info: Table, column: str, text: str | None) -> sql.Composable:
    return sql.SQL("{} = {}").format(Name(column), _typed(info, column, text))


def _where(info: Table, columns: Sequence[str], values: Text) -> sql.Composable:
    """Each of ``columns`` matched to its value in ``values``: a NULL (a key column whose
    NOT NULL a segment lost) by IS NULL, which ``=`` never matches."""
    return sql.SQL(" AND ").join(_equal(info, c, v) if v is not None else sql.SQL("{} IS NULL").format(Name(c))
                                 for c, v in zip(columns, values))


def _insert(info: Table, target: Snapshots, row: Text) -> tuple[int, int, sql.Composable]:
    """The insert of ``row``: (the node it runs on, ``INSERT``, the statement)."""
    index = {c: i for i, c in enumerate(info.columns)}
    node = target.cluster.home_of([row[index[c]] for c in info.distribution_key])
    statement = sql.SQL("{}({})").format(insert_into(info, info.writable), sql.SQL(", ").join(
        _typed(info, c, v) for c, v in zip(info.columns, row) if c not in info.generated))
    return node, INSERT, statement


def _delete_key(info: Table, target: Snapshots, node: int, key: Text) -> tuple[int, int, sql.Composable]:
    """The delete of the row of primary key ``key`` held on ``node``: (the node it runs
    on, ``DELETE``, the statement)."""
    return target.cluster.writer_of(node), DELETE, sql.SQL("DELETE FROM {} WHERE {}").format(
        info.identifier, _where(info, info.primary_key, key))


Diff = tuple[TableDiff, list[Fix]]


def _by_key(info: Table, target: Snapshots, src: Fetched, tgt: Fetched, misplaced: Sequence[MisplacedRow] = ()) -> Diff:
    """The rows compared by primary key. A key that a side holds more than once (on a
    segment without the key's unique index, or on two segments) has its rows compared
    as a multiset, so that no copy is merged into another and passes for equal."""
    key = [info.columns.index(c) for c in info.primary_key]

    def key_of(fetched: FetchedRow) -> Text:
        return tuple(fetched[1][i] for i in key)

    held = Counter(map(key_of, src)) | Counter(map(key_of, tgt))  # the most either side holds
    twice = {k for k, n in held.items() if n > 1}
    if not twice:
        return _by_unique_key(info, target, src, tgt)
    unique = _by_unique_key(info, target, [r for r in src if key_of(r) not in twice],
                            [r for r in tgt if key_of(r) not in twice])
    copies = _as_multiset(info, target, [r for r in src if key_of(r) in twice], [r for r in tgt if key_of(r) in twice],
                          misplaced, key)
    return _merged(unique, copies)


def _merged(*parts: Diff) -> Diff:
    """Row differences of disjoint sets of rows of one table, and their fixes, as one
    (its row counts are the parts', which ``finish`` replaces by the tables' own)."""
    diffs = [diff for diff, _fixes in parts]
    return TableDiff(diffs[0].table, sum(d.expected for d in diffs), sum(d.actual for d in diffs),
                     sum(d.missing for d in diffs), sum(d.extra for d in diffs), sum(d.changed for d in diffs),
                     tuple(e for d in diffs for e in d.examples),
                     rows=tuple(r for d in diffs for r in d.rows)), [fix for _diff, fixes in parts for fix in fixes]


def _by_unique_key(info: Table, target: Snapshots, src: Fetched, tgt: Fetched) -> Diff:
    key = [info.columns.index(c) for c in info.primary_key]
    expected = {tuple(r[i] for i in key): r for _, r, _ in src}
    actual = {tuple(r[i] for i in key): (node, r) for node, r, _ in tgt}
    source_node = {tuple(r[i] for i in key): node for node, r, _ in src}
    fixes: list[Fix] = []
    examples: list[str] = []
    missing = sorted((k for k in expected if k not in actual), key=repr)
    extra = sorted((k for k in actual if k not in expected), key=repr)
    changed = sorted((k for k in expected if k in actual and actual[k][1] != expected[k]), key=repr)
    rows: list[DifferingRow] = []
    for k in missing:
        rows.append(DifferingRow("missing", k, source=expected[k], source_segment=source_node[k]))
        fixes.append(Fix(rows[-1], *_insert(info, target, expected[k])))
    for k in extra:
        node, have = actual[k]
        rows.append(DifferingRow("extra", k, target=have, target_segment=node))
        fixes.append(Fix(rows[-1], *_delete_key(info, target, node, k)))
    for k in changed:
        node, have = actual[k]
        want = expected[k]
        at = {c: i for i, c in enumerate(info.columns) if have[i] != want[i]}
        row = DifferingRow("changed", k, tuple(at), want, have, source_node[k], node)
        if len(examples) < EXAMPLES:
            said = ", ".join(f"{c} {have[i]!r}, expected {want[i]!r}" for c, i in at.items())
            examples.append(f"key {k!r}: {said}")
        assignments = [_equal(info, c, want[i]) for c, i in at.items() if c not in info.generated]
        if info.always_identity.intersection(at):  # which no UPDATE may set: the row is written anew
            fixes.append(Fix(row, *_delete_key(info, target, node, k)))
            fixes.append(Fix(row, *_insert(info, target, want)))
        elif assignments:  # else only a generated column differs: its expression does, which no UPDATE mends
            fixes.append(Fix(row, target.cluster.writer_of(node), UPDATE, sql.SQL("UPDATE {} SET {} WHERE {}").format(
                info.identifier, sql.SQL(", ").join(assignments), _where(info, info.primary_key, k))))
        rows.append(row)
    examples = [f"missing key {k!r}" for k in missing[:EXAMPLES]] + [f"extra key {k!r}" for k in extra[:EXAMPLES]] + examples
    diff = TableDiff(info.name, len(expected), len(actual), len(missing), len(extra), len(changed), tuple(examples),
                     rows=tuple(rows))
    return diff, fixes


def _as_multiset(info: Table, target: Snapshots, src: Fetched, tgt: Fetched, misplaced: Sequence[MisplacedRow] = (),
                 key: Sequence[int] = ()) -> Diff:
    """The rows compared as a multiset; each differing row known by the columns at
    ``key``, or by all of them. A row the target holds too often loses its copies on the
    nodes where the placement check found it misplaced first (their moves then mend
    them, ``finish``), then on the others, node by node."""

    def known(row: Text) -> Text:
        return tuple(row[i] for i in key) if key else row

    want = Counter(r for _, r, _ in src)
    have = Counter(r for _, r, _ in tgt)
    source_node = {r: node for node, r, _ in src}
    held: dict[Text, Counter[int]] = {}  # per row, its copies on each node
    text: dict[Text, str] = {}
    for node, r, row_text in tgt:
        held.setdefault(r, Counter())[node] += 1
        text[r] = row_text
    strays = Counter((node, row) for node, _relation, row, _text in misplaced)
    fixes: list[Fix] = []
    missing, extra = want - have, have - want
    for r, n in sorted(missing.items(), key=repr):
        fixes += [Fix(DifferingRow("missing", known(r), source=r, source_segment=source_node[r]),
                      *_insert(info, target, r))] * n
    for r, n in sorted(extra.items(), key=repr):
        copies, taken, left = held[r], Counter[int](), n
        for node in sorted(copies):  # the misplaced copies first
            taken[node] = min(strays[(node, r)], copies[node], left)
            left -= taken[node]
        for node in sorted(copies):
            more = min(copies[node] - taken[node], left)
            taken[node] += more
            left -= more
        # The distribution key matched by equality too, outside and inside, so that a front
        # door (Citus) sends the statement to the one shard that holds the row.
        pin = sql.SQL("").join(sql.SQL("{} AND ").format(_equal(info, c, r[info.columns.index(c)]))
                               for c in info.distribution_key if r[info.columns.index(c)] is not None)
        for node in sorted(taken):
            fixes += [Fix(DifferingRow("extra", known(r), target=r, target_segment=node), target.cluster.writer_of(node),
                          DELETE, _one_copy(info.identifier, pin, info, text[r]))] * taken[node]
    examples = [f"missing {r!r}" for r in sorted(missing, key=repr)[:EXAMPLES]]
    examples += [f"extra {r!r}" for r in sorted(extra, key=repr)[:EXAMPLES]]
    diff = TableDiff(info.name, sum(want.values()), sum(have.values()), sum(missing.values()), sum(extra.values()),
                     examples=tuple(examples), rows=tuple(fix.row for fix in fixes))
    return diff, fixes


def _rendered(target: Snapshots, statements: list[tuple[int, sql.Composable]]) -> dict[int, list[str]]:
    """Statements as SQL text, per node, in their order."""
    out: dict[int, list[str]] = {}
    if statements:
        _node, conn = next(target.segments())
        for node, statement in statements:
            out.setdefault(node, []).append(statement.as_string(conn))
    return out
