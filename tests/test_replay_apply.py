"""Replay from captured topics into a target sandbox with another segment count."""

import re
import subprocess
import time
import uuid

import psycopg
import pytest

from gpcdc_toolkit.bootstrap import InitialSnapshot, bootstrap
from gpcdc_toolkit.capture import wait_until_acknowledged
from gpcdc_toolkit.cluster import Session
from gpcdc_toolkit.replay import APPLIED, Replayer
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import table_rows
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, reset_tables, run_workload

from .conftest import TARGETS
from .test_cli import gpcdc, one_line_error


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_initial_load_and_replay_reproduce_the_source_on_two_segments_exactly_once(source, replay_target, work_dir):
    target, config, pipeline, group = replay_target
    reset_tables(source)
    # Rows before the bootstrap reach the target through the initial load (tables
    # created from the snapshot), the rest through the stream, DDL included.
    run_workload(source, WorkloadSpec(threads=2, transactions=100, hot_keys=4, seed=1))
    bootstrap(source, pipeline, "snapshot")
    group.start()
    written = run_workload(source, WorkloadSpec(threads=3, transactions=300, hot_keys=4, update_share=0.3,
                                                delete_share=0.1, move_share=0.05, seed=2))
    with Session(source) as session:
        session.ddl(f"ALTER TABLE {EVENTS} ADD COLUMN note text")
        with session.transaction() as tx:  # after the DDL, in the same segment log as earlier rows
            tx.insert(EVENTS, [{"account_id": k, "seq": 10_000 + k, "payload": "x", "note": "new"} for k in range(6)])
    wait_until_acknowledged(source, pipeline.slot)
    target_cluster = target.cluster()
    with Replayer(config) as replayer:
        done = replayer.run()
    snapshot = InitialSnapshot(pipeline.snapshot_dir)
    assert replayer.initial_load == (sum(sum(snapshot.row_counts(t).values()) for t in snapshot.tables),
                                     len(snapshot.tables))
    # Every transaction committed after the start point: the workload's, the DDL, the
    # insert; and every row change the workload made (a moved row is two), the insert's.
    assert done.pending == 0 and done.ddl == 1 and written.in_doubt == 0 and done.empty == 0
    assert done.transactions == written.committed + 2, written.summary()
    assert done.rows == written.rows + 6, written.summary()
    for table in (ACCOUNTS, EVENTS):
        assert table_rows(target_cluster, table) == table_rows(source, table), f"{table} differs"
    applied = table_rows(target_cluster, APPLIED)
    assert len(applied) == done.transactions
    # Run again, from the command line: nothing is applied twice.
    again = gpcdc(work_dir, "--source-sandbox", "source", "--target-sandbox", target.name,
                  "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
                  "--kafka-topic-prefix", config.kafka.topic_prefix, "replay", "--once")
    assert again.returncode == 0, again.stderr
    assert "applied 0 transactions (0 DDL, 0 without rows, 0 row changes)" in again.stdout
    assert table_rows(target_cluster, APPLIED) == applied


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_tables_the_initial_load_creates_have_the_sources_defaults_and_validate_equal(source, replay_target):
    """Defaults of every kind (a sequence's, a volatile function's, literals holding %):
    the replay writes every column, and the target's catalog keeps the source's."""
    from gpcdc_toolkit.validate import validate

    target, config, pipeline, group = replay_target
    table = f'"Def %s {uuid.uuid4().hex[:6]}"'
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id serial PRIMARY KEY, made timestamptz DEFAULT now(), "
                    "\"note %%\" text DEFAULT 'd%s', n int DEFAULT 7) DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert(table, [{"id": i, "made": None, "note %%": f"r{i}", "n": i} for i in range(1, 6)])
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()
        with Session(source) as session, session.transaction() as tx:
            tx.insert(table, [{"id": 9, "made": None, "note %%": "after", "n": 0}])
        wait_until_acknowledged(source, pipeline.slot)
        with Replayer(config) as replayer:
            replayer.run()
        target_cluster = target.cluster()
        assert target_cluster.table(table).defaults == source.table(table).defaults
        run = validate(config.with_settings({"validate.expectations": False}), tables=[table], syncpoint=False)
        assert run.verified, run.lines()
    finally:
        with Session(source) as session:
            session.ddl(f"DROP TABLE {table}")


def test_a_legacy_stream_is_refused_whole_and_replayed_segment_by_segment_on_request(source, replay_target, work_dir):
    target, config, pipeline, group = replay_target
    flags = ["--source-sandbox", "source", "--target-sandbox", target.name, "--kafka-bootstrap-servers",
         config.kafka.bootstrap_servers, "--kafka-topic-prefix", config.kafka.topic_prefix, "replay", "--once"]
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=20, hot_keys=3, seed=6))
    bootstrap(source, pipeline, "snapshot")
    group.start()
    spec = dict(threads=3, transactions=150, hot_keys=3, update_share=0.3, delete_share=0.1, move_share=0.05,
                legacy_markers=True)
    run_workload(source, WorkloadSpec(seed=7, **spec))
    with Session(source, legacy_markers=True) as session:
        session.ddl(f"ALTER TABLE {EVENTS} ADD COLUMN note text")
    run_workload(source, WorkloadSpec(seed=8, **spec))
    wait_until_acknowledged(source, pipeline.slot)

    refused = gpcdc(work_dir, *flags)
    assert refused.returncode != 0
    line = one_line_error(refused)
    assert "legacy markers" in line and "--replay-legacy-per-segment" in line

    done = gpcdc(work_dir, *flags, "--replay-legacy-per-segment")
    assert done.returncode == 0, done.stderr
    assert "segment by segment (legacy markers)" in done.stderr
    target_cluster = target.cluster()
    for table in (ACCOUNTS, EVENTS):
        assert table_rows(target_cluster, table) == table_rows(source, table), f"{table} differs"
    # Run again: the checkpoint alone keeps every part applied once.
    again = gpcdc(work_dir, *flags, "--replay-legacy-per-segment")
    assert again.returncode == 0 and "applied 0 transactions" in again.stdout, again.stderr
    for table in (ACCOUNTS, EVENTS):
        assert table_rows(target_cluster, table) == table_rows(source, table), f"{table} differs"


def test_replay_errors_are_one_line_and_write_nothing_first(broker, work_dir):
    from confluent_kafka import Producer

    from gpcdc_toolkit.capture import ensure_topics
    from gpcdc_toolkit.protocol import Topics
    from gpcdc_toolkit.replay import STATE

    target = Sandbox(f"target-{uuid.uuid4().hex[:4]}", work_dir).up(segments=1)
    prefix = f"e{uuid.uuid4().hex[:8]}"
    flags = ["--target-sandbox", target.name, "--kafka-bootstrap-servers", broker.bootstrap_servers,
             "--kafka-topic-prefix", prefix, "replay", "--once"]
    try:
        line = one_line_error(gpcdc(work_dir, *flags))
        assert f"cannot read topic '{prefix}.changes'" in line and "gpcdc bootstrap create" in line

        kafka = {"bootstrap.servers": broker.bootstrap_servers}
        ensure_topics(kafka, Topics(prefix), 2)
        line = one_line_error(gpcdc(work_dir, *flags))
        assert "has no initial snapshot" in line and "--no-replay-initial-load" in line
        with target.cluster().coordinator_connection() as conn:
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (STATE,)).fetchone()[0]
            assert not exists or conn.execute(f"SELECT count(*) FROM {STATE}").fetchone()[0] == 0

        producer = Producer(kafka)
        producer.produce(f"{prefix}.changes", b"{not json", partition=1)
        assert producer.flush(10) == 0
        line = one_line_error(gpcdc(work_dir, *flags, "--no-replay-initial-load"))
        assert f"{prefix}.changes partition 1 does not begin with this pipeline's marker" in line
    finally:
        target.down(remove=True)


def create_keyless(source, table, rows):
    """A table without a key, its whole old row logged, holding ``rows``."""
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (a int, b text) DISTRIBUTED BY (a)")
        session.ddl(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
        with session.transaction() as tx:
            tx.insert(table, rows)


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_a_table_without_a_primary_key_replays_twins_and_nulls(source, replay_target):
    from gpcdc_toolkit.cluster import segment_for

    target, config, pipeline, group = replay_target
    table = f"kl_{uuid.uuid4().hex[:6]}"
    bootstrap(source, pipeline, "snapshot")
    group.start()
    create_keyless(source, table, [{"a": 1, "b": "x"}, {"a": 1, "b": "x"}, {"a": 2, "b": None}, {"a": 3, "b": "y"},
                                   {"a": 4, "b": None}])
    with Session(source) as session:
        with session.transaction() as tx:  # one of two twins, a row with a NULL, a row moved
            tx.execute(segment_for([1], 3), f"UPDATE {table} SET b = 'w' WHERE ctid = "
                                             f"(SELECT ctid FROM {table} WHERE a = 1 LIMIT 1)")
            tx.execute(segment_for([2], 3), f"DELETE FROM {table} WHERE a = 2")
            tx.update(table, {"a": 3, "b": "y"}, {"a": 30})
            tx.execute(segment_for([4], 3), f"UPDATE {table} SET b = 'v' WHERE a = 4")
        # A table whose every column is its distribution key, updated to what it holds:
        # the replayed update has nothing to set, yet must find its row.
        session.ddl(f"CREATE TABLE {table}_tags (tag text) DISTRIBUTED BY (tag)")
        session.ddl(f"ALTER TABLE {table}_tags REPLICA IDENTITY FULL")
        with session.transaction() as tx:
            tx.insert(f"{table}_tags", [{"tag": "t"}, {"tag": "t"}, {"tag": "u"}])
        with session.transaction() as tx:
            tx.execute(segment_for(["t"], 3), f"UPDATE {table}_tags SET tag = tag WHERE tag = 't'")
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config) as replayer:
        replayer.run()
    target_rows = sorted(sum(target.cluster().rows_by_segment(table).values(), []), key=repr)
    source_rows = sorted(sum(source.rows_by_segment(table).values(), []), key=repr)
    assert target_rows == source_rows == sorted([(1, "w"), (1, "x"), (30, "y"), (4, "v")], key=repr)
    tags = sorted(sum(target.cluster().rows_by_segment(f"{table}_tags").values(), []))
    assert tags == sorted(sum(source.rows_by_segment(f"{table}_tags").values(), [])) == [("t",), ("t",), ("u",)]


def test_a_target_refuses_the_replay_of_a_pipeline_bootstrapped_again(source, replay_target, work_dir):
    import shutil

    from gpcdc_toolkit.bootstrap import drop_slots
    from gpcdc_toolkit.capture import delete_topics
    from gpcdc_toolkit.connect import kafka_client_settings
    from gpcdc_toolkit.protocol import Topics

    target, config, pipeline, group = replay_target
    flags = ["--target-sandbox", target.name, "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
             "--kafka-topic-prefix", config.kafka.topic_prefix, "replay", "--once"]
    reset_tables(source)
    bootstrap(source, pipeline, "snapshot")
    group.start()
    run_workload(source, WorkloadSpec(threads=1, transactions=20, hot_keys=2, seed=10))
    wait_until_acknowledged(source, pipeline.slot)
    assert gpcdc(work_dir, *flags).returncode == 0
    # The pipeline starts over: new slots, new start point, new topics.
    group.stop()
    drop_slots(source, pipeline.slot, publication=pipeline.publication)
    shutil.rmtree(pipeline.directory)
    delete_topics(kafka_client_settings(config), Topics(pipeline.prefix))
    bootstrap(source, pipeline, "snapshot")
    group.start()
    run_workload(source, WorkloadSpec(threads=1, transactions=5, hot_keys=2, seed=11))
    wait_until_acknowledged(source, pipeline.slot)
    line = one_line_error(gpcdc(work_dir, *flags))
    assert "bootstrapped again" in line and "fresh target" in line
    # A target that is down says how to start it.
    target.down()
    line = one_line_error(gpcdc(work_dir, *flags))
    assert f"sandbox {target.name!r} does not answer" in line and f"gpcdc sandbox up --name {target.name}" in line


@pytest.mark.parametrize("name", ["gpcdc_replay_applied", "gpcdc_replay_state"])
def test_a_source_table_named_as_the_replayers_own_is_refused_before_anything_is_written(source, replay_target,
                                                                                         work_dir, name):
    target, config, pipeline, group = replay_target
    schema = f"own_{uuid.uuid4().hex[:6]}"
    with Session(source) as session:
        session.ddl(f"CREATE SCHEMA {schema}")
        session.ddl(f"CREATE TABLE {schema}.{name} (id int PRIMARY KEY, t text) DISTRIBUTED BY (id)")
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()
        line = one_line_error(gpcdc(work_dir, "--target-sandbox", target.name, "--kafka-bootstrap-servers",
                                    config.kafka.bootstrap_servers, "--kafka-topic-prefix", config.kafka.topic_prefix,
                                    "replay", "--once"))
        assert f"the source's table {schema}.{name} is named as one of the replayer's own tables" in line, line
        assert "rename the table on the source, then bootstrap the pipeline again" in line
        with target.cluster().coordinator_connection() as conn:  # nothing created, nothing loaded
            assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'gpcdc_replay%' OR relname LIKE 'wl_%'"
                                ).fetchone()[0] == 0
    finally:
        with Session(source) as session:
            session.ddl(f"DROP SCHEMA {schema} CASCADE")


def made_on_the_source(source, table, values):
    """``table`` (id, "V" text) made on the source, a row for each of ``values``."""
    with Session(source) as session:
        session.ddl(f'CREATE TABLE {table} (id int PRIMARY KEY, "V" text) DISTRIBUTED BY (id)')
        with session.transaction() as tx:
            tx.insert(table, [{"id": i, "V": v} for i, v in enumerate(values)])


def door_flags(target, config):
    """The command line's settings for the shared source and ``target`` at its front door."""
    return ["--source-sandbox", "source", "--target-sandbox", target.name, "--target-kind", "postgres",
            "--kafka-bootstrap-servers", config.kafka.bootstrap_servers, "--kafka-topic-prefix", config.kafka.topic_prefix]


@pytest.mark.parametrize("replay_target", TARGETS[1:], indirect=True)
def test_a_front_door_table_of_another_shape_is_refused_in_one_line_before_anything_is_written(
        source, replay_target, work_dir):
    from gpcdc_toolkit.replay import STATE

    target, config, pipeline, group = replay_target
    table = f"shape_{uuid.uuid4().hex[:6]}"
    made_on_the_source(source, table, ["a"])
    bootstrap(source, pipeline, "snapshot")
    group.start()  # the topics
    with target.cluster().session() as door:
        door.ddl(f'CREATE TABLE {table} (id int PRIMARY KEY, "V" int) DISTRIBUTED BY (id)')
    flags = [*door_flags(target, config), "replay", "--once"]
    line = one_line_error(gpcdc(work_dir, *flags))
    assert f"target table public.{table} has columns [('id', 'integer'), ('V', 'integer')] where the source has " \
           "[('id', 'integer'), ('V', 'text')]" in line and "then replay again" in line, line
    with target.cluster().coordinator_connection() as conn:
        assert not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (STATE,)).fetchone()[0]  # nor its table
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
    status = gpcdc(work_dir, *flags[:-2], "status")
    kind = target.flavour
    assert f"target: {kind} at 127.0.0.1:{target.nodes[0].port}" + (", 2 workers" if kind == "citus" else "") \
        in status.stdout, status.stdout


@pytest.mark.parametrize("replay_target", ["postgres"], indirect=True)
def test_a_row_the_target_refuses_in_the_initial_load_is_one_line_naming_its_table_and_nothing_is_written(
        source, replay_target, work_dir):
    from gpcdc_toolkit.replay import STATE

    target, config, pipeline, group = replay_target
    table = f'"Checked {uuid.uuid4().hex[:6]}"'
    made_on_the_source(source, table, ["refused" if i == 7 else "fine" for i in range(10)])
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()  # the topics
        with target.cluster().coordinator_connection() as conn:
            conn.execute(f"""CREATE TABLE {table} (id int PRIMARY KEY, "V" text CHECK ("V" <> 'refused'))""")
            conn.commit()
        line = one_line_error(gpcdc(work_dir, *door_flags(target, config), "replay", "--once"))
        assert f"the target refused a row of public.{table} in the initial load, and nothing of the load was " \
               "written: new row for relation" in line and line.endswith("then replay again"), line
        with target.cluster().coordinator_connection() as conn:
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
            assert conn.execute(f"SELECT count(*) FROM {STATE}").fetchone()[0] == 0
    finally:
        with Session(source) as session:
            session.ddl(f"DROP TABLE {table}")


@pytest.mark.parametrize("replay_target", ["postgres"], indirect=True)
def test_a_target_role_without_the_privileges_it_needs_is_told_so_and_nothing_is_written(source, replay_target,
                                                                                          work_dir):
    target, config, pipeline, group = replay_target
    bootstrap(source, pipeline, "snapshot")
    group.start()  # the topics
    with target.cluster().coordinator_connection() as conn:
        conn.execute('CREATE ROLE "Read Only" LOGIN')  # on PostgreSQL 15, no CREATE on schema public
        conn.commit()
    done = gpcdc(work_dir, "--source-sandbox", "source", "--target-dsn", f"{target.dsn} user='Read Only'",
                 "--target-kind", "postgres", "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
                 "--kafka-topic-prefix", config.kafka.topic_prefix, "replay", "--once")
    assert done.returncode == 1
    # The source sandbox is shared: tables other tests left in schemas of their own come
    # first where the target lacks their schema, which takes CREATE on the database.
    assert re.search(r"permission denied for (schema public|database postgres): grant it to the DSN's user, or "
                     "connect as one who has it", one_line_error(done)), one_line_error(done)
    with target.cluster().coordinator_connection() as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 0


def test_a_sync_point_kafka_does_not_hold_is_refused_before_anything_is_applied(source, replay_target, work_dir):
    """Looked for to the stream's end, it would have the whole stream applied, past
    every sync point the target could have stopped at."""
    target, config, pipeline, group = replay_target
    bootstrap(source, pipeline, "snapshot")
    group.start()
    flags = ["--source-sandbox", "source", "--target-sandbox", target.name, "--kafka-bootstrap-servers",
             config.kafka.bootstrap_servers, "--kafka-topic-prefix", config.kafka.topic_prefix]
    stray = gpcdc(work_dir, *flags[:-1], "NoSuchPipeline", "syncpoint")  # one no replay would look for
    assert stray.returncode == 2 and "the source has no slot gpcdc_nosuchpipeline" in one_line_error(stray)
    taken = gpcdc(work_dir, *flags, "syncpoint")
    assert taken.returncode == 0, taken.stderr
    gxid = int(taken.stdout.split("sync point ", 1)[1].split(":", 1)[0])
    refused = gpcdc(work_dir, *flags, "replay", "--once", "--until-syncpoint", str(gxid + 10**6))
    assert refused.returncode == 4
    assert f"sync point {gxid + 10**6} is neither in the stream" in one_line_error(refused)
    from gpcdc_toolkit.replay import STATE

    with target.cluster().coordinator_connection() as conn:  # no initial load, no checkpoint
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename NOT LIKE 'gpcdc_replay%' "
                            "AND schemaname = 'public'").fetchone()[0] == 0
        assert not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (STATE,)).fetchone()[0]  # nor its table
    # One taken (recorded, in the stream or on its way): the target stops there.
    stopped = gpcdc(work_dir, *flags, "replay", "--until-syncpoint", str(gxid))
    assert stopped.returncode == 0 and f"stopped at sync point {gxid}" in stopped.stdout, stopped.stderr


def test_a_wrong_target_kind_or_an_unreachable_door_is_one_line(source, broker, work_dir):
    from gpcdc_toolkit.cluster import connect_target
    from gpcdc_toolkit.errors import ClusterError, UnreachableError

    gone = one_line_error(gpcdc(work_dir, "--target-dsn", "host=127.0.0.1 port=1 user=x dbname=y",
                                "--target-kind", "postgres", "replay", "--once"))
    assert "cannot reach target 127.0.0.1:1" in gone
    refused = gpcdc(work_dir, "--target-sandbox", "source", "--target-kind", "postgres", "replay", "--once")
    assert refused.returncode == 2
    assert "target is sandbox 'source', a sandbox cluster, but target.kind is postgres" in one_line_error(refused)
    with pytest.raises(ClusterError, match="is a sandbox's coordinator, whose tables hold no rows"):
        connect_target(Sandbox("source", work_dir).dsn, "postgres")
    with pytest.raises(UnreachableError):
        connect_target("host=127.0.0.1 port=1 user=x dbname=y")
    assert connect_target(Sandbox("source", work_dir).dsn).kind == "sandbox"
    plain = source.dsn(source.segments[0])  # a segment: a PostgreSQL server of no cluster
    with pytest.raises(ClusterError, match="is no Greenplum-style coordinator, but target.kind is sandbox: set "
                                           "target.kind to postgres"):
        connect_target(plain, "sandbox")
    door = connect_target(plain)
    assert door.kind == "postgres"
    # A plain server is no coordinator and no segment, and its messages say so.
    assert {str(node) for node in door.nodes} == {f"server ({door.coordinator.host}:{door.coordinator.port})"}
    with pytest.raises(ClusterError, match=r'^no table "public"\."no such" on the server'):
        door.table(("public", "no such"))


@pytest.mark.parametrize("flavour", ["greenplum", "postgres"])
def test_a_repairs_copy_replaces_exactly_the_rows_the_source_places_on_its_segment_null_keys_too(work_dir, flavour):
    """The reconcile of a repair (segment 0 of a 3-segment source, where NULL keys go):
    the target's rows whose key the source places there are replaced by the copy,
    those of a NULL key included; the others stay."""
    import json

    from gpcdc_toolkit.cluster import segment_for
    from gpcdc_toolkit.protocol import DistributedSnapshot
    from gpcdc_toolkit.replay._order import RepairMark
    from gpcdc_toolkit.replay._reconcile import reconcile

    repaired = segment_for([None], 3)
    held = [(k, f"old{k}") for k in range(14)] + [(None, "old-null")]
    on_it = sorted((k for k, _ in held if segment_for([k], 3) == repaired and k is not None))
    # At the cut: one row of the segment deleted, the others changed, a NULL key and a new key there.
    new_key = next(k for k in range(100, 200) if segment_for([k], 3) == repaired)
    copy = [(k, f"new{k}") for k in on_it[1:]] + [(None, "new-null"), (new_key, "new")]
    directory = work_dir / f"copy-{uuid.uuid4().hex[:6]}"
    (directory / f"seg{repaired}").mkdir(parents=True)
    (directory / f"seg{repaired}" / "kv.copy").write_text(
        "".join(("\\N" if k is None else str(k)) + f"\t{v}\n" for k, v in copy))  # COPY's text format
    (directory / "manifest.json").write_text(json.dumps({
        "placement": {"segment": repaired, "segments": 3}, "cut": {"xmax": 10, "in_progress": []},
        "tables": {"public.kv": {"schema": "public", "name": "kv", "columns": ["k", "v"], "generated": {},
                                 "types": ["integer", "text"], "type_oids": [23, 25], "distribution_key": ["k"],
                                 "primary_key": [], "files": {str(repaired): {"path": f"seg{repaired}/kv.copy",
                                                                              "rows": len(copy)}}}}}))
    target = Sandbox(f"rc-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2, flavour=flavour)
    try:
        cluster = target.cluster()
        with cluster.session() as session:
            session.ddl("CREATE TABLE kv (k int, v text) DISTRIBUTED BY (k)")
            with session.transaction() as tx:
                tx.insert("kv", [{"k": k, "v": v} for k, v in held])
            with session.transaction() as tx:
                keys, rows = reconcile(tx, cluster, RepairMark(repaired, 1, DistributedSnapshot(10, frozenset()), 0, 5),
                                       directory)
        assert (keys, rows) == (len(on_it) + 1, len(copy))
        others = [(k, v) for k, v in held if k is not None and segment_for([k], 3) != repaired]
        assert table_rows(cluster, "kv") == sorted(others + copy, key=repr)
    finally:
        target.down(remove=True)


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_identity_columns_generated_always_are_replayed_and_fixed_with_the_sources_values(source, replay_target):
    """PostgreSQL refuses an explicit value for such a column unless the INSERT overrides
    the system's, and lets an UPDATE set it only to DEFAULT: rows are written with the
    source's values, a row whose identity value changes is written anew, and so does
    the fix of a row that differs there."""
    from gpcdc_toolkit.cluster import COORDINATOR
    from gpcdc_toolkit.validate._checksum import compare_checksums

    target, config, pipeline, group = replay_target
    table = f'"Ident {uuid.uuid4().hex[:6]}"'
    bootstrap(source, pipeline, "snapshot")
    group.start()
    with Session(source) as session:
        session.ddl(f'CREATE TABLE {table} (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, '
                    f'"Seq No" bigint GENERATED ALWAYS AS IDENTITY, v text) DISTRIBUTED BY (id)')
        with session.transaction() as tx:
            tx.insert(table, [{"id": k, "Seq No": 100 + k, "v": f"v{k}"} for k in range(1, 9)])
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config) as replayer:  # the inserts first: then each change below is replayed as one
        replayer.run()
    target_cluster = target.cluster()
    if target.flavour == "postgres":
        # A table of the target's own refers to rows whose identity value stays: their
        # updates must be updates, not a delete and an insert, which the reference refuses.
        with target_cluster.coordinator_connection() as conn:
            conn.execute(f"CREATE TABLE {table[:-1]} refs\" (id int PRIMARY KEY, ident bigint REFERENCES {table} (id))")
            conn.execute(f"INSERT INTO {table[:-1]} refs\" VALUES (1, 1), (2, 8)")
    with Session(source) as session:
        with session.transaction() as tx:
            tx.update(table, {"id": 1}, {"v": "changed"})
            tx.update(table, {"id": 8}, {"v": "v8"})  # to what it holds
            tx.update(table, {"id": 2}, {"Seq No": 500})
            tx.update(table, {"id": 3}, {"id": 300, "v": "moved"})
            tx.delete(table, {"id": 4})
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config) as replayer:
        replayer.run()
    expected = sorted([(1, 101, "changed"), (2, 500, "v2"), (300, 103, "moved"), *((k, 100 + k, f"v{k}")
                                                                                   for k in range(5, 9))], key=repr)
    assert table_rows(source, table) == expected
    assert table_rows(target_cluster, table) == expected

    # The target's rows damaged where they are written: a row's identity value changed
    # (written anew, as no UPDATE may set it to a value), a row gone.
    def writer(key):
        return (target_cluster.segments[target_cluster.home_of([key])] if target.flavour == "greenplum"
                else target_cluster.coordinator)

    with target_cluster.connect_node(writer(5)) as conn:
        conn.execute(f"DELETE FROM {table} WHERE id = 5")
        conn.execute(f"INSERT INTO {table} OVERRIDING SYSTEM VALUE VALUES (5, 999, 'v5')")
    with target_cluster.connect_node(writer(6)) as conn:
        conn.execute(f"DELETE FROM {table} WHERE id = 6")
    misplaced = 0
    if target.flavour == "greenplum":  # and a row on a segment its key does not name, its identity value changed too
        elsewhere = target_cluster.segments[1 - target_cluster.home_of([7])]
        with target_cluster.connect_node(writer(7)) as conn:
            conn.execute(f"DELETE FROM {table} WHERE id = 7")
        with target_cluster.connect_node(elsewhere) as conn:
            conn.execute(f"INSERT INTO {table} OVERRIDING SYSTEM VALUE VALUES (7, 777, 'v7')")
        misplaced = 1
    result = compare_checksums(source, target_cluster, table)
    diff = result.diff
    assert (diff.missing, diff.changed + diff.misplaced, diff.extra) == (1, 1 + misplaced, 0), diff.examples
    inserts = [s for statements in result.fix.values() for s in statements if s.startswith("INSERT")]
    assert len(inserts) == 2 + misplaced, inserts  # one a row: the missing one, those written anew
    for content, statements in result.fix.items():
        node = target_cluster.coordinator if content == COORDINATOR else target_cluster.segments[content]
        with target_cluster.connect_node(node) as conn, conn.transaction():
            for statement in statements:
                conn.execute(statement)
    assert compare_checksums(source, target_cluster, table).equal
    assert table_rows(target_cluster, table) == expected


def test_a_change_of_a_keyless_row_the_target_lacks_stops_the_replay_with_nothing_of_it_applied(source, replay_target):
    """As a keyed row's does: the target differs from the source, and going on would
    leave it so silently (a moved row would even be inserted without its old one gone)."""
    from gpcdc_toolkit.errors import GpcdcError

    target, config, pipeline, group = replay_target
    table = f'"Key Less {uuid.uuid4().hex[:6]}"'
    bootstrap(source, pipeline, "snapshot")
    group.start()
    create_keyless(source, table, [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}])
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config) as replayer:
        replayer.run()
    target_cluster = target.cluster()
    with target_cluster.connect_node(target_cluster.segments[target_cluster.home_of([2])]) as conn:
        conn.execute(f"DELETE FROM {table} WHERE a = 2")  # someone else's change
    with Session(source) as session:
        with session.transaction() as tx:
            tx.update(table, {"a": 1, "b": "x"}, {"b": "changed"})
            tx.update(table, {"a": 2, "b": "y"}, {"a": 20})
    wait_until_acknowledged(source, pipeline.slot)
    with pytest.raises(GpcdcError, match=r"an update of \"public\"\.\"Key Less [0-9a-f]+\" key \{'a': 2, 'b': 'y'\} "
                                         r"changed 0 rows on the target"):
        with Replayer(config) as replayer:
            replayer.run()
    assert table_rows(target_cluster, table) == [(1, "x")]  # the transaction's other change not applied either


GONE = "the target, where the source had one"
TAKEN = "a row written into {t} found Key (id)=(9) on the target, where the source had no row"


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
@pytest.mark.parametrize(("outside", "changes", "said"), [
    ("DELETE FROM {t} WHERE id = 2", [("update", 2)], "an update of {t} key {{'id': 2}} found no row on " + GONE),
    ("DELETE FROM {t} WHERE id = 2", [("delete", 2)], "a delete of {t} key {{'id': 2}} found no row on " + GONE),
    ("DELETE FROM {t} WHERE id = 2", [("update", 2), ("delete", 2)],
     "an update of {t} key {{'id': 2}} found no row on " + GONE),
    ("INSERT INTO {t} VALUES (9, 'outside')", [("insert", 9)], TAKEN),
    ("INSERT INTO {t} VALUES (9, 'outside')", [("move", 3, 9)], TAKEN),
    ("INSERT INTO {t} VALUES (9, 'outside')", [("insert", 9), ("delete", 9)], None)], ids=str)
def test_a_batch_finding_a_row_gone_or_gained_stops_with_nothing_applied(source, replay_target, outside, changes, said):
    """A batch's net effect per key is written in bulk (upserts, inserts, deletes by
    key), which must not write over what someone else did to the target: a row deleted
    there would come back with the source's update, and one inserted there would take
    the source's row. (One the source inserts and deletes in the batch is deleted: the
    target ends as the source.)"""
    from gpcdc_toolkit.errors import GpcdcError

    target, config, pipeline, group = replay_target
    name = f"Keyed {uuid.uuid4().hex[:6]}"
    table = f'"{name}"'
    bootstrap(source, pipeline, "snapshot")
    group.start()
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert(table, [{"id": i, "v": "x"} for i in (1, 2, 3)])
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config) as replayer:
        replayer.run()
    target_cluster = target.cluster()
    key = 2 if "2" in outside else 9
    with target_cluster.connect_node(target_cluster.segments[target_cluster.home_of([key])]) as conn:
        conn.execute(outside.format(t=table))  # someone else's change
    before = table_rows(target_cluster, table)
    with Session(source) as session, session.transaction() as tx:
        tx.update(table, {"id": 1}, {"v": "also changed"})
        for op, *keys in changes:
            if op == "update":
                tx.update(table, {"id": keys[0]}, {"v": "changed"})
            elif op == "move":
                tx.update(table, {"id": keys[0]}, {"id": keys[1]})
            elif op == "delete":
                tx.delete(table, {"id": keys[0]})
            else:
                tx.insert(table, [{"id": keys[0], "v": "source"}])
    wait_until_acknowledged(source, pipeline.slot)
    if said is None:
        with Replayer(config) as replayer:
            replayer.run()
        assert table_rows(target_cluster, table) == table_rows(source, table)
        return
    with pytest.raises(GpcdcError) as stopped:
        with Replayer(config) as replayer:
            replayer.run()
    assert said.format(t=f'"public"."{name}"') in str(stopped.value), stopped.value
    assert "replay into a fresh target" in stopped.value.fix
    assert table_rows(target_cluster, table) == before  # the transaction's other change not applied either


@pytest.mark.parametrize("replay_target", ["postgres"], indirect=True)
def test_a_unique_index_only_the_target_has_is_told_from_a_row_it_gained(source, replay_target):
    """A plain insert's unique violation means a gained row only on the primary key
    (here named as PostgreSQL quotes it); on another unique index the target's table
    differs in shape, and the fix says so."""
    from gpcdc_toolkit.errors import GpcdcError

    target, config, pipeline, group = replay_target
    table = f'"Odd {uuid.uuid4().hex[:6]}"'
    key, index = '"My ""Key"""', f'"Odd v {uuid.uuid4().hex[:6]}"'
    bootstrap(source, pipeline, "snapshot")
    group.start()
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} ({key} int PRIMARY KEY, v text) DISTRIBUTED BY ({key})")
        with session.transaction() as tx:
            tx.insert(table, [{'My "Key"': 1, "v": "x"}])
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config) as replayer:
        replayer.run()
    target_cluster = target.cluster()
    with target_cluster.coordinator_connection() as conn:
        conn.execute(f"CREATE UNIQUE INDEX {index} ON {table} (v)")
        conn.execute(f"INSERT INTO {table} VALUES (5, 'outside')")
    with Session(source) as session:
        with session.transaction() as tx:
            tx.insert(table, [{'My "Key"': 2, "v": "x"}])  # v taken by row 1 on the target only
        wait_until_acknowledged(source, pipeline.slot)
        with pytest.raises(GpcdcError) as stopped:
            with Replayer(config) as replayer:
                replayer.run()
        assert "unique constraint the source's lacks" in stopped.value.fix and "found Key" not in str(stopped.value)
        with target_cluster.coordinator_connection() as conn:
            conn.execute(f"DROP INDEX {index}")
        with session.transaction() as tx:
            tx.insert(table, [{'My "Key"': 5, "v": "y"}])  # key taken on the target
        wait_until_acknowledged(source, pipeline.slot)
        with pytest.raises(GpcdcError) as stopped:
            with Replayer(config) as replayer:
                replayer.run()
        assert 'found Key ("My ""Key""")=(5) on the target' in str(stopped.value), stopped.value
        assert "replay into a fresh target" in stopped.value.fix
    rows = table_rows(target_cluster, table)  # row 2's transaction may have gone in a batch of its own
    assert (5, "outside") in rows and (5, "y") not in rows, rows


@pytest.mark.parametrize(("error", "lost"), [
    (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
    (psycopg.errors.CrashShutdown("terminating connection because of crash of another server process"), True),
    (psycopg.errors.ConnectionFailure("connection failure"), True),
    (psycopg.OperationalError("server closed the connection unexpectedly"), True),  # no SQLSTATE: libpq's own
    (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),
    (psycopg.errors.LockNotAvailable("could not obtain lock"), False),
    (psycopg.errors.DiskFull("could not extend file"), False),
    (psycopg.errors.CheckViolation("new row violates check constraint"), False)])
def test_a_target_that_went_away_is_told_from_one_that_refused_a_statement(error, lost):
    """The first asks for the target back (the replay goes on from its checkpoint); the
    second, for the target's tables to be made to match the source's."""
    from gpcdc_toolkit.cluster import connection_lost

    assert connection_lost(error) is lost


@pytest.mark.parametrize("replay_target", ["greenplum"], indirect=True)
def test_rows_written_in_the_transaction_of_a_ddl_statement_stop_the_replay_until_applied_by_hand(source, replay_target):
    """Replay applies a DDL statement in a transaction of its own: one that also changed
    rows stops it, naming --skip-ddl; with the statement applied on the target by hand,
    the skip applies the rows."""
    import dataclasses

    from gpcdc_toolkit.replay import ApplyError

    target, config, pipeline, group = replay_target
    table = f"ddl rows {uuid.uuid4().hex[:4]}"
    quoted = '"' + table + '"'
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {quoted} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()
        with Session(source) as session:
            added = session.ddl(f"ALTER TABLE {quoted} ADD COLUMN w int",
                                then=lambda tx: tx.insert(quoted, [{"id": i, "v": "x", "w": i} for i in range(4)]))
        wait_until_acknowledged(source, pipeline.slot)
        with pytest.raises(ApplyError) as refused, Replayer(config) as replayer:
            replayer.run()
        assert f"gxid {added} changes rows in the transaction of its DDL statement" in refused.value.message
        assert f"--skip-ddl {added}" in refused.value.fix
        assert table_rows(target.cluster(), quoted) == []
        with Session(target.cluster()) as session:
            session.ddl(f"ALTER TABLE {quoted} ADD COLUMN w int")
        with Replayer(config, settings=dataclasses.replace(config.replay, skip_ddl=frozenset({added}))) as replayer:
            replayer.run()
        assert table_rows(target.cluster(), quoted) == table_rows(source, quoted) != []
    finally:
        group.stop()
        with Session(source) as session:
            session.ddl(f"DROP TABLE {quoted}")


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_the_initial_load_creates_a_table_whose_distribution_key_holds_percent(source, replay_target):
    target, config, pipeline, group = replay_target
    table = f'"dk% {uuid.uuid4().hex[:6]}"'
    with Session(source) as session:
        session.ddl(f'CREATE TABLE {table} ("k%" int PRIMARY KEY, v text) DISTRIBUTED BY ("k%")')
        with session.transaction() as tx:
            tx.insert(table, [{"k%": i, "v": f"b{i}"} for i in range(5)])
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()
        with Session(source) as session, session.transaction() as tx:
            tx.insert(table, [{"k%": 100 + i, "v": f"a{i}"} for i in range(5)])
        wait_until_acknowledged(source, pipeline.slot)
        with Replayer(config) as replayer:
            replayer.run()
        assert sorted(table_rows(target.cluster(), table)) == sorted(table_rows(source, table))
        assert len(table_rows(source, table)) == 10
    finally:
        group.stop()
        with Session(source) as session:
            session.ddl(f"DROP TABLE {table}")


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_a_table_whose_default_calls_a_function_the_target_lacks_stops_the_load_naming_it(source, replay_target):
    from gpcdc_toolkit.replay import ApplyError

    target, config, pipeline, group = replay_target
    tag = uuid.uuid4().hex[:6]
    function, table = f"fn_{tag}", f"fn_default_{tag}"
    with Session(source) as session:
        session.ddl(f"CREATE FUNCTION {function}() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 42'")
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, n int DEFAULT {function}()) DISTRIBUTED BY (id)")
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()
        wait_until_acknowledged(source, pipeline.slot)
        with pytest.raises(ApplyError) as refused, Replayer(config) as replayer:
            replayer.run()
        assert f"the initial snapshot's table public.{table} cannot be created on the target" in refused.value.message
        assert function in refused.value.message and "\n" not in refused.value.message
        assert "create what it names on the target" in refused.value.fix
    finally:
        group.stop()
        with Session(source) as session:
            session.ddl(f"DROP TABLE {table}")
            session.ddl(f"DROP FUNCTION {function}()")


@pytest.fixture(scope="session")
def german_locale(work_dir):
    """A directory holding the de_DE.UTF-8 locale, compiled from the system's sources, for
    servers started with it on their LOCPATH (a machine may have no locale but C's)."""
    path = work_dir / "locales"
    path.mkdir(exist_ok=True)
    done = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(path / "de_DE.UTF-8")],
                          capture_output=True, text=True)
    if not (path / "de_DE.UTF-8").is_dir():
        pytest.fail(f"localedef could not compile de_DE.UTF-8 ({done.stderr.strip()}); install Debian's locales package")
    return path


@pytest.fixture
def money_printed_in_german(german_locale, monkeypatch):
    """Servers started within the test can print money as a German server does."""
    monkeypatch.setenv("LOCPATH", str(german_locale))


# A target server's settings under which it reads the stream's text otherwise than capture
# printed it: money as 1.234,56 €, an array's NULL element as the text NULL, XML
# fragments refused.
READS_OTHERWISE = {"lc_monetary": "de_DE.UTF-8", "array_nulls": "off", "xmloption": "document"}


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_values_reach_a_target_whose_settings_read_text_otherwise_as_the_same_values(money_printed_in_german, source,
                                                                                       replay_target):
    """Capture prints money as the C locale does ($1,234.56), an array's NULL element as
    NULL, XML as it is; a target that would read them otherwise (its server's settings)
    gets the same values, in the initial load, in the stream and in a column's default,
    and validation finds the tables equal."""
    from gpcdc_toolkit.validate import validate

    target, config, pipeline, group = replay_target
    target_cluster = target.cluster()
    for node in target_cluster.nodes:
        with target_cluster.connect_node(node) as conn:
            for name, value in READS_OTHERWISE.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while True:  # until the server's new sessions start with them (the reload is the postmaster's to make)
            with target_cluster.connect_node(node) as conn:
                if all(conn.execute(f"SHOW {name}").fetchone()[0] == value for name, value in READS_OTHERWISE.items()):
                    break
            assert time.monotonic() < deadline, f"{node} did not take {READS_OTHERWISE} within 30 s"
    table = f'"Money {uuid.uuid4().hex[:6]}"'
    amounts = ["1234567.89", "-0.01", "0", "92233720368547758.07", "-92233720368547758.08", "1000", "0.5"]

    def rows(first):
        return [{"id": first + i, "m": amount, "tags": ["a", None, "NULL"], "doc": f"fragment <b>{i}</b>"}
                for i, amount in enumerate(amounts)]

    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, m money, tags text[], doc xml, "
                    "fee money DEFAULT '5.25') DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert(table, rows(0))
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()
        with Session(source) as session, session.transaction() as tx:
            tx.insert(table, rows(100))
            tx.update(table, {"id": 0}, {"m": "-7654321.98"})
        wait_until_acknowledged(source, pipeline.slot)
        with Replayer(config) as replayer:
            replayer.run()
        values_of = f"SELECT id, m::numeric, tags, doc::text, fee::numeric FROM {table}"
        assert sorted(target_cluster.fetch_all(values_of)) == sorted(source.fetch_all(values_of))
        assert target_cluster.fetch_all(f"SELECT m::text, tags[2] IS NULL FROM {table} WHERE id = 0") \
            == [("-7.654.321,98 €", True)]
        assert target_cluster.table(table).defaults == source.table(table).defaults
        run = validate(config.with_settings({"validate.expectations": False}), tables=[table], syncpoint=False)
        assert run.verified, run.lines()
    finally:
        with Session(source) as session:
            session.ddl(f"DROP TABLE {table}")
