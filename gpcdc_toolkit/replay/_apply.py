"""Applying whole distributed transactions to a target cluster, exactly once.

Each batch of source transactions becomes one target distributed transaction, rows
re-routed by the target's own distribution (so the segment counts may differ). In that
same transaction go the source gxids (``gpcdc_replay_applied``) and the pipeline's
Kafka positions (``gpcdc_replay_state``), so a batch is applied and recorded, or
neither. A DDL transaction is applied alone, through the target's DDL path, with its
record in the DDL's own transaction.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from .._sql import Name
from ..cluster import Cluster, Table, Writes, assignments, connection_lost, quoted
from ..errors import ClusterError, GpcdcError, StreamError, first_line
from ..protocol import UNCHANGED, Topics
from ._compact import TableChanges, compact, table_of
from ._ddl_policy import SYSTEM_SCHEMAS, DdlRefused, check_ddl, check_default
from ._order import RepairMark, Whole

APPLIED = "gpcdc_replay_applied"
STATE = "gpcdc_replay_state"
REPLAYERS_TABLES = frozenset({APPLIED, STATE})
_TABLES = {
    APPLIED: f"CREATE TABLE {APPLIED} (pipeline text NOT NULL, gxid bigint NOT NULL, parts int NOT NULL, "
             "PRIMARY KEY (gxid, pipeline)) DISTRIBUTED BY (gxid)",
    STATE: f"CREATE TABLE {STATE} (pipeline text PRIMARY KEY, positions text NOT NULL, "
           "loaded_tables int NOT NULL, start_point text NOT NULL) DISTRIBUTED BY (pipeline)",
}


# The fix wherever the target is found to differ from the source before a batch writes.
_WRITTEN_OUTSIDE = "replay into a fresh target; find out who else writes to it"


class ApplyError(GpcdcError):
    """A transaction could not be applied; nothing of it was."""


class DdlRefusedError(ApplyError, StreamError):
    """A DDL record the replayer will not run on the target (see ``_ddl_policy``)."""

    def __init__(self, whole: Whole, statement: str, reason: str, topic: str) -> None:
        offset = whole.record.offset if whole.record is not None else -1
        super().__init__(
            f"gxid {whole.gxid}'s DDL at offset {offset} of {topic} is refused: {reason} "
            f"(statement {statement[:120]!r}); nothing of gxid {whole.gxid} was applied, nor anything after it",
            fix="if the statement is genuine, give the target the same change by hand, then replay again with "
                f"--skip-ddl {whole.gxid}; if it is not, the topics were written by someone other than capture")
        self.gxid, self.offset, self.statement, self.reason = whole.gxid, offset, statement, reason


_CHECKPOINT_FIELDS = ("resume", "read", "lsn", "applied_lsn", "repaired")


@dataclass(frozen=True)
class Checkpoint:
    """Where a replay resumes, per partition (segment content; -1 for the coordinator's):
    ``resume``, the first offset of anything not applied; ``read``, the next offset not
    read; ``lsn``, the highest commit LSN read before ``read``. Transactions between
    ``resume`` and ``read`` may be applied; one at or past ``read`` with a commit LSN
    up to ``lsn`` is a capture's resend of what was read before. A segment-by-segment
    (legacy) replay also keeps ``applied_lsn``: every part up to it is applied.
    ``repaired``: per repaired segment, the latest repair whose copied rows are applied."""

    resume: Mapping[int, int] = field(default_factory=dict)
    read: Mapping[int, int] = field(default_factory=dict)
    lsn: Mapping[int, int] = field(default_factory=dict)
    applied_lsn: Mapping[int, int] = field(default_factory=dict)
    repaired: Mapping[int, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({name: {str(k): v for k, v in sorted(getattr(self, name).items())}
                           for name in _CHECKPOINT_FIELDS})

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        data = json.loads(text)
        return cls(*({int(k): v for k, v in data.get(name, {}).items()} for name in _CHECKPOINT_FIELDS))


@dataclass(frozen=True)
class ReplayState:
    checkpoint: Checkpoint
    loaded_tables: int  # by the initial load (0: none)
    start_point: str  # fingerprint of the bootstrap's start point it replays from ("": unknown)


@dataclass
class ApplyStats:
    transactions: int = 0
    rows: int = 0
    ddl: int = 0
    empty: int = 0  # of the transactions, those with no row and no DDL (the bootstrap's cut, sync points)
    batches: int = 0
    last_commit_ts_ms: int = 0  # source commit time of the latest transaction applied
    # Repaired segments whose copied rows were put in place: (segment, repair, keys deleted, rows inserted)
    reconciled: list[tuple[int, int, int, int]] = field(default_factory=list)


class Applier:
    """Applies batches of whole transactions of one pipeline to ``target``."""

    def __init__(self, target: Cluster, pipeline: str, *, skip_ddl: Iterable[int] = (),
                 chunk_rows: int = 5_000, repair_dir: Callable[[int, int], Path] | None = None,
                 skipped_file: Path | None = None) -> None:
        self.target = target
        self.repair_dir = repair_dir  # (segment, repair number) -> where that repair's copied rows are
        self.skipped_file = skipped_file  # where each skipped DDL statement is kept, for validate to name
        self.chunk_rows = chunk_rows  # row events folded and written at a time
        self.pipeline = pipeline
        self.skip_ddl = frozenset(skip_ddl)  # gxids whose DDL was given to the target by hand
        self.session = target.session()
        self.stats = ApplyStats()
        with target.coordinator_connection() as conn:
            # DDL text from the stream was checked as PostgreSQL parses it with standard strings.
            if conn.execute("SHOW standard_conforming_strings").fetchone()[0] != "on":  # type: ignore[index]
                raise ApplyError("the target runs with standard_conforming_strings = off, under which DDL text is "
                                 "read otherwise than the replayer checked it",
                                 fix="set standard_conforming_strings = on for the target's database")
        # Created when the first pipeline starts replaying here: a replay refused before
        # that leaves the target as it found it.
        self._missing = self._absent(list(_TABLES))

    def _absent(self, tables: list[str]) -> list[str]:
        """Those of the bookkeeping ``tables`` the target lacks (another replayer, of
        another pipeline, may make them meanwhile: asked again while any is missing)."""
        if not tables:
            return []
        with self.target.coordinator_connection() as conn:
            return [t for t in tables if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (t,)).fetchone()[0]]  # type: ignore[index]

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Applier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state --------------------------------------------------------------------------
    def _state_row(self, tx: Writes) -> ReplayState | None:
        rows = tx.execute(self._state_segment, f"SELECT positions, loaded_tables, start_point FROM {STATE} "
                          "WHERE pipeline = %s", (self.pipeline,))
        return ReplayState(Checkpoint.from_json(rows[0][0]), rows[0][1], rows[0][2]) if rows else None

    @property
    def _state_segment(self) -> int:
        return self.session.home([self.pipeline])

    def state(self) -> ReplayState | None:
        """Where this pipeline's replay into the target stands (None: not begun)."""
        self._missing = self._absent(self._missing)
        if STATE in self._missing:
            return None
        with self.session.transaction() as tx:
            return self._state_row(tx)

    def _write_state(self, tx: Writes, checkpoint: Checkpoint) -> None:
        tx.execute(self._state_segment, f"UPDATE {STATE} SET positions = %s WHERE pipeline = %s",
                   (checkpoint.to_json(), self.pipeline))

    def start(self, write: Callable[[Writes], object] | None = None, *, loaded_tables: int = 0,
              start_point: str = "") -> None:
        """Create the pipeline's state row, in one transaction with ``write(tx)`` (the
        initial load), so that a load is done once or not at all."""
        for table in self._absent(self._missing):
            try:
                self.session.ddl(_TABLES[table])
            except psycopg.errors.DuplicateTable:
                pass  # made meanwhile by the replayer of another pipeline
        self._missing = []
        with self.session.transaction() as tx:
            if self._state_row(tx) is not None:
                raise ApplyError(f"pipeline {self.pipeline!r} has already started replaying into this target")
            if write is not None:
                write(tx)
            tx.execute(self._state_segment, f"INSERT INTO {STATE} (pipeline, positions, loaded_tables, start_point) "
                       "VALUES (%s, %s, %s, %s)", (self.pipeline, Checkpoint().to_json(), loaded_tables, start_point))

    def applied_among(self, gxids: Iterable[int]) -> set[int]:
        """Those of ``gxids`` this pipeline has applied."""
        self._missing = self._absent(self._missing)
        if APPLIED in self._missing:
            return set()
        by_segment: dict[int, list[int]] = {}
        for gxid in set(gxids):
            by_segment.setdefault(self.session.home([gxid]), []).append(gxid)
        found: set[int] = set()
        with self.session.transaction() as tx:
            for segment, some in by_segment.items():
                found.update(r[0] for r in tx.execute(
                    segment, f"SELECT gxid FROM {APPLIED} WHERE pipeline = %s AND gxid = ANY(%s)", (self.pipeline, some)))
            tx.rollback()  # it only read
        return found

    # -- applying -----------------------------------------------------------------------
    def apply(self, batch: Sequence[Whole], checkpoint: Checkpoint) -> None:
        """Apply a batch in source order as one target transaction, with ``checkpoint``.

        A DDL transaction must come alone in its batch.
        """
        ddl = [w for w in batch if w.record is not None and w.record.ddl]
        if ddl and len(batch) > 1:
            raise ValueError(f"a batch with DDL must hold nothing else; this one has {len(batch)} transactions")

        def record(tx: Writes) -> None:
            # Legacy parts have no gxid: their checkpoint alone keeps them applied once.
            tx.insert(APPLIED, [{"pipeline": self.pipeline, "gxid": w.gxid, "parts": len(w.parts)}
                                for w in batch if w.gxid is not None])
            self._write_state(tx, checkpoint)

        try:
            if ddl:
                self._apply_ddl(batch[0], record)
            else:
                copies = []
                with self.session.transaction() as tx:
                    rows = 0
                    for run, repair in _runs(batch):
                        rows += self._apply_rows(tx, run)
                        if repair is not None:
                            copies.append((repair.segment, repair.number, *self._reconcile(tx, repair)))
                    record(tx)
                self.stats.rows += rows
                self.stats.reconciled += copies
        except psycopg.errors.UniqueViolation as e:
            if e.diag.table_name != APPLIED:
                raise ApplyError(f"{_what(batch)} failed on the target: {first_line(e)}",
                                 fix="the target's table has a unique constraint the source's lacks: drop it, or "
                                     "replay with --replay-batch-transactions 1 (on its primary key: the target holds "
                                     "a row the source lacks)") from None
            raise ApplyError(f"{_what(batch)} is recorded as applied already: another replayer of pipeline "
                             f"{self.pipeline!r} writes to this target", fix="run one replayer per pipeline and target") from None
        except psycopg.Error as e:
            if connection_lost(e):  # nothing for the user to repair: the checkpoint commits with the rows, or not
                raise ApplyError(f"the target's connection was lost while applying {_what(batch)}: {first_line(e)}",
                                 fix="make sure the target is up and reachable, then replay again: it goes on from "
                                     "what the target committed") from None
            # Raised by a statement, so the transaction was rolled back.
            fix = (f"give the target the same change by hand (its way), then replay again with --skip-ddl "
                   f"{batch[0].gxid}" if ddl else "make the target's tables match the source's, then replay again")
            raise ApplyError(f"{_what(batch)} failed on the target, and nothing of it was applied: {first_line(e)}",
                             fix=fix) from None
        transactions = [w for w in batch if w.reconcile is None]
        self.stats.transactions += len(transactions)
        self.stats.empty += sum(1 for w in transactions if not ddl and not any(len(p.payload or ()) for p in w.parts))
        self.stats.batches += 1
        self.stats.last_commit_ts_ms = max([self.stats.last_commit_ts_ms, *(commit_ts_ms(w) for w in transactions)])

    def _reconcile(self, tx: Writes, repair: RepairMark) -> tuple[int, int]:
        if self.repair_dir is None:
            raise StreamError(f"the stream marks repair {repair.number} of segment {repair.segment}, and this "
                              "replay was not told where repairs keep their rows",
                              fix="replay with the pipeline's work_dir")
        from ._reconcile import reconcile  # it loads rows as the initial load does, whose module imports this one

        return reconcile(tx, self.target, repair, self.repair_dir(repair.segment, repair.number))

    def _apply_ddl(self, whole: Whole, record: Callable[[Writes], None]) -> None:
        statements = whole.record.ddl  # type: ignore[union-attr]
        if whole.gxid in self.skip_ddl:
            if self.skipped_file is not None:  # kept before the commit: a retry keeps it again, never loses it
                self.skipped_file.parent.mkdir(parents=True, exist_ok=True)
                with self.skipped_file.open("ab") as f:
                    f.write(json.dumps({"gxid": whole.gxid, "statements": list(statements)}).encode() + b"\n")
            with self.session.transaction() as tx:  # its statement applied by hand: its rows, if any, and the record
                self.stats.rows += self._apply_rows(tx, [whole])
                record(tx)
            self.stats.ddl += 1
            return
        if any(True for part in whole.parts for _ in (part.payload or ())):
            shown = " ".join(statements[0].split())[:80]
            # The target's catalog changes only as the statement commits, so the rows
            # after it could not be written with the table as they knew it.
            raise ApplyError(f"gxid {whole.gxid} changes rows in the transaction of its DDL statement "
                             f"({shown}); replay applies a DDL statement in a transaction of its own",
                             fix="apply the statement on the target by hand, then replay again with "
                                 f"--skip-ddl {whole.gxid}: its rows are applied then")
        if len(statements) > 1:
            # The target's DDL path runs one statement per distributed transaction, so
            # these could not be applied together, nor exactly once.
            raise ApplyError(f"gxid {whole.gxid} holds {len(statements)} DDL statements; replay applies one per "
                             "transaction", fix="apply them on the target by hand, then replay again with "
                             f"--skip-ddl {whole.gxid}")
        self._refuse_unsafe(whole, statements[0])
        self.session.ddl(statements[0], then=record)
        self.stats.ddl += 1

    def _refuse_unsafe(self, whole: Whole, statement: str) -> None:
        """Refuse a statement the policy refuses, or one whose unqualified names the
        target resolves into a system schema."""
        topic = Topics(self.pipeline).dtx
        try:
            checked = check_ddl(statement, reserved=REPLAYERS_TABLES)
        except DdlRefused as e:
            raise DdlRefusedError(whole, statement, str(e), topic) from None
        if checked.added_types:
            with self.target.coordinator_connection() as conn:
                defaults = conn.execute(
                    "SELECT t.name, pg_get_expr(d.typdefaultbin, 0) FROM unnest(%s::text[]) AS t(name) "
                    "JOIN pg_type d ON d.oid = to_regtype(t.name) "
                    "WHERE d.typtype = 'd' AND d.typdefaultbin IS NOT NULL", (list(checked.added_types),)).fetchall()
            for name, default in defaults:
                try:
                    check_default(default, f"the default of domain {name}, which an added column takes")
                except DdlRefused as e:
                    raise DdlRefusedError(whole, statement, str(e), topic) from None
        unqualified = [name for schema, name in checked.names if schema is None]
        if unqualified:
            with self.target.coordinator_connection() as conn:
                found = conn.execute(
                    "SELECT c.relname, n.nspname FROM unnest(%s::text[]) AS u(name) "
                    "JOIN pg_class c ON c.oid = to_regclass(quote_ident(u.name)) "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace", (unqualified,)).fetchall()
            for name, schema in found:
                if schema in SYSTEM_SCHEMAS or schema.startswith("pg_"):
                    raise DdlRefusedError(whole, statement, f"{checked.kind} names {name}, which the target "
                                          f"resolves to {schema}.{name}, in a system schema", topic)

    def _apply_rows(self, tx: Writes, batch: Sequence[Whole]) -> int:
        """Apply the net effect of the batch's row events; returns how many events.

        Events are folded and written ``chunk_rows`` at a time, in order, so that a
        transaction of any size is applied in bounded memory: folding consecutive runs
        one after the other leaves what folding them all at once leaves."""
        events = (e for whole in batch for part in whole.parts for e in part.payload or ())
        count = 0
        primary_keys: dict[tuple[str, str], tuple[str, ...]] = {}
        writable: dict[tuple[str, str], frozenset[str]] = {}
        while chunk := list(itertools.islice(events, self.chunk_rows)):
            count += len(chunk)
            for event in chunk:
                table = table_of(event)
                if table not in primary_keys:
                    info = self._table(table, event["source"].get("gxid"))
                    primary_keys[table], writable[table] = info.primary_key, frozenset(info.writable)
                _check_image(table, event, writable[table])
            for changes in compact(chunk, primary_keys):
                self._apply_folded(tx, changes)
                self._apply_in_order(tx, changes.table, changes.ordered)
        return count

    def _apply_folded(self, tx: Writes, changes: TableChanges) -> None:
        """Write a table's folded changes, checking that the target holds the row of each
        key the source held, and none of those the source did not hold and writes
        (``_compact``): a row the target lost would otherwise come back, or one it gained
        be written over, without a word. The keys whose rows go by upsert (which finds
        either) are looked up first; the other writes tell what they found (the rows a
        delete of a held key or an update changed; a plain insert fails on a key taken).
        A key the source inserted and deleted in the batch is deleted unchecked: the
        target ends without its row, as the source does, and a key PostgreSQL holds equal
        to another (numeric 1.0 and 1.00, citext) may be deleted under its other form."""
        table = changes.table
        held = {_values_of(key): what for key, had, what in changes.before if had}
        counted = {_values_of(key) for key in changes.deletes} | {_values_of(key) for key, _ in changes.updates}
        looked_up = [(key, what) for key, had, what in changes.before if had and _values_of(key) not in counted]
        if looked_up:
            for (key, what), found in zip(looked_up, tx.held(table, [key for key, _ in looked_up]), strict=True):
                if not found:
                    raise _differs(what, table, key)
        if changes.deletes:
            for key, found in zip(changes.deletes, tx.delete_keys(table, changes.deletes), strict=True):
                if not found and (first := held.get(_values_of(key))) is not None:
                    raise _differs(first, table, key)
        if changes.upserts:
            tx.upsert(table, changes.upserts)
        if changes.inserts:
            with self._key_taken(table):
                tx.insert(table, changes.inserts)
        for key, values in changes.updates:
            _one_row(tx.update(table, key, values), table, key, "update")

    @contextlib.contextmanager
    def _key_taken(self, table: tuple[str, str]) -> Iterator[None]:
        """A unique violation on ``table``'s primary key, told apart from one on another
        unique index (which goes on as it is): a row the target gained outside the
        pipeline, where the source had none."""
        try:
            yield
        except psycopg.errors.UniqueViolation as e:
            detail = e.diag.message_detail or ""
            try:
                with self.target.coordinator_connection() as conn:  # the session's transaction has failed
                    quoted_key = conn.execute("SELECT string_agg(quote_ident(c), ', ' ORDER BY n) "
                                              "FROM unnest(%s::text[]) WITH ORDINALITY AS k(c, n)",
                                              (list(self.session.table(table).primary_key),)).fetchone()[0]  # type: ignore[index]
            except (psycopg.Error, GpcdcError):
                raise e from None  # the violation as it is, rather than what asking about it met
            if not quoted_key or not detail.startswith(f"Key ({quoted_key})=("):
                raise
            taken = repr(detail.removesuffix(".").removesuffix(" already exists"))[1:-1]  # one line, whatever the key
            taken = taken if len(taken) <= 200 else taken[:200] + "...)"
            raise ApplyError(f"a row written into {quoted(*table)} found {taken} on the target, where the source had "
                             "no row: the target differs from the source", fix=_WRITTEN_OUTSIDE) from None

    def _apply_in_order(self, tx: Writes, table: tuple[str, str],
                        events: Sequence[Mapping[str, Any]]) -> None:
        inserts: list[Mapping[str, Any]] = []
        with self._key_taken(table):
            for event in events:
                if event["op"] == "c":
                    inserts.append(event["after"])  # consecutive inserts go together
                    continue
                if inserts:
                    tx.insert(table, inserts)
                    inserts = []
                self._apply_change(tx, table, event)
            if inserts:
                tx.insert(table, inserts)

    def _apply_keyless(self, tx: Writes, table: Table, event: Mapping[str, Any]) -> int:
        old = event["before"]
        if old is None:
            raise ApplyError(f"{table.name} has no primary key and its events carry no old row",
                             fix=f"run ALTER TABLE {table.name} REPLICA IDENTITY FULL on the source")
        if set(old) != set(table.writable):
            raise ApplyError(f"a change of {table.name} (gxid {event['source'].get('gxid')}) carries its old row "
                             f"without columns {sorted(set(table.writable) - set(old))}, so the row it changed cannot "
                             "be told from others", fix=f"give {table.name} a primary key on the source")
        segment = tx.route(table, old)
        match, params = _keyless_match(table, old)
        delete = sql.SQL("DELETE FROM {} WHERE {} RETURNING 1").format(table.identifier, match)
        if event["op"] == "d":
            return _one_row(len(tx.execute(segment, delete, params)), table.parts, old, "delete")
        new = {**old, **event["after"]}
        if tx.rewrites(table, old, new):  # into another segment (or shard), or an identity column set anew
            _one_row(len(tx.execute(segment, delete, params)), table.parts, old, "update")
            return tx.insert(table.parts, [new])
        assign, values = assignments(table, old, new)
        update = sql.SQL("UPDATE {} SET {} WHERE {} RETURNING 1").format(table.identifier, assign, match)
        return _one_row(len(tx.execute(segment, update, [*values, *params])), table.parts, old, "update")

    def _table(self, table: tuple[str, str], gxid: int | None) -> Table:
        try:
            return self.session.table(table)
        except ClusterError:
            raise ApplyError(f"the target has no table {quoted(*table)}, which gxid {gxid} writes",
                             fix=f"create {quoted(*table)} on the target, or replay from a bootstrap whose initial "
                                 "load creates it") from None

    def _apply_change(self, tx: Writes, table: tuple[str, str], event: Mapping[str, Any]) -> int:
        info = self.session.table(table)
        key_columns = info.primary_key
        op = event["op"]
        if not key_columns and op in ("u", "d"):
            return self._apply_keyless(tx, info, event)
        if op == "u":
            values = event["after"]
            old = event["before"] or event["after"]
            key = {c: old[c] for c in key_columns}
            return _one_row(tx.update(table, key, values), table, key, "update")
        if op == "d":
            key = {c: event["before"][c] for c in key_columns}
            return _one_row(tx.delete(table, key), table, key, "delete")
        raise ApplyError(f"cannot replay operation {op!r} on {info.name} (gxid {event['source'].get('gxid')})",
                         fix="replay TRUNCATE by hand on the target")


def _check_image(table: tuple[str, str], event: Mapping[str, Any], writable: frozenset[str]) -> None:
    """An insert or an update carries a value of every column the replay writes, but
    those it lists as unchanged (TOASTed values the WAL left out): one without some was
    cut, and would leave the target's values of them as they were."""
    if event["op"] not in ("c", "u"):
        return
    missing = writable - event["after"].keys()
    if missing and (unchanged := event.get(UNCHANGED)):
        missing -= set(unchanged)
    if missing:
        source = event["source"]
        raise ApplyError(
            f"{'an insert' if event['op'] == 'c' else 'an update'} of {quoted(*table)} (gxid {source.get('gxid')}, "
            f"segment {source.get('segment')}, sequence number {source.get('seq')}) carries no value for "
            f"{', '.join(sorted(map(repr, missing)))[:200]} and does not list them as unchanged: nothing of its "
            "batch was applied", fix="if the target's table has columns the source's lacks, make it the source's; "
                                     "otherwise the event was damaged: restore its partition from capture, or "
                                     "bootstrap the pipeline again")


def _differs(what: str, table: tuple[str, str], key: Mapping[str, Any]) -> ApplyError:
    """The target lacks a row the source held."""
    return ApplyError(f"{what} of {quoted(*table)} key {_shown(key)} found no row on the target, where the source "
                      "had one: the target differs from the source", fix=_WRITTEN_OUTSIDE)


def _values_of(key: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(key.values())


def _one_row(count: int, table: tuple[str, str], key: Mapping[str, Any], what: str) -> int:
    """An update or delete of a row the source had must find that row on the target."""
    if count != 1:
        raise ApplyError(f"an {what} of {quoted(*table)} key {_shown(key)} changed {count} rows on the target, where the "
                         "source had the row: the target differs from the source",
                         fix=_WRITTEN_OUTSIDE)
    return count


def _shown(key: Mapping[str, Any]) -> str:
    """A key as a line can hold it (a keyless table's is its whole row)."""
    shown = repr(dict(key))
    return shown if len(shown) <= 200 else shown[:200] + "...}"


def _keyless_match(table: Table, row: Mapping[str, Any]) -> tuple[sql.Composable, list[Any]]:
    """One row equal to ``row`` (NULLs included): a table without a key may hold twins.
    The distribution key is matched by equality too, outside and inside, so that a front
    door (Citus) sends the statement to the one shard that holds the row."""
    pinned = [c for c in table.distribution_key if row.get(c) is not None]
    pin = sql.SQL("").join(sql.SQL("{} = %s AND ").format(Name(c)) for c in pinned)
    where = sql.SQL(" AND ").join(sql.SQL("{} IS NOT DISTINCT FROM %s").format(Name(c)) for c in row)
    pin_values = [row[c] for c in pinned]
    return (sql.SQL("{}ctid = (SELECT ctid FROM {} WHERE {}{} LIMIT 1)").format(pin, table.identifier, pin, where),
            [*pin_values, *pin_values, *row.values()])


def commit_ts_ms(whole: Whole) -> int:
    """When the source committed a transaction (its coordinator record, or its one part)."""
    return whole.record.commit_ts_ms if whole.record is not None else whole.parts[0].commit_ts_ms


def _what(batch: Sequence[Whole]) -> str:
    copies = [f"repair {w.reconcile.number} of segment {w.reconcile.segment}" for w in batch if w.reconcile is not None]
    if copies:
        return f"the batch with the copied rows of {', '.join(copies)}"
    gxids = [w.gxid for w in batch if w.gxid is not None]
    if len(batch) == 1:
        return f"gxid {gxids[0]}" if gxids else "a legacy part"
    return f"a batch of {len(batch)} transactions" + (f" (gxids {min(gxids)}..{max(gxids)})" if gxids else "")


def _runs(batch: Sequence[Whole]) -> Iterable[tuple[Sequence[Whole], RepairMark | None]]:
    """The batch cut at its reconciles: each run of transactions, then the repair whose
    rows go in after it (None after the last run)."""
    start = 0
    for i, whole in enumerate(batch):
        if whole.reconcile is not None:
            yield batch[start:i], whole.reconcile
            start = i + 1
    if start < len(batch):
        yield batch[start:], None
