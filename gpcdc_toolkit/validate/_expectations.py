"""great-expectations suites run on the target's tables where the rows are.

Every table gets a suite derived from the catalog and the comparison: its primary key
unique and never null, and its row count equal to the source's at the sync point.
Suites in ``expectations/`` whose ``meta.gpcdc.frame`` is ``target`` add what the
workload guarantees of a table's values. Each store of the target (``_stores``)
computes them in its own server, inside the snapshot validation compared, on the
table's real column names; values are PostgreSQL's text of them (a domain is a regular
expression or a set of strings). No row leaves the servers.

The derived suite costs no scan of its own where it need not: the row count is the one
the comparison counted in the same snapshot, and a key that every store keeps unique
and NOT NULL by a unique index of its own (``Cluster.key_index``) is reported as so
enforced. great-expectations counts duplicates and nulls only of a key kept otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass, replace
from functools import partial
from importlib.util import find_spec
from typing import Any

import psycopg
from psycopg import sql

from .._expect import Expectations, Measured, Outcome, Suite, severity_of
from .._sql import Name
from ..cluster import Cluster, Node, Table
from ..errors import ConfigError
from ._snapshots import SESSION, Snapshots
from ._stores import Identity, aligned, combine, identities, kind_of, refusal

_ROW_COUNT = "expect_table_row_count_to_equal"


def derived_suite(info: Table, source_rows: int) -> dict[str, Any]:
    """The suite every target table gets: key unique and not null, row count as the source's."""
    expectations: list[dict[str, Any]] = [
        {"type": _ROW_COUNT, "kwargs": {"value": source_rows},
         "meta": {"why": "the source held this many rows at the same point"}}]
    key = list(info.primary_key)
    if len(key) == 1:
        expectations.append({"type": "expect_column_values_to_be_unique", "kwargs": {"column": key[0]}})
    elif key:
        expectations.append({"type": "expect_compound_columns_to_be_unique", "kwargs": {"column_list": key}})
    expectations += [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": c}} for c in key]
    return {"name": f"target {info.name}", "expectations": expectations}


def derived_outcomes(info: Table, source_rows: int, target_rows: int,
                     key_indexes: Sequence[str | None]) -> tuple[list[Outcome], list[dict[str, Any]]]:
    """The derived suite's outcomes known without reading a row, given the rows the
    comparison counted on each side and each store's ``Cluster.key_index``; and its
    expectations left to compute (the key's, unless every store enforces it)."""
    name, body = _derived(info, source_rows)
    count, *key = body["expectations"]
    counted = Measured(_ROW_COUNT, count["kwargs"], "error", target_rows == source_rows,
                       {"observed_value": target_rows}).outcome(name)
    if not key or None in key_indexes:
        return [counted], key
    stores = f"{len(key_indexes)} store{'s' if len(key_indexes) > 1 else ''}"
    indexes = ", ".join(sorted(set(filter(None, key_indexes))))
    evidence = f"enforced on each of {stores} by its unique index ({indexes}) on NOT NULL columns"
    enforced = [Measured(e["type"], e["kwargs"], "error", True, {}) for e in key]
    return [counted, *(Outcome(name, f"{m.type}({m.subject})", True, m.severity, evidence) for m in enforced)], []


@dataclass(frozen=True)
class _TableSuites:
    """A table's suites as the stores compute them together."""

    info: Table
    together: dict[str, Any]  # the suites as one, its columns named c0, c1, ...
    kinds: dict[str, str]  # each expectation type's kind (``_stores.kind_of``)
    names: dict[str, str]  # c0, c1, ... to the table's column names
    suite_of: dict[Identity, str]  # each expectation's suite

    def outcome(self, identity: Identity, per_store: list[Measured]) -> Outcome:
        combined = combine(per_store, self.kinds[per_store[0].type])
        return replace(combined, kwargs=_renamed_args(combined.kwargs, self.names)).outcome(self.suite_of[identity])


class TargetSuites:
    """The suites of each target table, checked against the target's stores before
    anything is read: :meth:`check` then computes them inside the validation's snapshots."""

    def __init__(self, target: Cluster, tables: Sequence[Table], suites: Sequence[Suite], *,
                 placement_checked: bool) -> None:
        """``tables`` as the source's catalog has them: the target's may not be there yet."""
        self._context: Expectations | None = None  # made when a suite is to be computed (see _expectations)
        self._stores = len(target.segments)
        self._placement_checked = placement_checked
        self._suites = {info.name: [(s.name, s.body) for s in suites if s.frame == "target" and s.table == info.name]
                        for info in tables}
        # (suite, table) of the target suites that name none of ``tables``: not run, and said so.
        self.unmatched = tuple((s.name, s.table or "") for s in suites if s.frame == "target" and s.table not in self._suites)
        for info in tables:  # the derived suite's kinds do not depend on the row count
            self._kinds(info, *_derived(info, 0), derived=True)
            for name, body in self._suites[info.name]:
                self._kinds(info, name, body)
        # Made now, before any cut, where it will be needed (a key is proven by the
        # stores' indexes only where placement is checked), or where it cannot be made:
        # then it says so here rather than after the snapshots are pinned.
        needed = not placement_checked and any(info.primary_key for info in tables)
        if self._context is None and (needed or find_spec("great_expectations") is None):
            self._context = Expectations()

    @property
    def _expectations(self) -> Expectations:
        """great-expectations' context, made on first use: importing it takes some 2.5 s
        of a command's time, which a validation whose derived suites are known from the
        comparison's counts and the target's unique indexes, and that has no suite of
        its own, does not pay. Only a store found without its key's unique index once
        the snapshots are pinned makes it later than :meth:`__init__`."""
        if self._context is None:
            self._context = Expectations()
        return self._context

    def check(self, target: Snapshots, tables: Sequence[tuple[Table, int, int]]) -> list[Outcome]:
        """Every table's derived suite and its suites from ``expectations/``, given (the
        target's table, the rows the comparison counted on the source and on the target),
        on ``target``'s pinned snapshots."""
        with self.start(target, [info for info, _, _ in tables]) as running:
            return running.outcomes([(source_rows, target_rows) for _, source_rows, target_rows in tables])

    def start(self, target: Snapshots, tables: Sequence[Table]) -> Running:
        """Start computing the suites of the target's ``tables`` on ``target``'s pinned
        snapshots, in a thread of their own: great-expectations' Python then runs while
        the comparison waits on the servers. :meth:`Running.outcomes` gives them; leaving
        the ``with`` block stops what is still running."""
        derived: list[Callable[[int, int], list[Outcome]]] = []  # per table, its outcomes known from the counts
        computed: list[tuple[int, _TableSuites]] = []  # what the stores compute, with its table's place
        for info in tables:
            self._kinds(info, *_derived(info, 0), derived=True)  # refused on the target's catalog too: its key
            # An index keeps a key unique in its own relation; across a store's or the
            # stores' relations only where every row is where its key routes it.
            proofs = [target.cluster.key_index(node, conn, info) if self._placement_checked else None
                      for node, conn in target.segments()]
            derived.append(partial(_known, info, proofs))
            left = derived_outcomes(info, 0, 0, proofs)[1]  # which expectations are left does not depend on counts
            suites = [(f"target {info.name}", {"name": f"target {info.name}", "expectations": left})] if left else []
            suites += self._suites.get(info.name, [])
            if suites:
                computed.append((len(derived) - 1, self._table_suites(info, suites)))
        stores: list[_Store] = []
        for node, conn in target.segments() if computed else ():
            query = _text_rows(target, node, conn)
            snapshot = sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(target.names[node.content]))
            stores.append((node.content, target.cluster.dsn(node),
                           ["SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY", snapshot.as_string(conn)],
                           [query(m.info) for _, m in computed]))
        return Running(self._expectations if computed else None, derived, computed, stores)

    def _table_suites(self, info: Table, suites: list[tuple[str, dict[str, Any]]]) -> _TableSuites:
        """The table's suites as one, on its columns as c0, c1, ...: one validation per
        store of them all, as its cost is per validation more than per expectation."""
        kinds = {t: k for name, body in suites for t, k in self._kinds(info, name, body).items()}
        # Columns go to great-expectations as c0, c1, ...: it tells names apart by
        # case alone loosely (COL and col), and runs its SQL as text (a % in a name).
        aliases = {column: f"c{i}" for i, column in enumerate(info.columns)}
        suites = [(name, _renamed(body, aliases)) for name, body in suites]
        owners = [(name, (e.expectation_type, dict(e.configuration.kwargs), severity_of(e)))
                  for name, body in suites for e in self._expectations.suite(name, body).expectations]
        together = {"name": f"target {info.name}", "expectations": [
            e for _, body in suites for e in body["expectations"]]}
        return _TableSuites(info, together, kinds, {alias: column for column, alias in aliases.items()},
                        dict(zip(identities([e for _, e in owners]), (name for name, _ in owners))))

    def _kinds(self, info: Table, name: str, body: dict[str, Any], *, derived: bool = False) -> dict[str, str]:
        """Each expectation type of the suite by kind (``_stores.kind_of``). Raises
        ConfigError for one the stores cannot compute apart (``_stores.refusal``). A
        suite of ``expectations/`` is read as great-expectations loads it; the
        ``derived`` suite, which the toolkit writes itself, as it is written."""
        declared = ([(e["type"], e["kwargs"]) for e in body["expectations"]] if derived else
                    [(e.expectation_type, e.configuration.kwargs) for e in self._expectations.suite(name, body).expectations])
        kinds = {}
        for expectation_type, kwargs in declared:
            kind = kinds[expectation_type] = kind_of(expectation_type)
            columns = [kwargs["column"]] if "column" in kwargs else list(kwargs.get("column_list") or [])
            if why := refusal(name, expectation_type, columns, kind, table=info.name,
                              distribution_key=info.distribution_key, stores=self._stores,
                              placement_checked=self._placement_checked):
                raise ConfigError(why, fix="remove the expectation from its suite, or validate a target that "
                                           "keeps each table in one place")
        return kinds


class Running:
    """Target suites being computed in a thread of their own (:meth:`TargetSuites.start`)."""

    def __init__(self, expectations: Expectations | None, derived: Sequence[Callable[[int, int], list[Outcome]]],
                 computed: Sequence[tuple[int, _TableSuites]], stores: Sequence[_Store]) -> None:
        """``expectations`` computes ``computed``: None only when there is nothing to compute."""
        self._derived = derived
        self._computed = computed
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="target suites")
        self._future: Future[list[list[Outcome]]] | None = None
        self._stop: Callable[[], None] = lambda: None
        if computed:
            if expectations is None:
                raise ValueError(f"{len(computed)} tables' suites to compute, and no great-expectations context")
            self._stop = expectations.stop
            self._future = self._pool.submit(self._compute, expectations, stores)

    def _compute(self, expectations: Expectations, stores: Sequence[_Store]) -> list[list[Outcome]]:
        """Per table computed, its suites' outcomes on every store together."""
        with ExitStack() as stack:
            sources = []
            for content, dsn, on_begin, queries in stores:
                source = expectations.store(f"target store {content}", _connector(dsn), queries, on_begin=on_begin)
                stack.callback(expectations.release, source)
                sources.append((source, queries))
            found = []
            for i, (_, m) in enumerate(self._computed):
                per_store = [expectations.measure_query(f"target {m.info.name}", m.together, source, queries[i])
                             for source, queries in sources]
                found.append([m.outcome(identity, results) for identity, results in aligned(per_store)])
            return found

    def outcomes(self, counts: Sequence[tuple[int, int]]) -> list[Outcome]:
        """Every table's outcomes, given the rows the comparison counted on the source
        and on the target, table by table; waits for the stores' computation."""
        if len(counts) != len(self._derived):
            raise ValueError(f"{len(counts)} counts for {len(self._derived)} tables")
        outcomes = [known(source_rows, target_rows) for known, (source_rows, target_rows) in zip(self._derived, counts)]
        for (place, _), found in zip(self._computed, self._future.result() if self._future else []):
            outcomes[place] += found
        return [outcome for table in outcomes for outcome in table]

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        # Left before its outcomes were asked for (the comparison failed): what still
        # runs on the stores is stopped rather than waited for.
        try:
            while self._future is not None and not self._future.done():
                self._stop()  # again while it runs: a statement may be sent as the last was cancelled
                wait([self._future], timeout=0.5)
        except BaseException:  # interrupted while it stops: its statements are refused, it ends on its own
            self._pool.shutdown(wait=False)
            raise
        self._pool.shutdown()


_Store = tuple[int, str, list[str], list[str]]  # a store's content id, DSN, set-up statements, each table's query
_COLUMN_ARGUMENTS = ("column", "column_A", "column_B")


def _renamed_args(kwargs: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """An expectation's arguments with the columns they name renamed by ``names`` (a
    name it does not hold is kept: great-expectations then says it is not there)."""
    out = dict(kwargs)
    for argument in _COLUMN_ARGUMENTS:
        if isinstance(out.get(argument), str):
            out[argument] = names.get(out[argument], out[argument])
    if isinstance(out.get("column_list"), list):
        out["column_list"] = [names.get(c, c) for c in out["column_list"]]
    return out


def _renamed(body: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    return {**body, "expectations": [{**e, "kwargs": _renamed_args(e.get("kwargs", {}), names)}
                                     for e in body["expectations"]]}


def _derived(info: Table, source_rows: int) -> tuple[str, dict[str, Any]]:
    return f"target {info.name}", derived_suite(info, source_rows)


def _known(info: Table, proofs: Sequence[str | None], source_rows: int, target_rows: int) -> list[Outcome]:
    return derived_outcomes(info, source_rows, target_rows, proofs)[0]


def _connector(dsn: str) -> Any:
    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(dsn, connect_timeout=10)
        try:
            conn.execute(SESSION)  # values printed as the comparison prints them
            conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    return connect


def _text_rows(target: Snapshots, node: Node, conn: psycopg.Connection[Any]) -> Callable[[Table], str]:
    """The query of a table's rows on one store, every value as PostgreSQL's text, the
    columns named c0, c1, ... in the table's order. (great-expectations runs it as
    SQLAlchemy text, whose % the driver reads as a placeholder or not depending on the
    outer query: :class:`Name` writes names holding one without it.)"""
    def query(info: Table) -> str:
        columns = sql.SQL(", ").join(sql.SQL("{}::text AS {}").format(Name(c), Name(f"c{i}"))
                                     for i, c in enumerate(info.columns))
        return sql.SQL("SELECT {} FROM {} AS t").format(columns, target.relation(node, info)).as_string(conn)

    return query
