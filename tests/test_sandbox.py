"""Sandbox clusters: real PostgreSQL 15 servers, discovered as on Greenplum."""

import os
import socket

import psycopg
import pytest

from gpcdc_toolkit import ClusterError, SandboxError, UnreachableError
from gpcdc_toolkit.cluster import Cluster, Session
from gpcdc_toolkit.sandbox import Sandbox


def test_discovery_goes_through_gp_segment_configuration(source_sandbox, source):
    assert source.segment_count == 3
    with psycopg.connect(source_sandbox.dsn) as conn:
        rows = conn.execute(
            "SELECT content, role, preferred_role, mode, status, port, hostname, address, datadir "
            "FROM gp_segment_configuration ORDER BY content"
        ).fetchall()
    assert [r[0] for r in rows] == [-1, 0, 1, 2]
    assert [(n.content, n.port, n.datadir) for n in source.nodes] == [(r[0], r[5], r[8]) for r in rows]
    for node in source.nodes:
        with source.connect_node(node) as conn:
            assert conn.execute("SHOW port").fetchone()[0] == str(node.port)
            assert conn.execute("SHOW wal_level").fetchone()[0] == "logical"
    source.check_logical_decoding()


def test_servers_run_unprivileged(source_sandbox):
    for node, pid in source_sandbox.status():
        assert pid is not None, f"{node.name} is not running"
        uid = os.stat(f"/proc/{pid}").st_uid
        assert uid != 0 if os.geteuid() == 0 else uid == os.geteuid()


def test_up_is_idempotent_and_a_second_sandbox_runs_beside(work_dir, source_sandbox):
    again = Sandbox("source", work_dir).up(segments=3)
    assert again.dsn == source_sandbox.dsn
    target = Sandbox("side", work_dir).up(segments=2)
    try:
        cluster = target.cluster()
        assert cluster.segment_count == 2
        assert {n.port for n in cluster.nodes}.isdisjoint({n.port for n in source_sandbox.nodes})
        target.down()
        assert all(pid is None for _, pid in target.status())
        target.up(segments=2)  # restart from its data
        assert target.cluster().segment_count == 2
        with pytest.raises(SandboxError, match="exists with 2 segments, not 3"):
            target.up(segments=3)
    finally:
        target.down(remove=True)
    assert not target.path.exists()


def test_unknown_sandbox_names_the_fix(work_dir):
    with pytest.raises(SandboxError, match=r"no sandbox named 'ghost' .*gpcdc sandbox up --name ghost"):
        Sandbox("ghost", work_dir).cluster()


def test_invalid_name(work_dir):
    with pytest.raises(SandboxError, match="invalid sandbox name"):
        Sandbox("../etc", work_dir)


def test_port_taken_is_refused_and_nothing_is_left(work_dir):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        # The blocked port first: the ports after it may be anyone's, the one before too.
        with pytest.raises(SandboxError, match=f"port {port} is taken by another process.*--base-port"):
            Sandbox("blocked", work_dir).up(segments=1, base_port=port)
    assert not (work_dir / "sandboxes" / "blocked").exists()


def test_missing_binaries_name_the_package(work_dir, monkeypatch):
    monkeypatch.setenv("GPCDC_PG_BIN", str(work_dir / "nowhere"))
    with pytest.raises(SandboxError, match="install the Debian package postgresql-15, or set GPCDC_PG_BIN"):
        Sandbox("nobin", work_dir).up(segments=1)
    assert not (work_dir / "sandboxes" / "nobin").exists()


def test_unreachable_coordinator():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        with pytest.raises(UnreachableError, match=f"cannot reach coordinator 127.0.0.1:{port}: .*Connection refused: start the server"):
            Cluster.connect(f"host=127.0.0.1 port={port} user=gpcdc dbname=postgres")


@pytest.mark.parametrize("wrong", ["user=no_such_role", "dbname=no_such_database"])
def test_a_server_that_refuses_the_login_is_not_one_to_start(source, wrong):
    with pytest.raises(UnreachableError, match=r'does not exist: correct the user or dbname in the DSN') as refused:
        Cluster.connect(f"{source.dsn(source.coordinator)} {wrong}")
    assert wrong.split("=")[1] in str(refused.value) and "start the server" not in str(refused.value)


@pytest.mark.parametrize("reason", [  # libpq's words, which the sandbox (trusting local logins) cannot provoke
    'connection to server at "db" (10.0.0.1), port 5432 failed: FATAL:  password authentication failed for user "u"',
    'connection to server at "db" (10.0.0.1), port 5432 failed: fe_sendauth: no password supplied'])
def test_a_refused_password_says_to_correct_it(reason):
    from gpcdc_toolkit.cluster._cluster import _refusal_fix

    assert _refusal_fix(reason) == "correct the user and password in the DSN (or in the password file it uses)"


def test_a_table_named_by_a_number_is_refused_not_taken_for_the_table_of_that_object_id(source):
    with Session(source) as session:
        session.ddl("CREATE TABLE IF NOT EXISTS numbered_by_oid (id int PRIMARY KEY) DISTRIBUTED BY (id)")
    with source.coordinator_connection() as conn:
        oid = conn.execute("SELECT 'numbered_by_oid'::regclass::oid").fetchone()[0]
    assert source.table("numbered_by_oid").name == "public.numbered_by_oid"
    for name in (str(oid), f" {oid} ", "0"):
        with pytest.raises(ClusterError, match=f"{name!r} is not a valid table name: a name is read as SQL reads it"):
            source.table(name)


@pytest.mark.parametrize(("name", "said"), [
    ("a.b.c", "'a.b.c' is not a valid table name"),  # another database's
    ("a.b.c.d", "'a.b.c.d' is not a valid table name"),
    ("no_such_schema.t", "no table no_such_schema.t on the coordinator"),
    ("x; drop table t", "'x; drop table t' is not a valid table name"),
])
def test_a_table_name_that_names_no_table_here_is_one_line_with_the_fix(source, name, said):
    with pytest.raises(ClusterError) as refused:
        source.table(name)
    assert str(refused.value).startswith(said) and "a name is read as SQL reads it" in str(refused.value)


def test_plain_postgres_is_not_a_coordinator(source):
    segment = source.segments[0]
    with pytest.raises(ClusterError, match="has no gp_segment_configuration"):
        Cluster.connect(source.dsn(segment))


def test_misconfigured_nodes_are_named_with_the_fix(work_dir):
    sandbox = Sandbox("misconf", work_dir).up(segments=1)
    try:
        cluster = sandbox.cluster()
        with cluster.connect_node(cluster.segments[0]) as conn:
            conn.execute("ALTER SYSTEM SET wal_level = replica")
        sandbox.down()
        sandbox.up(segments=1)
        with pytest.raises(ClusterError, match=r"segment 0 \(127.0.0.1:\d+\) has wal_level=replica: set wal_level = logical"):
            cluster.check_logical_decoding()
        with cluster.connect_node(cluster.segments[0]) as conn:
            conn.execute("ALTER SYSTEM RESET wal_level")
            conn.execute("ALTER SYSTEM SET max_prepared_transactions = 0")
        sandbox.down()
        sandbox.up(segments=1)
        with pytest.raises(ClusterError, match="max_prepared_transactions=0.*set max_prepared_transactions"):
            cluster.check_logical_decoding()
    finally:
        sandbox.down(remove=True)


def test_a_restart_mode_other_than_fast_or_immediate_is_refused(tmp_path):
    from gpcdc_toolkit.errors import SandboxError

    with pytest.raises(SandboxError, match="unknown stop mode 'smart': use fast or immediate"):
        Sandbox("x", tmp_path).restart(0, "smart")
