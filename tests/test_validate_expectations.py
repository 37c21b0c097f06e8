"""The derived suite of a target table (row count, key unique and not null): counted by
the comparison and proven by the stores' own unique indexes where they keep one, and
computed by great-expectations, row by row, where a store keeps none."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import uuid
from contextlib import closing

import pytest
from psycopg import sql

from gpcdc_toolkit._expect import Suite
from gpcdc_toolkit.cluster import Session, Table, segment_for
from gpcdc_toolkit.errors import ConfigError
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate._expectations import TargetSuites, derived_outcomes
from gpcdc_toolkit.validate._snapshots import Snapshots

KEYED = ("public", 'Key "Kept" Here')
COLUMNS = '("Id" bigint, "k""2" text, v text, PRIMARY KEY ("Id", "k""2")) DISTRIBUTED BY ("Id")'


def table(key: tuple[str, ...]) -> Table:
    return Table("public.t", ("id", "v"), ("bigint", "text"), ("id",), key, ("public", "t"))


@pytest.mark.parametrize("key", [(), ("id",), ("id", 'k"2')])
@pytest.mark.parametrize("indexes", [["t_pkey", "t_pkey"], ["t_pkey", None], [None]])
@pytest.mark.parametrize("target_rows", [10, 9])
def test_the_derived_suite_needs_no_scan_only_where_every_store_enforces_the_key(key, indexes, target_rows):
    outcomes, left = derived_outcomes(table(key), 10, target_rows, indexes)
    count = outcomes[0]
    assert count.expectation == "expect_table_row_count_to_equal()"
    assert (count.success, count.evidence) == (target_rows == 10, f"observed {target_rows}")
    if key and None in indexes:  # great-expectations counts what a store does not enforce
        assert outcomes == [count] and [e["type"] for e in left][-len(key):] == ["expect_column_values_to_not_be_null"] * len(key)
    else:
        assert left == [] and len(outcomes) == 1 + (len(key) + 1 if key else 0)
        assert all(o.success and o.evidence.startswith(f"enforced on each of {len(indexes)} store") for o in outcomes[1:])


@pytest.fixture
def keyed(source):
    """A table of 200 rows with a two-column key, every segment's copy with its index."""
    with Session(source) as session:
        session.ddl(sql.SQL("CREATE TABLE {} ").format(sql.Identifier(*KEYED)).as_string(None) + COLUMNS)
        with session.transaction() as tx:
            tx.insert(KEYED, [{"Id": i, 'k"2': f"{i % 3}", "v": "x"} for i in range(200)])
    try:
        yield source.table(KEYED)
    finally:
        with Session(source) as session:
            session.ddl(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(*KEYED)).as_string(None))


def check(cluster, info, source_rows, target_rows):
    with Snapshots(cluster) as side:
        side.pin()
        outcomes = TargetSuites(cluster, [info], [], placement_checked=True).check(side, [(info, source_rows, target_rows)])
    return {o.expectation: o for o in outcomes}


def test_a_key_every_segment_enforces_is_reported_so_and_one_a_segment_lost_is_counted(source, keyed):
    unique = 'expect_compound_columns_to_be_unique(Id, k"2)'
    found = check(source, keyed, 200, 200)
    assert found[unique].success and found[unique].evidence.startswith(
        f"enforced on each of {source.segment_count} stores by its unique index"), found[unique]
    assert found['expect_column_values_to_not_be_null(k"2)'].success
    assert not check(source, keyed, 200, 199)["expect_table_row_count_to_equal()"].success

    # One segment loses its index, and then takes a second row of a key it holds.
    home = source.segments[segment_for([7], source.segment_count)]
    with source.connect_node(home) as conn:
        (index,) = conn.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass",
                                (keyed.name,)).fetchone()
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
            sql.Identifier(*KEYED), sql.Identifier(index.strip('"').replace('""', '"'))))
    found = check(source, keyed, 200, 200)
    assert found[unique].success and found[unique].evidence == "0 of 200 values unexpected", found[unique]
    with source.connect_node(home) as conn:
        conn.execute(sql.SQL("INSERT INTO {} VALUES (7, '1', 'twin')").format(sql.Identifier(*KEYED)))
    found = check(source, keyed, 200, 201)
    assert not found[unique].success and found[unique].evidence.startswith("2 of 201 values unexpected"), found[unique]
    assert found["expect_table_row_count_to_equal()"].evidence == "observed 201"


CHECKED_ALONE = """
import sys
from gpcdc_toolkit._expect import Suite
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate._expectations import TargetSuites
from gpcdc_toolkit.validate._snapshots import Snapshots

cluster = Sandbox(sys.argv[6], sys.argv[1]).cluster()
info = cluster.table(tuple(sys.argv[2:4]))
own = [Suite("v", "target", False, {"name": "v", "expectations": [
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "v"}}]}, info.name)] if sys.argv[4] == "own" else []
suites = TargetSuites(cluster, [info], own, placement_checked=sys.argv[5] == "checked")
imported_before_any_read = "great_expectations" in sys.modules
with Snapshots(cluster) as side:
    side.pin()
    outcomes = suites.check(side, [(info, 200, 200)])
assert len(outcomes) == 4 + len(own) and all(o.success for o in outcomes), outcomes
print(imported_before_any_read, "great_expectations" in sys.modules)
"""


@pytest.fixture(scope="module")
def one_store(work_dir):
    """A sandbox of one segment holding the keyed table: a target where a key is
    computed when placement is not checked (with several stores it is refused)."""
    sandbox = Sandbox(f"one-{uuid.uuid4().hex[:4]}", work_dir).up(segments=1)
    try:
        with Session(sandbox.cluster()) as session:
            session.ddl(sql.SQL("CREATE TABLE {} ").format(sql.Identifier(*KEYED)).as_string(None) + COLUMNS)
            with session.transaction() as tx:
                tx.insert(KEYED, [{"Id": i, 'k"2': f"{i % 3}", "v": "x"} for i in range(200)])
        yield sandbox
    finally:
        sandbox.down(remove=True)


@pytest.mark.parametrize(("own_suite", "placement"), [("none", "checked"), ("own", "checked"), ("none", "unchecked")])
def test_great_expectations_is_imported_only_for_what_it_computes_and_before_any_read(source_sandbox, keyed, one_store,
                                                                                       own_suite, placement):
    """Importing it takes seconds of a command's time: a table whose derived suite is
    known from the counts and the stores' unique indexes, with no suite of its own,
    does without it. Where it is needed (a suite of the table's own, a key not proven
    by the indexes as placement is not checked), it is imported before any cut."""
    import subprocess
    import sys

    sandbox = source_sandbox if placement == "checked" else one_store
    done = subprocess.run([sys.executable, "-c", CHECKED_ALONE, str(sandbox.work_dir), *KEYED, own_suite, placement,
                           sandbox.name], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    needed = str(own_suite == "own" or placement == "unchecked")
    assert done.stdout.split() == [needed, needed]


def test_a_table_others_inherit_from_has_its_key_counted_with_their_rows(source, keyed):
    home = source.segments[segment_for([7], source.segment_count)]
    child = sql.Identifier("public", f"{KEYED[1]} child")
    with source.connect_node(home) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} () INHERITS ({})").format(child, sql.Identifier(*KEYED)))
        conn.execute(sql.SQL("INSERT INTO {} VALUES (7, '1', 'inherited')").format(child))
    try:
        found = check(source, keyed, 200, 201)
    finally:
        with source.connect_node(home) as conn:
            conn.execute(sql.SQL("DROP TABLE {}").format(child))
    unique = found['expect_compound_columns_to_be_unique(Id, k"2)']
    assert not unique.success and unique.evidence.startswith("2 of 201 values unexpected"), unique


def test_the_key_is_refused_on_the_targets_catalog_where_its_distribution_is_elsewhere(source, keyed):
    elsewhere = dataclasses.replace(keyed, distribution_key=("v",))
    with Snapshots(source) as side, pytest.raises(ConfigError, match=r"do not include .* distribution key \(v\)"):
        TargetSuites(source, [keyed], [], placement_checked=True).check(side, [(elsewhere, 200, 200)])


def test_suites_still_running_when_the_comparison_fails_are_stopped_not_waited_for(source, keyed):
    """The suites run while the tables are compared: a comparison that fails leaves
    them, and their statement blocked on a store is cancelled rather than waited for."""
    home = source.segments[0]
    with Snapshots(source) as side, source.connect_node(home) as locker, source.connect_node(home) as watcher:
        side.pin()
        with locker.transaction():  # from here every read of the table on one store waits for the locker
            locker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(*KEYED)))
            (locker_pid,) = locker.execute("SELECT pg_backend_pid()").fetchone()
            values = Suite("values", "target", False, {"name": "values", "expectations": [
                {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "v"}}]}, keyed.name)
            suites = TargetSuites(source, [keyed], [values], placement_checked=True)
            with pytest.raises(RuntimeError, match="the comparison failed"), suites.start(side, [keyed]):
                assert waiting_for(watcher, locker_pid, seconds=60), "great-expectations never read the locked table"
                raise RuntimeError("the comparison failed")
            assert not [t.name for t in threading.enumerate() if t.name.startswith("target suites")]
            assert not waiting_for(watcher, locker_pid, seconds=0)


def waiting_for(watcher, locker_pid: int, *, seconds: float) -> bool:
    """Whether a backend waits for a lock ``locker_pid`` holds, asked until ``seconds`` pass."""
    until = time.monotonic() + seconds
    while True:
        (waiting,) = watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                     (locker_pid,)).fetchone()
        if waiting or time.monotonic() >= until:
            return bool(waiting)
        time.sleep(0.05)  # a condition polled, bounded by ``seconds``


def test_suites_on_a_store_whose_server_is_gone_leave_the_comparisons_error_to_say_what_failed(work_dir):
    """The comparison failed because a store's server went away: its statement cannot be
    cancelled (nothing answers there), and the comparison's error is the one raised,
    with the suites' thread ended."""
    sandbox = Sandbox(f"gone-{uuid.uuid4().hex[:4]}", work_dir).up(segments=1)
    try:
        cluster = sandbox.cluster()
        with Session(cluster) as session:
            session.ddl(sql.SQL("CREATE TABLE {} ").format(sql.Identifier(*KEYED)).as_string(None) + COLUMNS)
        info = cluster.table(KEYED)
        home = cluster.segments[0]
        values = Suite("values", "target", False, {"name": "values", "expectations": [
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "v"}}]}, info.name)
        # Connections closed, never committed: their server is gone by then.
        with Snapshots(cluster) as side, closing(cluster.connect_node(home)) as locker, \
                closing(cluster.connect_node(home)) as watcher:
            side.pin()
            watcher.autocommit = locker.autocommit = True
            locker.execute("BEGIN")
            locker.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(*KEYED)))
            (locker_pid,) = locker.execute("SELECT pg_backend_pid()").fetchone()
            suites = TargetSuites(cluster, [info], [values], placement_checked=True)
            with pytest.raises(RuntimeError, match="the comparison failed") as failed, suites.start(side, [info]):
                assert waiting_for(watcher, locker_pid, seconds=60), "great-expectations never read the table"
                os.kill(next(n for n in sandbox.nodes if n.content == 0).pid(), signal.SIGKILL)
                raise RuntimeError("the comparison failed: segment 0 went away")
            assert failed.value.__context__ is None  # nothing raised on the way out in its place
            assert not [t.name for t in threading.enumerate() if t.name.startswith("target suites")]
    finally:
        sandbox.down(remove=True)
