"""Distributed transactions on a real 1+3 sandbox, checked in each node's WAL."""

import threading

import psycopg
import pytest

from gpcdc_toolkit import DistributedTransactionError, GpcdcError
from gpcdc_toolkit.cluster import Session, gid, segment_for
from gpcdc_toolkit.protocol import _markers as markers

from ._decoding import committed_transactions, create_slot, drop_slot

SLOT = "dtx_test"


@pytest.fixture(scope="module")
def decoded(source):
    """A function returning, per node, the decoded local transactions since the module began."""
    conns = {node.content: source.connect_node(node) for node in source.nodes}
    for conn in conns.values():
        create_slot(conn, SLOT)
    try:
        yield lambda: {content: committed_transactions(conn, SLOT) for content, conn in conns.items()}
    finally:
        for conn in conns.values():
            drop_slot(conn, SLOT)
            conn.close()


def parts_of(decoded_nodes, gxid):
    """node content -> the local transactions carrying markers or records for gxid."""
    found = {}
    for content, transactions in decoded_nodes.items():
        for tx in transactions:
            ms = [markers.decode(p, c) for p, c in tx.messages]
            if any(m is not None and m.gxid == gxid for m in ms):
                found.setdefault(content, []).append((tx, ms))
    return found


@pytest.fixture
def table(source, table_name):
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table_name} (id bigint PRIMARY KEY, v text) DISTRIBUTED BY (id)")
    return table_name


def keys_on(segment, count, segments=3, start=1):
    keys, k = [], start
    while len(keys) < count:
        if segment_for([k], segments) == segment:
            keys.append(k)
        k += 1
    return keys


def test_rows_land_on_the_segment_their_key_hashes_to(source, table):
    with Session(source) as session, session.transaction() as tx:
        tx.insert(table, [{"id": k, "v": str(k)} for k in range(200)])
    stored = source.rows_by_segment(table)
    assert sum(len(rows) for rows in stored.values()) == 200
    for segment, rows in stored.items():
        assert rows and all(segment_for([row[0]], 3) == segment for row in rows)


def test_one_phase_commit_carries_gxid_and_one_phase_flag(source, table, decoded):
    with Session(source) as session, session.transaction() as tx:
        tx.insert(table, [{"id": k, "v": "x"} for k in keys_on(1, 3)])
    assert tx.touched == [1] and tx.one_phase
    parts = parts_of(decoded(), tx.gxid)
    assert list(parts) == [1], "a one-phase transaction writes no coordinator record"
    [(local, ms)] = parts[1]
    assert ms[0] == markers.GxidMarker(tx.gxid) and ms[-1] == markers.OnePhaseMarker(tx.gxid)
    assert [op for _, op in local.changes] == ["INSERT"] * 3


def test_two_phase_commit_writes_parts_and_a_commit_record(source, table, decoded):
    rows = [{"id": k, "v": "y"} for k in keys_on(0, 2) + keys_on(2, 2)]
    with Session(source) as session, session.transaction() as tx:
        tx.insert(table, rows)
    parts = parts_of(decoded(), tx.gxid)
    assert sorted(parts) == [-1, 0, 2]
    [(_, coordinator_ms)] = parts[-1]
    assert coordinator_ms == [markers.CommitRecord(tx.gxid, (0, 2))]
    for segment in (0, 2):
        [(local, ms)] = parts[segment]
        assert ms == [markers.GxidMarker(tx.gxid)], "no one-phase flag on a two-phase part"
        assert len(local.changes) == 2
    assert source.prepared_transactions() == []


def test_rollback_and_abort_after_prepare_leave_nothing(source, table, decoded):
    rows = [{"id": k, "v": "z"} for k in keys_on(0, 1) + keys_on(1, 1)]
    with Session(source) as session:
        with pytest.raises(RuntimeError):
            with session.transaction() as tx1:
                tx1.insert(table, rows)
                raise RuntimeError("application error")
        tx2 = session.transaction()
        tx2.insert(table, rows)
        tx2.prepare_and_abort()
        assert tx1.state == tx2.state == "aborted"
    assert sum(len(r) for r in source.rows_by_segment(table).values()) == 0
    assert source.prepared_transactions() == []
    nodes = decoded()
    assert parts_of(nodes, tx1.gxid) == {} and parts_of(nodes, tx2.gxid) == {}


def test_a_failing_statement_aborts_every_part(source, table):
    a, b = keys_on(0, 1)[0], keys_on(1, 1)[0]
    with Session(source) as session:
        with session.transaction() as tx:
            tx.insert(table, [{"id": b, "v": "first"}])
        with pytest.raises(psycopg.errors.UniqueViolation):
            with session.transaction() as tx:
                tx.insert(table, [{"id": a, "v": "new"}])
                tx.insert(table, [{"id": b, "v": "duplicate"}])
        with session.transaction() as tx:  # the session is usable again
            tx.update(table, {"id": b}, {"v": "second"})
    stored = sorted(row for rows in source.rows_by_segment(table).values() for row in rows)
    assert stored == [(b, "second")]


def test_legacy_markers_are_what_stock_greenplum_writes(source, table, decoded):
    with Session(source, legacy_markers=True) as session, session.transaction() as tx:
        tx.insert(table, [{"id": k, "v": "l"} for k in keys_on(0, 1) + keys_on(1, 1)])
    nodes = decoded()
    parts = parts_of(nodes, tx.gxid)
    assert list(parts) == [-1]
    assert parts[-1][0][1] == [markers.CommitRecord(tx.gxid, None)]
    for segment in (0, 1):
        last = nodes[segment][-1]
        assert last.changes and last.messages == [], "legacy segment parts carry no markers"


def test_update_of_the_distribution_key_moves_the_row(source, table, decoded):
    old = keys_on(0, 1, start=5000)[0]
    new = keys_on(2, 1, start=6000)[0]
    with Session(source) as session:
        with session.transaction() as tx:
            tx.insert(table, [{"id": old, "v": "moving"}])
        with session.transaction() as tx:
            assert tx.update(table, {"id": old}, {"id": new}) == 1
    stored = source.rows_by_segment(table)
    assert stored[0] == [] and stored[2] == [(new, "moving")]
    parts = parts_of(decoded(), tx.gxid)
    assert parts[-1][0][1] == [markers.CommitRecord(tx.gxid, (0, 2))]
    assert parts[0][0][0].changes == [(f"public.{table}", "DELETE")]
    assert parts[2][0][0].changes == [(f"public.{table}", "INSERT")]


def test_ddl_is_one_distributed_transaction_with_a_record(source, table_name, decoded):
    statement = f"CREATE TABLE {table_name} (k text, n int, PRIMARY KEY (k, n)) DISTRIBUTED BY (k)"
    with Session(source) as session:
        gxid = session.ddl(statement)
        info = source.table(table_name)
        assert info.distribution_key == ("k",) and info.primary_key == ("k", "n")
        session.ddl(f"ALTER TABLE {table_name} RENAME COLUMN k TO key")
        assert source.table(table_name).distribution_key == ("key",)
        for node in source.nodes:
            with source.connect_node(node) as conn:
                assert conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table_name,)).fetchone()[0]
        parts = parts_of(decoded(), gxid)
        assert sorted(parts) == [-1, 0, 1, 2]
        assert markers.DdlRecord(gxid, statement) in parts[-1][0][1]
        assert markers.CommitRecord(gxid, (0, 1, 2)) in parts[-1][0][1]
        session.ddl(f"DROP TABLE {table_name}")
    with pytest.raises(GpcdcError, match="no table"):
        source.table(table_name)


def test_ddl_errors_are_clear(source, table_name):
    with Session(source) as session:
        with pytest.raises(GpcdcError, match="no DISTRIBUTED BY clause"):
            session.ddl(f"CREATE TABLE {table_name} (id int)")
        with pytest.raises(GpcdcError, match=r"primary key \(id\) .* does not contain its distribution key \(v\)"):
            session.ddl(f"CREATE TABLE {table_name} (id int PRIMARY KEY, v int) DISTRIBUTED BY (v)")
        with pytest.raises(GpcdcError, match=r"column\(s\) nope that .* does not have: name existing columns"):
            session.ddl(f"CREATE TABLE {table_name} (id int PRIMARY KEY) DISTRIBUTED BY (nope)")
    for node in source.nodes:
        with source.connect_node(node) as conn:
            assert conn.execute("SELECT to_regclass(%s) IS NULL", (table_name,)).fetchone()[0]


def test_create_if_not_exists_of_a_table_that_exists_keeps_its_key(source, table_name):
    with Session(source) as session:
        session.ddl(f"CREATE TABLE IF NOT EXISTS {table_name} (id int PRIMARY KEY, v int) DISTRIBUTED BY (id)")
        try:
            # As in Greenplum, skipped with its different key: the table keeps the one it has.
            session.ddl(f"CREATE TABLE IF NOT EXISTS {table_name} (id int, v int) DISTRIBUTED BY (v)")
            assert source.table(table_name).distribution_key == ("id",)
        finally:
            session.ddl(f"DROP TABLE {table_name}")


def test_a_new_table_replaces_a_key_left_under_its_oid(source, table_name):
    """A table dropped outside the toolkit leaves its key behind; a new table that gets
    the same OID takes its own key, not that one."""
    with source.coordinator_connection() as conn, conn.transaction(force_rollback=True):
        conn.execute(f"CREATE TABLE {table_name} (id int, v int)")
        conn.execute("INSERT INTO gp_dist.gp_distribution_policy VALUES (%s::regclass, '{1}')", (table_name,))
        conn.execute("SELECT gp_dist.set_distribution_policy(%s, ARRAY['v'])", (table_name,))
        assert conn.execute("SELECT distkey FROM gp_dist.gp_distribution_policy WHERE localoid = %s::regclass",
                            (table_name,)).fetchone()[0] == [2]


def test_start_lock_holds_new_transactions_back(source, table):
    with source.coordinator_connection() as controller, Session(source) as session:
        controller.execute("SELECT gp_acquire_transaction_start_lock()")
        blocked = session.connection(-1)
        blocked.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            session.transaction()
        controller.execute("SELECT gp_release_transaction_start_lock()")
        with session.transaction() as tx:
            tx.insert(table, [{"id": 1, "v": "after"}])
        assert tx.state == "committed"


def test_wait_for_running_transactions(source, table):
    with source.coordinator_connection() as controller, Session(source) as a, Session(source) as b:
        mine = a.transaction()
        other = b.transaction()
        other.insert(table, [{"id": 7, "v": "running"}])
        with pytest.raises(psycopg.errors.RaiseException, match=f"still running .*{other.gxid}"):
            controller.execute("SELECT gp_wait_running_transaction_end(%s, 0.2)", (mine.gxid,))
        finished = threading.Event()

        def waiter():
            with source.coordinator_connection() as conn:
                conn.execute("SELECT gp_wait_running_transaction_end(%s, 30)", (mine.gxid,))
            finished.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        assert not finished.wait(0.3), "the wait returned while a transaction was running"
        other.commit()
        thread.join(30)
        assert finished.is_set()
        mine.rollback()
        assert set(gxid for (gxid,) in controller.execute("SELECT gp_dist.running_gxids()")) == set()


def test_commit_lock_holds_commit_phases_back(source, table):
    with source.coordinator_connection() as controller, Session(source) as session:
        tx = session.transaction()
        tx.insert(table, [{"id": k, "v": "c"} for k in keys_on(0, 1) + keys_on(1, 1)])
        controller.execute("SELECT gp_acquire_commit_lock()")
        session.connection(-1).execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            session.transaction()  # a start in the middle of a cut waits for it too
        with pytest.raises(DistributedTransactionError, match="aborted before its commit record"):
            tx.commit()
        controller.execute("SELECT gp_release_commit_lock()")
        session.connection(-1).execute("SET lock_timeout = 0")
    assert sum(len(r) for r in source.rows_by_segment(table).values()) == 0
    assert source.prepared_transactions() == []


def test_gid_names_the_gxid():
    assert gid(42) == "gpcdc_42"


def test_ddl_failing_on_segments_rolls_back_everywhere(source, table):
    with Session(source) as session:
        with pytest.raises(psycopg.errors.DuplicateTable):
            session.ddl(f"CREATE TABLE {table} (id bigint PRIMARY KEY) DISTRIBUTED BY (id)")
        with session.transaction() as tx:  # nothing left open
            tx.insert(table, [{"id": 1, "v": "ok"}])
    assert source.prepared_transactions() == []


@pytest.mark.parametrize("record_written", [True, False])
def test_in_doubt_parts_of_a_dead_client_are_finished_by_the_commit_record(source, table, record_written):
    from gpcdc_toolkit.cluster import resolve_in_doubt

    session = Session(source)
    tx = session.transaction()
    rows = [{"id": k, "v": "in doubt"} for k in keys_on(0, 2) + keys_on(1, 2)]
    tx.insert(table, rows)
    for segment in tx.touched:  # the client's commit, cut short after PREPARE (and the record)
        session.connection(segment).execute(f"PREPARE TRANSACTION '{gid(tx.gxid)}'")
    if record_written:
        tx._write_commit_record()
    session.close()  # the client dies: its gxid stops running, its parts stay prepared
    assert {g for _n, g, _d in source.prepared_transactions()} == {gid(tx.gxid)}

    committed, rolled_back = resolve_in_doubt(source)
    assert len(committed if record_written else rolled_back) == 2 and not (rolled_back if record_written else committed)
    assert source.prepared_transactions() == []
    stored = sum(len(r) for r in source.rows_by_segment(table).values())
    assert stored == (len(rows) if record_written else 0)


def test_in_doubt_resolution_leaves_a_live_transaction_alone(source, table):
    from gpcdc_toolkit.cluster import resolve_in_doubt

    with Session(source) as session:
        tx = session.transaction()
        tx.insert(table, [{"id": k, "v": "live"} for k in keys_on(0, 1) + keys_on(2, 1)])
        for segment in tx.touched:
            session.connection(segment).execute(f"PREPARE TRANSACTION '{gid(tx.gxid)}'")
        with pytest.raises(DistributedTransactionError, match=rf"gxids \[{tx.gxid}\] still belong to running"):
            resolve_in_doubt(source, timeout=0.3)  # its gxid runs: not an orphan, and waited for
        assert len(source.prepared_transactions()) == 2
        for segment in tx.touched:
            session.connection(segment).execute(f"ROLLBACK PREPARED '{gid(tx.gxid)}'")
        tx.state = "aborted"


def test_upsert_and_delete_keys_in_bulk(source, table):
    with Session(source) as session:
        with session.transaction() as tx:
            tx.insert(table, [{"id": k, "v": "old"} for k in range(20)])
        with session.transaction() as tx:
            assert tx.upsert(table, [{"id": k, "v": "new"} for k in range(10, 30)]) == 20
            assert tx.delete_keys(table, [{"id": k} for k in [*range(0, 5), 99, 3]]) == [True] * 5 + [False] * 2
    stored = {row[0]: row[1] for rows in source.rows_by_segment(table).values() for row in rows}
    assert stored == {**{k: "old" for k in range(5, 10)}, **{k: "new" for k in range(10, 30)}}
    for segment, rows in source.rows_by_segment(table).items():
        assert all(segment_for([row[0]], 3) == segment for row in rows)
