"""The source cluster changing under the pipeline, on real servers: a sandbox with
synchronous mirrors fails a segment over as Greenplum's fault-tolerance service does;
capture of the failed-over segment, of a segment whose slot was dropped, and of one
whose slot was invalidated stops for good and says why in one line, with an exit
status of its own, while the other nodes go on."""

import contextlib
import subprocess
import sys
import threading
import time
import uuid

import psycopg
import pytest

from gpcdc_toolkit.bootstrap import BootstrapError, Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, capture_status, extend_pipeline, repair_segment, wait_until_acknowledged
from gpcdc_toolkit.cluster import Session, segment_for
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.errors import ClusterChangedError, ClusterError, GpcdcError, SandboxError
from gpcdc_toolkit.ingest import end_offsets, read_values
from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.replay import MissingPartError, Replayer
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import table_rows

from ._kafka import lose_tail
from .test_replay_faults import ENV

pytestmark = pytest.mark.changes


@pytest.fixture(scope="module")
def mirrored(work_dir):
    """A sandbox of 2 segments with mirrors and a standby, made for this module (its
    segments fail over)."""
    sandbox = Sandbox(f"mirrored-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, mirrors=True)
    try:
        yield sandbox
    finally:
        sandbox.down(remove=True)


@contextlib.contextmanager
def capturing(sandbox, broker, work_dir, **settings):
    """A table written on both segments of ``sandbox``, a pipeline bootstrapped and
    captured up to now: (cluster, config, pipeline, group, table). Its capture stopped
    and its slots dropped after, on the source as its catalog lists it then."""
    cluster = sandbox.cluster()
    table = f"t{uuid.uuid4().hex[:6]}"
    with Session(cluster) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"m{uuid.uuid4().hex[:8]}", "source.sandbox": sandbox.name,
                          **settings}, environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    group = CaptureGroup(config.with_settings({"capture.max_backoff": 1.0}))
    bootstrap(cluster, pipeline, "snapshot")
    try:
        group.start()
        write(cluster, table, range(0, 40))
        wait_until_acknowledged(cluster, pipeline.slot)
        yield cluster, config, pipeline, group, table
    finally:
        group.stop()
        drop_slots(sandbox.cluster(), pipeline.slot, publication=pipeline.publication)


@pytest.fixture
def captured(mirrored, broker, work_dir):
    with capturing(mirrored, broker, work_dir) as pipeline:
        yield pipeline


def replayed_until_the_gap(config, work_dir, table):
    """Replay the pipeline into a fresh target: the rows written before the change
    (ids 0-39) arrive, then the replay stops at the gap; returns why."""
    target = Sandbox(f"mt-{uuid.uuid4().hex[:4]}", work_dir).up(segments=1)
    try:
        with Replayer(config.with_settings({"target.sandbox": target.name})) as replayer, \
                pytest.raises(MissingPartError) as raised:
            replayer.run()
        assert sorted(table_rows(target.cluster(), table)) == [(i, "x") for i in range(40)]
    finally:
        target.down(remove=True)
    return raised.value


def write(cluster, table, ids):
    with Session(cluster) as session, session.transaction() as tx:
        tx.insert(table, [{"id": i, "v": "x"} for i in ids])


def failed_state(group, content, timeout=60.0):
    """The worker's last state once it has stopped for good (polling the status file it
    writes before it exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = (group.status(content) or {}).get("state", "")
        if state.startswith("failed: "):
            return state
        threading.Event().wait(0.1)
    pytest.fail(f"node {content}'s worker did not stop within {timeout:g} s: {group.status(content)}")


def test_a_mirrored_sandbox_lists_its_mirrors_as_greenplum_does_and_fails_over(mirrored):
    with psycopg.connect(mirrored.dsn) as conn:
        rows = conn.execute("SELECT content, role, preferred_role, mode, status FROM gp_segment_configuration "
                            "ORDER BY role DESC, content").fetchall()
    assert [r for r in rows if r[1] == "p"] == [(c, "p", "p", "s", "u") for c in (-1, 0, 1)]
    assert [r for r in rows if r[1] == "m"] == [(c, "m", "m", "s", "u") for c in (-1, 0, 1)]
    for node in mirrored.cluster().nodes:  # each primary waits for its mirror at commit
        with mirrored.cluster().connect_node(node) as conn:
            assert conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall() == [("sync",)]
    with pytest.raises(SandboxError, match="cannot fail over node 7 of sandbox .*: there is no segment 7"):
        mirrored.failover(7)


def test_a_failed_over_segment_stops_its_capture_with_the_reason_and_the_others_go_on(mirrored, captured, work_dir):
    cluster, config, pipeline, group, table = captured
    before = {n.content: n.port for n in cluster.nodes}
    done = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(config.work_dir),
                           "sandbox", "failover", "--name", mirrored.name, "--segment", "1"],
                          env=ENV, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0, done.stderr
    now = mirrored.cluster()
    assert {n.content: n.port for n in now.nodes} == {**before, 1: mirrored.nodes[2].port} != before
    with psycopg.connect(mirrored.dsn) as conn:
        assert conn.execute("SELECT role, status FROM gp_segment_configuration WHERE content = 1 AND port = %s",
                            (before[1],)).fetchone() == ("m", "d")
    state = failed_state(group, 1)
    assert f"{now.segments[1]} is on timeline 2, not 1: its mirror or standby was promoted in its place" in state
    assert "bootstrap the pipeline again" in state
    # Nothing committed is lost by the failover itself (the mirror was synchronous),
    # and the other nodes' capture goes on.
    write(now, table, range(40, 80))
    assert sum(len(rows) for rows in now.rows_by_segment(table).values()) == 80
    wait_until_acknowledged(now, pipeline.slot, contents=[-1, 0])
    # The replayer applies what was captured, and stops before the first transaction the
    # lost segment cannot complete (its part of rows 40-79), saying why.
    stopped = replayed_until_the_gap(config, work_dir, table)
    assert stopped.missing.segment == 1 and stopped.missing.present == (0,)
    assert f"segment 1 is lost to the pipeline ({now.segments[1]} is on timeline 2, not 1" in str(stopped)
    status = {row.node: row for row in capture_status(now, group)}
    assert status[1].state.startswith("failed: ") and status[1].acked_lsn == "no slot"
    shown = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(config.work_dir),
                            "--source-sandbox", mirrored.name, "--kafka-bootstrap-servers",
                            config.kafka.bootstrap_servers, "--kafka-topic-prefix", config.kafka.topic_prefix, "status"],
                           env=ENV, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    # Status finds the change itself, and says it as the worker did.
    assert shown.returncode == 5, shown.stdout + shown.stderr
    assert shown.stderr.splitlines() == [f"gpcdc: node 1 changed under the pipeline: {state.removeprefix('failed: ')}"]


def test_a_dropped_slot_and_an_invalidated_slot_stop_their_nodes_capture_with_the_reason(captured):
    cluster, config, pipeline, group, table = captured
    segment0, coordinator = cluster.segments[0], cluster.coordinator
    group.kill(0)
    with cluster.connect_node(segment0, autocommit=True) as conn:
        drop_released_slot(conn, pipeline.slot)
    group.start_node(0, group.log_file(0))
    assert failed_state(group, 0) == (
        f"failed: slot {pipeline.slot} is missing on {segment0}: it was dropped, so the changes since its acknowledged "
        "position can no longer be decoded: capture it again with `gpcdc bootstrap repair --segment 0`, or bootstrap "
        "the pipeline again (`gpcdc bootstrap drop`, then `gpcdc bootstrap create`) and replay into a fresh target; "
        "docs/reliability.md says what a node change loses and why")
    # The coordinator's slot falls behind further than max_slot_wal_keep_size allows.
    group.kill(-1)
    invalidate_slot(cluster, coordinator, pipeline.slot)
    group.start_node(-1, group.log_file(-1))
    assert failed_state(group, -1).startswith(
        f"failed: slot {pipeline.slot} on {coordinator} was invalidated: the WAL it still needed was removed")
    # Segment 1 is untouched: its capture goes on.
    write(cluster, table, range(100, 120))
    wait_until_acknowledged(cluster, pipeline.slot, contents=[1])


def invalidate_slot(cluster, node, slot):
    """Make ``slot`` on ``node`` fall further behind than max_slot_wal_keep_size allows
    (its worker stopped first): WAL written in a table of that node alone, switched and
    checkpointed away, until the slot's wal_status is lost."""
    with cluster.connect_node(node, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        try:
            for _attempt in range(20):
                conn.execute("CREATE TABLE IF NOT EXISTS wal_filler (x text)")
                conn.execute("INSERT INTO wal_filler SELECT repeat('x', 1000) FROM generate_series(1, 3000)")
                conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
                status = conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                                      (slot,)).fetchone()[0]
                if status == "lost":
                    break
            assert status == "lost"
        finally:
            conn.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("DROP TABLE IF EXISTS wal_filler")


def test_the_worker_process_exits_with_the_status_of_a_changed_cluster(captured):
    cluster, config, pipeline, group, _table = captured
    group.kill(1)
    with cluster.connect_node(cluster.segments[1], autocommit=True) as conn:
        drop_released_slot(conn, pipeline.slot)
    worker = subprocess.run(group.worker_argv(1), env={**ENV, **_child_env(config)}, capture_output=True, text=True,
                            stdin=subprocess.DEVNULL, timeout=120)
    assert worker.returncode == ClusterChangedError.exit_code == 5, worker.stderr
    assert f"slot {pipeline.slot} is missing on {cluster.segments[1]}" in worker.stderr.strip().splitlines()[-1]


def drop_released_slot(conn, slot, timeout=60.0):
    """Drop the slot once its killed worker's walsender has let it go: the server ends
    that walsender only when it notices the connection closed, some time after the kill."""
    deadline = time.monotonic() + timeout
    while conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0]:
        assert time.monotonic() < deadline, f"slot {slot} is still active {timeout:g} s after its worker was killed"
        threading.Event().wait(0.05)  # polling the server's view of the slot
    conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def _child_env(config):
    from gpcdc_toolkit.capture import child_environment

    return child_environment(config)


def test_segments_added_since_the_bootstrap_stop_capture_with_the_reason(mirrored, captured, work_dir):
    cluster, config, pipeline, group, table = captured
    # An expansion as the catalog shows it: a new server listed as segment 2.
    added = Sandbox(f"added-{uuid.uuid4().hex[:4]}", work_dir).up(flavour="postgres")
    try:
        with psycopg.connect(mirrored.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO gp_dist.gp_segment_configuration VALUES "
                         "(100, 2, 'p', 'p', 'n', 'u', %s, '127.0.0.1', '127.0.0.1', %s)",
                         (added.nodes[0].port, added.nodes[0].datadir))
        assert [n.content for n in mirrored.cluster().segments] == [0, 1, 2]
        group.kill(0)  # the next session of a worker looks at the catalog again
        group.start_node(0, group.log_file(0))
        assert failed_state(group, 0).startswith(
            "failed: the source lists segments [2], which the pipeline's start point does not (added since the "
            "bootstrap): no slot of the pipeline decodes them: extend the pipeline to the new segments "
            "(`gpcdc bootstrap extend`; a Citus source or the key dispatcher: bootstrap again)")
        kafka = kafka_client_settings(config)
        with pytest.raises(BootstrapError, match="segment 2 was added to the source after the bootstrap: the "
                                                 r"pipeline never captured it: extend the pipeline to it"):
            repair_segment(mirrored.cluster(), pipeline, 2, kafka)
        with pytest.raises(BootstrapError, match="capture.dispatcher is 'key': the changes topic spreads keys over "
                                                 "its partitions by their number") as raised:
            extend_pipeline(mirrored.cluster(), pipeline, kafka, dispatcher="key")
        assert "bootstrap the pipeline again" in str(raised.value)
        assert not pipeline.repairs_dir.exists(), "a refusal leaves nothing behind"
        with pytest.raises(SandboxError, match="is a postgres cluster; only a greenplum sandbox expands"):
            added.expand(1)
    finally:
        with psycopg.connect(mirrored.dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM gp_dist.gp_segment_configuration WHERE dbid = 100")
        added.down(remove=True)


def test_an_extension_with_nothing_new_and_expansions_out_of_range_are_refused(mirrored, captured):
    cluster, config, pipeline, _group, _table = captured
    with pytest.raises(BootstrapError, match=r"the pipeline captures every segment the source lists \(0 to 1\)"):
        extend_pipeline(cluster, pipeline, kafka_client_settings(config), dispatcher="segment")
    with pytest.raises(SandboxError, match="cannot add 0 segments to sandbox .*: it has 2, and a sandbox has 1 to 64: "
                                           "add 1 to 62 segments"):
        mirrored.expand(0)
    with pytest.raises(SandboxError, match="cannot add 63 segments"):
        mirrored.expand(63)
    assert [n.content for n in mirrored.cluster().segments] == [0, 1]


def test_an_expanded_mirrored_sandbox_gives_its_new_segments_mirrors_as_greenplum_lists_them(work_dir):
    sandbox = Sandbox(f"em-{uuid.uuid4().hex[:4]}", work_dir).up(segments=1, mirrors=True)
    try:
        expansion = sandbox.expand(1)
        assert expansion.added == [1] and expansion.moved == {}  # no tables: nothing moves
        with psycopg.connect(sandbox.dsn) as conn:
            rows = conn.execute("SELECT content, role, preferred_role, mode, status FROM gp_segment_configuration "
                                "ORDER BY role DESC, content").fetchall()
            dbids = [r[0] for r in conn.execute("SELECT dbid FROM gp_segment_configuration")]
        assert rows == [(c, role, role, "s", "u") for role in "pm" for c in (-1, 0, 1)]
        assert len(set(dbids)) == 6
        with sandbox.cluster().connect_node(sandbox.cluster().segments[1]) as conn:
            assert conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall() == [("sync",)]
        promoted = sandbox.failover(1)
        assert sandbox.cluster().segments[1].port == promoted.port
    finally:
        sandbox.down(remove=True)


def test_an_extension_waits_for_an_expansion_to_finish_its_redistribution(broker, work_dir):
    """Rows left on a segment their key no longer names (an expansion stopped half-way)
    would be deleted from the target by the new segment's copy: the extension refuses
    until `gpcdc sandbox expand --finish` has moved them."""
    sandbox = Sandbox(f"ef-{uuid.uuid4().hex[:4]}", work_dir).up(segments=1)
    try:
        cluster = sandbox.cluster()
        with Session(cluster) as session:
            session.ddl('CREATE TABLE "T f" (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)')
            with session.transaction() as tx:
                tx.insert('"T f"', [{"id": i, "v": "x"} for i in range(50)])
        config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                              "kafka.topic_prefix": f"e{uuid.uuid4().hex[:8]}", "source.sandbox": sandbox.name},
                             environ={})
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        bootstrap(cluster, pipeline, "snapshot")
        try:
            CaptureGroup(config).start()  # the topics and each partition's marker
            CaptureGroup(config).stop()
            assert sandbox.expand(1).rows_moved > 0
            now = sandbox.cluster()
            # Half-way: a row of segment 1 back on segment 0, as an interrupted move leaves it.
            stray = next(i for i in range(50) if segment_for([i], 2) == 1)
            with now.connect_node(now.segments[1]) as conn:
                conn.execute('DELETE FROM "T f" WHERE id = %s', (stray,))
            with now.connect_node(now.segments[0]) as conn:
                conn.execute('INSERT INTO "T f" VALUES (%s, %s)', (stray, "x"))
            kafka = kafka_client_settings(config)
            with pytest.raises(BootstrapError, match=r'table public."T f" has 1 rows on segments its distribution key '
                                                     r"does not place them on: .*`gpcdc sandbox expand --finish`"):
                extend_pipeline(now, pipeline, kafka, dispatcher="segment")
            finished = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(work_dir), "sandbox",
                                       "expand", "--name", sandbox.name, "--finish"], env=ENV, capture_output=True,
                                      text=True, stdin=subprocess.DEVNULL, timeout=120)
            assert finished.returncode == 0, finished.stderr
            assert "1 rows of 1 tables moved to the segments their distribution key places them on" in finished.stdout
            [joined] = extend_pipeline(now, pipeline, kafka, dispatcher="segment")
            assert joined.joined and joined.node.content == 1
        finally:
            drop_slots(sandbox.cluster(), pipeline.slot, publication=pipeline.publication)
    finally:
        sandbox.down(remove=True)


def test_a_coordinator_whose_standby_took_over_stops_its_capture_and_the_replay_at_the_first_unrecorded_part(
        broker, work_dir):
    """The coordinator fails, its standby is activated: capture finds the new
    coordinator through the configuration, sees it is another timeline, and ends the
    coordinator's partition with a lost mark; the segments' capture goes on. The
    replayer applies every transaction whose commit record came and stops at the first
    part whose record cannot come."""
    sandbox = Sandbox(f"cf-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, mirrors=True)
    try:
        with capturing(sandbox, broker, work_dir) as (cluster, config, pipeline, group, table):
            before = cluster.coordinator.port
            done = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(config.work_dir),
                                   "sandbox", "failover", "--name", sandbox.name, "--coordinator"],
                                  env=ENV, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
            assert done.returncode == 0, done.stderr
            now = sandbox.cluster()
            assert now.coordinator.port != before and [n.port for n in now.segments] == [n.port for n in
                                                                                           cluster.segments]
            with psycopg.connect(sandbox.dsn) as conn:  # the catalog, as the new coordinator holds it
                assert conn.execute("SELECT role, status FROM gp_segment_configuration WHERE content = -1 "
                                    "ORDER BY role DESC").fetchall() == [("p", "u"), ("m", "d")]
            state = failed_state(group, -1)
            assert f"{now.coordinator} is on timeline 2, not 1: its mirror or standby was promoted" in state
            # Written through the new coordinator: the segments' parts are captured, their
            # commit records are not.
            write(now, table, range(40, 80))
            wait_until_acknowledged(now, pipeline.slot, contents=[0, 1])
            stopped = replayed_until_the_gap(config, work_dir, table)
            assert "the coordinator is lost to the pipeline" in str(stopped)
            assert "commit record never came" in str(stopped)
            shown = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(config.work_dir),
                                    "--source-sandbox", sandbox.name, "--kafka-bootstrap-servers",
                                    config.kafka.bootstrap_servers, "--kafka-topic-prefix", config.kafka.topic_prefix,
                                    "status"], env=ENV, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                   timeout=120)
            assert shown.returncode == 5, shown.stdout + shown.stderr
            assert shown.stderr.splitlines() == [
                f"gpcdc: node -1 changed under the pipeline: {state.removeprefix('failed: ')}"]
    finally:
        sandbox.down(remove=True)


def test_a_failed_over_segment_repaired_is_captured_again_and_the_replay_goes_on_to_equality(broker, work_dir):
    """`gpcdc bootstrap repair --segment 1` after a failover: a new slot at a consistent
    cut, the segment's rows copied, the stream marked. The replayer, stopped at the gap,
    goes on: the transactions whose part on segment 1 was lost are applied with the
    copy's rows in one target transaction, then the new stream; the target equals the
    source, and stays so across replays that start again."""
    sandbox = Sandbox(f"rp-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, mirrors=True)
    target = Sandbox(f"rt-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    try:
        with capturing(sandbox, broker, work_dir, **{"target.sandbox": target.name}) as (
                cluster, config, pipeline, group, table):
            sandbox.failover(1)
            now = sandbox.cluster()
            failed_state(group, 1)
            # Lost on segment 1: inserts, updates and deletes on both segments.
            write(now, table, range(40, 80))
            change(now, table, updated=range(0, 40, 3), deleted=range(1, 40, 5))
            wait_until_acknowledged(now, pipeline.slot, contents=[-1, 0])
            with Replayer(config) as replayer, pytest.raises(MissingPartError):
                replayer.run()

            repaired = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(config.work_dir),
                                       "--source-sandbox", sandbox.name, "--kafka-bootstrap-servers",
                                       config.kafka.bootstrap_servers, "--kafka-topic-prefix",
                                       config.kafka.topic_prefix, "bootstrap", "repair", "--segment", "1"],
                                      env=ENV, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
            assert repaired.returncode == 0, repaired.stderr
            assert "segment 1 repaired (repair 1)" in repaired.stdout
            # After the cut: captured from the new slot.
            write(now, table, range(80, 100))
            change(now, table, updated=range(2, 100, 7), deleted=range(4, 100, 11))
            group.start()
            wait_until_acknowledged(now, pipeline.slot)
            shown = subprocess.run(repaired.args[:-4] + ["status"], env=ENV, capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=120)
            assert shown.returncode == 0, shown.stdout + shown.stderr  # the repaired slot is the one status expects
            replayed_to_equality_with_copies(config, target, now, pipeline, table, [(1, 1)])
    finally:
        target.down(remove=True)
        sandbox.down(remove=True)


def test_an_expanded_source_is_captured_on_its_new_segments_and_replayed_to_equality(broker, work_dir):
    """`gpcdc sandbox expand` adds segments and moves rows to them in distributed
    transactions; the coordinator's capture stops at the first commit record naming a
    segment the pipeline does not capture, and `gpcdc status` says so. `gpcdc bootstrap
    extend` captures the new segments from a consistent cut with their rows copied. A
    replayer that followed the stream from before stops at the first record naming a
    new segment; run again, the replay goes on to a target equal to the source (of
    another segment count), the moves and the writes before the cut included."""
    sandbox = Sandbox(f"ex-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    target = Sandbox(f"et-{uuid.uuid4().hex[:4]}", work_dir).up(segments=3)
    try:
        with capturing(sandbox, broker, work_dir, **{"target.sandbox": target.name}) as (
                cluster, config, pipeline, group, table):
            cli = [sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(config.work_dir), "--source-sandbox",
                   sandbox.name, "--kafka-bootstrap-servers", config.kafka.bootstrap_servers, "--kafka-topic-prefix",
                   config.kafka.topic_prefix]
            # A replayer following the stream from before the expansion, through to its end.
            follower = subprocess.Popen([*cli, "--target-sandbox", target.name, "replay"], env=ENV,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
            deadline = time.monotonic() + 120
            while len(rows_or_none(target, table)) < 40 and follower.poll() is None:
                assert time.monotonic() < deadline, "the replayer did not apply the first 40 rows within 120 s"
                threading.Event().wait(0.1)  # polling the target for the replayer's progress
            expanded = subprocess.run([*cli, "sandbox", "expand", "--name", sandbox.name, "--segments", "2"], env=ENV,
                                      capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
            assert expanded.returncode == 0, expanded.stderr
            now = sandbox.cluster()
            assert [n.content for n in now.segments] == [0, 1, 2, 3]
            moved = now.row_counts(table)
            assert moved[2] + moved[3] > 0 and sum(moved.values()) == 40
            # Written before the cut: routed over four segments by the sessions of old.
            write(cluster, table, range(40, 80))
            change(cluster, table, updated=range(0, 80, 3), deleted=range(1, 80, 7))
            state = failed_state(group, -1)
            assert "has parts on segments [2, 3], which the pipeline's start point does not list" in state
            assert "`gpcdc bootstrap extend`" in state
            shown = subprocess.run([*cli, "status"], env=ENV, capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=120)
            assert shown.returncode == 5, shown.stdout + shown.stderr
            assert "the source lists segments [2, 3], which the pipeline's start point does not" in shown.stderr

            refused = subprocess.run([*cli, "bootstrap", "extend"], env=ENV, capture_output=True, text=True,
                                     stdin=subprocess.DEVNULL, timeout=120)
            assert refused.returncode == 1 and "capture workers run for nodes [0, 1]" in refused.stderr
            group.stop()
            extended = subprocess.run([*cli, "bootstrap", "extend"], env=ENV, capture_output=True, text=True,
                                      stdin=subprocess.DEVNULL, timeout=300)
            assert extended.returncode == 0, extended.stderr
            assert "segment 2 joined the pipeline" in extended.stdout and "segment 3 joined" in extended.stdout
            again = subprocess.run([*cli, "bootstrap", "extend"], env=ENV, capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=120)
            assert again.returncode == 1 and "captures every segment the source lists (0 to 3)" in again.stderr

            # After the cut: captured by the new segments' own slots.
            write(now, table, range(80, 120))
            change(now, table, updated=range(2, 120, 5), deleted=range(4, 120, 11))
            group.start()
            wait_until_acknowledged(now, pipeline.slot)
            shown = subprocess.run([*cli, "status"], env=ENV, capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=120)
            assert shown.returncode == 0, shown.stdout + shown.stderr
            # The follower reads two segments' partitions: it stops at the first record naming more.
            assert follower.wait(timeout=120) == 5
            said = follower.stderr.read()
            # Whichever it meets first: a record naming a new segment, or the extended start point.
            assert "beyond segments 0 to 1, which this replay reads" in said and "run the replay again" in said
            replayed_to_equality_with_copies(config, target, now, pipeline, table, [(2, 1), (3, 1)])
    finally:
        target.down(remove=True)
        sandbox.down(remove=True)


def rows_or_none(sandbox, table):
    """The table's rows, or none before the replayer creates it."""
    try:
        return table_rows(sandbox.cluster(), table)
    except ClusterError:
        return []


def replayed_to_equality_with_copies(config, target, source, pipeline, table, copies):
    """Replay: the target ends equal to the source, with the copies (segment, number)
    put in place; then, the source written again, a replay that starts over puts none
    in place a second time and the target is equal again."""
    with Replayer(config) as replayer:
        replayer.run()
        assert sorted((s, n) for s, n, _keys, _rows in replayer.applier.stats.reconciled) == copies
    assert table_rows(target.cluster(), table) == table_rows(source, table)
    change(source, table, updated=range(0, 120, 2), deleted=())
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config) as replayer:
        replayer.run()
        assert replayer.applier.stats.reconciled == []
    assert table_rows(target.cluster(), table) == table_rows(source, table)


def change(cluster, table, *, updated, deleted):
    """One distributed transaction: the rows ``updated`` get a new value, the rows
    ``deleted`` go (those that exist)."""
    with Session(cluster) as session, session.transaction() as tx:
        for i in updated:
            tx.update(table, {"id": i}, {"v": f"u{uuid.uuid4().hex[:4]}"})
        for i in deleted:
            tx.delete(table, {"id": i})


def test_a_repair_refuses_a_segment_whose_capture_is_not_lost_the_coordinator_and_an_unknown_segment(captured):
    cluster, config, pipeline, group, _table = captured
    kafka = kafka_client_settings(config)
    with pytest.raises(BootstrapError, match=r"segment 0's capture is not lost: .* and the slot is there and usable"):
        repair_segment(cluster, pipeline, 0, kafka)
    with pytest.raises(BootstrapError, match="the coordinator cannot be repaired") as raised:
        repair_segment(cluster, pipeline, -1, kafka)
    assert "gpcdc bootstrap drop --delete-topics" in raised.value.fix
    with pytest.raises(BootstrapError, match=r"segment 5 is not a segment of the source \(it has segments 0 to 1\)"):
        repair_segment(cluster, pipeline, 5, kafka)
    # The command line says the same in one line, and refuses while the worker runs.
    argv = [sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(config.work_dir), "--source-sandbox",
            config.source.sandbox, "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
            "--kafka-topic-prefix", config.kafka.topic_prefix, "bootstrap", "repair", "--segment", "0"]
    shown = subprocess.run(argv, env=ENV, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert shown.returncode != 0 and len(shown.stderr.strip().splitlines()) == 1
    assert f"segment 0's capture worker runs (pid {group.pid(0)})" in shown.stderr
    # Nothing was left behind: the slots are the bootstrap's, capture goes on.
    write(cluster, _table, range(200, 210))
    wait_until_acknowledged(cluster, pipeline.slot)
    assert not pipeline.repairs_dir.exists()


def test_a_workload_settles_the_parts_left_prepared_on_a_mirror_that_took_over(work_dir):
    """A workload finishes what its writers' lost transactions left prepared, as
    Greenplum's coordinator does on recovery: on the nodes the catalog lists when it
    does, not those it began with (the failed primary's parts are on its mirror)."""
    from gpcdc_toolkit.cluster import gid
    from gpcdc_toolkit.workload import WorkloadSpec, run_workload

    sandbox = Sandbox(f"wl-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, mirrors=True)
    try:
        cluster = sandbox.cluster()
        table = f'"Orphaned {uuid.uuid4().hex[:6]}"'
        with Session(cluster) as session:
            session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY) DISTRIBUTED BY (id)")
            tx = session.transaction()
            tx.insert(table, [{"id": k} for k in range(20)])  # on both segments
            for segment in tx.touched:  # the client's commit, cut short after PREPARE
                session.connection(segment).execute(f"PREPARE TRANSACTION '{gid(tx.gxid)}'")
        # The client is gone: its parts stay prepared, and nothing settles them yet.
        assert len(cluster.prepared_transactions()) == 2
        spec = WorkloadSpec(threads=2, duration=6.0, rate=60, hot_keys=3, seed=61)
        writing = threading.Event()
        load = threading.Thread(target=run_workload, args=(cluster, spec),
                                kwargs={"progress": lambda done: done.committed and writing.set()})
        load.start()
        try:
            assert writing.wait(60), "the workload committed nothing"
            sandbox.failover(1)  # the writers' errors on segment 1 have the workload settle
        finally:
            load.join()
        assert sandbox.cluster().prepared_transactions() == []
        assert table_rows(sandbox.cluster(), table) == []  # no commit record: rolled back
    finally:
        sandbox.down(remove=True)


def test_a_tail_kafka_lost_after_acknowledging_it_stops_its_segments_capture_and_a_repair_recovers_it(
        broker, work_dir):
    """Transactions on one segment alone (one-phase parts, which no commit record names),
    acknowledged to the slot, then lost by Kafka: capture, started again, finds the
    partition ending before the last event Kafka had confirmed to it, marks the segment
    lost and stops it for good, however often it is started; it does not number on from
    the tail that is left, which would hide the loss. `gpcdc bootstrap repair` then
    captures the segment again, and the replay ends equal to the source, the lost rows
    included."""
    sandbox = Sandbox(f"kt-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    target = Sandbox(f"ktt-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    try:
        with capturing(sandbox, broker, work_dir, **{"target.sandbox": target.name}) as (
                cluster, config, pipeline, group, table):
            kafka = kafka_client_settings(config)
            topic = Topics(config.kafka.topic_prefix).changes
            keep = end_offsets(kafka, topic, [1])[1]
            lost = [i for i in range(100, 200) if segment_for([i], 2) == 1][:5]
            for i in lost:
                write(cluster, table, [i])
            wait_until_acknowledged(cluster, pipeline.slot)
            group.stop()
            lose_tail(kafka, topic, 1, keep)

            with pytest.raises(GpcdcError, match="Kafka lost events it had acknowledged"):
                group.start()
            state = failed_state(group, 1)
            assert f"{topic} partition 1 ends before offset" in state and "bootstrap repair --segment 1" in state
            *_, (_, _, last) = read_values(kafka, topic, partitions=[1])
            assert last["type"] == "lost" and "Kafka lost events it had acknowledged" in last["reason"]
            group.stop()
            with pytest.raises(GpcdcError, match="capture stopped for good: .*Kafka lost events"):
                group.start()  # again: the lost mark stands
            assert read_values(kafka, topic, partitions=[1])[-1][2] == last, "no second mark"
            gpcdc = [sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(config.work_dir), "--source-sandbox",
                     sandbox.name, "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
                     "--kafka-topic-prefix", config.kafka.topic_prefix]
            shown = subprocess.run([*gpcdc, "status"], env=ENV, capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL, timeout=120)
            assert shown.returncode == 3, shown.stdout + shown.stderr
            assert "node 1's capture stopped for good" in shown.stderr and "Kafka lost events" in shown.stderr

            repaired = subprocess.run([*gpcdc, "bootstrap", "repair", "--segment", "1"], env=ENV, capture_output=True,
                                      text=True, stdin=subprocess.DEVNULL, timeout=120)
            assert repaired.returncode == 0, repaired.stderr
            write(cluster, table, range(200, 220))
            group.start()
            wait_until_acknowledged(cluster, pipeline.slot)
            assert {i for (i, _v) in table_rows(cluster, table)} >= set(lost)
            replayed_to_equality_with_copies(config, target, cluster, pipeline, table, [(1, 1)])
    finally:
        target.down(remove=True)
        sandbox.down(remove=True)
