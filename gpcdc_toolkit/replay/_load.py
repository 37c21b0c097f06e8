"""The initial load: the bootstrap's snapshot into the target, before any transaction.

Tables the target lacks are created first, from the snapshot's manifest (columns and
types, defaults and the sequences they draw on, primary key, distribution key: as the target distributes, a sandbox by it,
Citus with ``create_distributed_table``, plain PostgreSQL not at all); then every row
goes in through one target transaction, together with the replay's state row, so the
load happens once or not at all. A table the target already has must be empty.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import sql

from .._sql import Name, Quoted
from ..bootstrap import InitialSnapshot
from ..cluster import Writes, WriteSession, connection_lost
from ..errors import first_line
from ._apply import REPLAYERS_TABLES, ApplyError
from ._ddl_policy import DdlRefused, check_ddl

_LOAD_BATCH = 5000  # rows per INSERT round


# A default's use of a sequence, as PostgreSQL prints it, and a name as regclass prints one.
_NEXTVAL = re.compile(r"nextval\('((?:[^']|'')*)'::regclass\)")
_IDENTIFIER = r'(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)'
_SEQUENCE_NAME = re.compile(rf"{_IDENTIFIER}(?:\.{_IDENTIFIER})?")


def create_statement(snapshot: InitialSnapshot, table: str) -> str:
    """The table as the source has it: its columns, their types, defaults (the replay
    writes every column, so that a default only keeps the target's catalog the
    source's) and generated expressions, its primary key and distribution."""
    entry = snapshot.manifest["tables"][table]
    generated, defaults = entry.get("generated", {}), entry.get("defaults", {})
    parts = [sql.SQL("{} {}{}").format(Name(c), sql.SQL(t), sql.SQL(
        f" GENERATED ALWAYS AS ({generated[c]}) STORED" if c in generated else
        f" DEFAULT {defaults[c]}" if c in defaults else ""))
        for c, t in zip(entry["columns"], entry["types"])]
    if entry["primary_key"]:
        parts.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(Name, entry["primary_key"]))))
    body = sql.SQL(", ").join(parts).as_string(None)
    # Quoted plainly, not as Name writes a name holding %: the clause is read back by
    # parse_create_table, which knows no Unicode escapes; the statement takes no parameters.
    key = sql.SQL(", ").join(map(sql.Identifier, entry["distribution_key"])).as_string(None)
    return f"CREATE TABLE {table} ({body}) DISTRIBUTED BY ({key})"


def prepare_target(session: WriteSession, snapshot: InitialSnapshot) -> None:
    """Create the snapshot's tables the target lacks; refuse a table that has rows, or one
    named as the replayer's own tables are (before anything is written)."""
    for table in snapshot.tables:
        if snapshot.manifest["tables"][table].get("name") in REPLAYERS_TABLES:
            raise ApplyError(f"the source's table {table} is named as one of the replayer's own tables on the target "
                             f"({', '.join(sorted(REPLAYERS_TABLES))}), which it would be taken for",
                             fix="rename the table on the source, then bootstrap the pipeline again")
    with session.cluster.coordinator_connection() as conn:
        for table in snapshot.tables:
            schema = snapshot.manifest["tables"][table].get("schema")
            if schema is not None and not conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                                                       (schema,)).fetchone():
                session.ddl(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(Name(schema)).as_string(None))
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]  # type: ignore[index]
            if not exists:
                statement = create_statement(snapshot, table)
                try:  # the manifest is a file: its types and expressions pass the same check as the stream's DDL
                    check_ddl(statement, reserved=REPLAYERS_TABLES)
                except DdlRefused as e:
                    raise ApplyError(f"the initial snapshot's table {table} cannot be created on the target: {e}",
                                     fix="create it on the target by hand, empty, then replay again") from None
                try:
                    for sequence in _sequences(snapshot, table):  # which its defaults take values from
                        session.ddl(sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(Quoted(sequence)).as_string(None))
                    session.ddl(statement)
                except _LACKING as e:
                    raise ApplyError(f"the initial snapshot's table {table} cannot be created on the target as the source "
                                     f"has it: {first_line(e)}",
                                     fix="create what it names on the target (a function, a type, an extension, a "
                                         "schema), then replay again") from None
                continue
            _check_shape(session, snapshot, table)
            rows = session.cluster.fetch_all(f"SELECT 1 FROM {table} LIMIT 1")
            if rows:
                raise ApplyError(f"target table {table} has rows; the initial load needs it empty",
                                 fix=f"truncate {table} on the target, or replay with --no-replay-initial-load")


# What a table's types and defaults may name that the target lacks.
_LACKING = (psycopg.errors.UndefinedFunction, psycopg.errors.UndefinedObject, psycopg.errors.InvalidSchemaName,
            psycopg.errors.UndefinedTable)


def _sequences(snapshot: InitialSnapshot, table: str) -> list[str]:
    """The sequences the table's defaults take values from (``nextval``), as PostgreSQL
    names them; a name that is not one refuses the manifest."""
    names = []
    for default in snapshot.manifest["tables"][table].get("defaults", {}).values():
        for quoted_name in _NEXTVAL.findall(default):
            name = quoted_name.replace("''", "'")
            if not _SEQUENCE_NAME.fullmatch(name):
                raise ApplyError(f"the initial snapshot's table {table} has a default taking values from {name!r}, "
                                 "which is not a sequence's name", fix="bootstrap the pipeline again")
            names.append(name)
    return sorted(set(names))


def load_initial(tx: Writes, snapshot: InitialSnapshot) -> int:
    """The initial load: every row of the snapshot in ``tx``; returns how many. A
    statement the target fails ends the load naming its table (``tx`` then writes
    nothing)."""
    count = 0
    for table in snapshot.tables:
        try:
            count += _load_table(tx, snapshot, table)
        except psycopg.Error as e:
            if connection_lost(e):
                raise ApplyError(f"the target's connection was lost during the initial load of {table}: "
                                 f"{first_line(e)}", fix="make sure the target is up and reachable, then replay "
                                                          "again: the load is written whole or not at all") from None
            # Classes 22 and 23: a value the column's type or a constraint does not take.
            what = "refused a row of" if (e.sqlstate or "").startswith(("22", "23")) else "failed the load of"
            raise ApplyError(f"the target {what} {table} in the initial load, and nothing of the load was written: "
                             f"{first_line(e)}", fix="make the target's table take the source's rows (its "
                                                      "constraints, its types), then replay again") from None
    return count


def load_rows(tx: Writes, snapshot: InitialSnapshot) -> int:
    """Insert every row of the snapshot (or a repair's copy) in ``tx``; returns how many."""
    return sum(_load_table(tx, snapshot, table) for table in snapshot.tables)


def _load_table(tx: Writes, snapshot: InitialSnapshot, table: str) -> int:
    """Insert the snapshot's rows of ``table`` in ``tx``; returns how many."""
    columns = snapshot.columns(table)
    count = 0
    batch: list[dict[str, object]] = []
    for row in snapshot.rows(table):
        batch.append(dict(zip(columns, row)))
        if len(batch) >= _LOAD_BATCH:
            count += tx.insert(table, batch)
            batch = []
    if batch:
        count += tx.insert(table, batch)
    return count


def _check_shape(session: WriteSession, snapshot: InitialSnapshot, table: str) -> None:
    """Refuse a target table whose columns, types or primary key differ from the source's."""
    entry = snapshot.manifest["tables"][table]
    have = session.table((entry["schema"], entry["name"])) if "schema" in entry else session.table(table)
    want = (list(zip(entry["columns"], entry["types"])), list(entry["primary_key"]))
    found = (list(zip(have.columns, have.types)), list(have.primary_key))
    if want != found:
        said = [f"columns {found[0]} where the source has {want[0]}" if want[0] != found[0] else "",
                f"primary key {found[1]} where the source has {want[1]}" if want[1] != found[1] else ""]
        raise ApplyError(f"target table {table} has {' and '.join(x for x in said if x)}",
                         fix=f"make {table} on the target match the source (or drop it, and the initial load "
                             "creates it), then replay again")
