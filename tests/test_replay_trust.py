"""Replay must equal the source or stop: adversarial names, values, DDL and streams,
against real sandboxes, the broker and capture."""

import json
import random
import string
import threading
import time
import uuid

import orjson
import pytest
from confluent_kafka import Producer

from gpcdc_toolkit.bootstrap import bootstrap
from gpcdc_toolkit.capture import wait_until_acknowledged
from gpcdc_toolkit.cluster import Session, gid
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.replay import APPLIED, Replayer, ReplaySettings
from gpcdc_toolkit.validate import read_captured, table_rows
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, reset_tables, run_workload

from .conftest import TARGETS
from .test_cli import gpcdc, one_line_error, wait_until_status_shows_kafka_away


def replay_flags(target, config):
    return ["--source-sandbox", "source", "--target-sandbox", target.name, "--kafka-bootstrap-servers",
            config.kafka.bootstrap_servers, "--kafka-topic-prefix", config.kafka.topic_prefix, "replay", "--once"]


def incompressible(rng, n):
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_quoted_names_case_twins_and_values_that_look_like_markers_replay_exactly(source, replay_target):
    target, config, pipeline, group = replay_target
    rng = random.Random(4)
    tag = uuid.uuid4().hex[:6]
    items = ("public", f"Order Items/{tag}")
    upper, lower = ("public", f"Acct{tag}"), ("public", f"acct{tag}")
    schema = f"Sales Data {tag}"
    lines = (schema, f'Line "Items" {tag}')
    q = lambda parts: ".".join('"' + p.replace('"', '""') + '"' for p in parts)  # noqa: E731
    with Session(source) as session:
        # Before the bootstrap: reaches the target through the initial load.
        session.ddl(f'CREATE TABLE {q(items)} (id int PRIMARY KEY, "Big Text" text, n int, '
                    f'"Twice" int GENERATED ALWAYS AS (n * 2) STORED) DISTRIBUTED BY (id)')
        session.ddl(f'ALTER TABLE {q(items)} ALTER COLUMN "Big Text" SET STORAGE EXTERNAL')  # TOASTed, uncompressed
        with session.transaction() as tx:
            tx.insert(items, [{"id": i, "Big Text": incompressible(rng, 5000), "n": i} for i in range(8)])
    bootstrap(source, pipeline, "snapshot")
    group.start()
    with Session(source) as session:
        # After it: through the stream, DDL included.
        session.ddl(f"CREATE TABLE {q(upper)} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
        session.ddl(f"CREATE TABLE {q(lower)} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
        session.ddl(f"CREATE SCHEMA {q([schema])}")
        session.ddl(f'CREATE TABLE {q(lines)} ("Id" int PRIMARY KEY, "x y" text) DISTRIBUTED BY ("Id")')
        with session.transaction() as tx:
            tx.insert(upper, [{"id": 1, "v": "upper"}])
            tx.insert(lower, [{"id": 1, "v": "lower"}, {"id": 2, "v": "lower"}])
            tx.insert(lines, [{"Id": 1, "x y": "UNCHANGED_TOAST"}])
        with session.transaction() as tx:
            tx.update(items, {"id": 1}, {"n": 100})  # "Big Text" unchanged: not in the WAL
            tx.update(items, {"id": 2}, {"Big Text": "__gpcdc_unchanged_toast__"})  # the old placeholder, as data
            tx.update(items, {"id": 3}, {"Big Text": "UNCHANGED_TOAST", "n": 7})
            tx.update(items, {"id": 4}, {"id": 40})  # a key move that leaves "Big Text" out of the WAL
            tx.update(upper, {"id": 1}, {"v": "upper again"})
        with session.transaction() as tx:
            tx.update(items, {"id": 5}, {"n": 55})
            tx.update(items, {"id": 5}, {"Big Text": "__gpcdc_unchanged_toast__"})
            tx.delete(lower, {"id": 2})
    wait_until_acknowledged(source, pipeline.slot)
    captured = read_captured(config)
    assert any(r.get("unchanged") == ["Big Text"] for r in captured.rows), "the test must meet unchanged TOAST"
    with Replayer(config) as replayer:
        done = replayer.run()
    assert done.pending == 0
    target_cluster = target.cluster()
    for table in (items, upper, lower, lines):
        assert table_rows(target_cluster, table) == table_rows(source, table), f"{table} differs"
    assert table_rows(target_cluster, upper) == [(1, "upper again")]
    assert table_rows(target_cluster, lower) == [(1, "lower")]
    assert dict((r[0], r[1]) for r in table_rows(target_cluster, items))[2] == "__gpcdc_unchanged_toast__"


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_rewriting_ddl_is_carried_exactly_or_refused_before_anything_of_it(source, replay_target, work_dir):
    target, config, pipeline, group = replay_target
    table = f"dd_{uuid.uuid4().hex[:6]}"
    bootstrap(source, pipeline, "snapshot")
    group.start()
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v int) DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert(table, [{"id": i, "v": i} for i in range(20)])
        session.ddl(f"ALTER TABLE {table} ADD COLUMN c int DEFAULT 7")
        session.ddl(f"ALTER TABLE {table} ALTER COLUMN v TYPE bigint USING v * 2 + 1")
        session.ddl(f"ALTER TABLE {table} ADD COLUMN g int GENERATED ALWAYS AS (id * 3) STORED")
        with session.transaction() as tx:
            tx.insert(table, [{"id": 100, "v": 1}])
        refused = session.ddl(f"ALTER TABLE {table} ADD COLUMN at timestamptz DEFAULT clock_timestamp()")
        with session.transaction() as tx:
            tx.insert(table, [{"id": 101, "v": 2}])
    wait_until_acknowledged(source, pipeline.slot)

    line = one_line_error(gpcdc(work_dir, *replay_flags(target, config)))
    assert f"gxid {refused}'s DDL at offset" in line and "calls clock_timestamp()" in line
    assert f"--skip-ddl {refused}" in line
    quarantined = [json.loads(x) for x in (pipeline.directory / "quarantine.jsonl").read_text().splitlines()]
    assert [q["gxid"] for q in quarantined] == [refused] and "clock_timestamp()" in quarantined[0]["statement"]
    target_cluster = target.cluster()
    before = table_rows(target_cluster, table)
    assert 100 in [r[0] for r in before] and 101 not in [r[0] for r in before], "applied up to the DDL, not past"
    assert target_cluster.table(table).columns == ("id", "v", "c", "g"), "nothing of the refused DDL"
    assert before == [r[:4] for r in table_rows(source, table) if r[0] != 101], "the carried DDL is exact"

    # The operator gives the target the same change by hand, then skips the record.
    with target_cluster.session() as session:
        session.ddl(f"ALTER TABLE {table} ADD COLUMN at timestamptz")
        with session.transaction() as tx:
            for row in table_rows(source, table):
                if row[0] != 101:
                    tx.update(table, {"id": row[0]}, {"at": row[4]})
    done = gpcdc(work_dir, *replay_flags(target, config), "--skip-ddl", str(refused))
    assert done.returncode == 0, done.stderr
    assert table_rows(target_cluster, table) == table_rows(source, table)


def test_sql_written_to_the_topics_is_not_run_on_the_target(source, replay_target, work_dir):
    target, config, pipeline, group = replay_target
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=20, hot_keys=3, seed=21))
    bootstrap(source, pipeline, "snapshot")
    group.start()
    run_workload(source, WorkloadSpec(threads=1, transactions=20, hot_keys=3, seed=22))
    wait_until_acknowledged(source, pipeline.slot)
    group.stop()
    # A forged DDL transaction, well formed in every other way: record, commit record, a part.
    topics, kafka = Topics(config.kafka.topic_prefix), kafka_client_settings(config)
    gxid, lsn, now = 10**12, 2**62, int(time.time() * 1000)
    position = {"xid": 1, "commit_lsn": lsn, "commit_ts_ms": now}
    producer = Producer({**kafka, "enable.idempotence": True})  # order kept across retries
    producer.produce(topics.dtx, orjson.dumps({"type": "ddl", "gxid": gxid, "statement": f"DROP TABLE {ACCOUNTS}",
                                               "segment": -1, **position}), partition=0)
    producer.produce(topics.dtx, orjson.dumps({"type": "commit", "gxid": gxid, "segments": [0], "segment": -1,
                                               **position}), partition=0)
    for status in ("BEGIN", "END"):
        producer.produce(topics.changes, orjson.dumps({"status": status, "id": "0:1", "ts_ms": now, "event_count": 0,
                                                       "gxid": gxid, "one_phase": False, "segment": 0, **position}),
                         partition=0)
    assert producer.flush(30) == 0

    line = one_line_error(gpcdc(work_dir, *replay_flags(target, config)))
    assert f"gxid {gxid}'s DDL" in line and "DROP TABLE is not replayed" in line
    target_cluster = target.cluster()
    assert table_rows(target_cluster, ACCOUNTS) == table_rows(source, ACCOUNTS), "the table is untouched and whole"
    assert table_rows(target_cluster, EVENTS) == table_rows(source, EVENTS)
    assert gxid not in {row[1] for row in table_rows(target_cluster, APPLIED)}


def test_a_part_prepared_long_after_its_commit_record_is_late_not_missing(source, replay_target):
    target, config, pipeline, group = replay_target
    table = f"late_{uuid.uuid4().hex[:6]}"
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
    bootstrap(source, pipeline, "snapshot")
    group.start()
    session = Session(source)
    try:
        tx = session.transaction()
        tx.insert(table, [{"id": i, "v": "x"} for i in range(12)])
        assert len(tx.touched) >= 2
        slow, fast = tx.touched[-1], tx.touched[:-1]
        # Two-phase commit by hand: every part prepared, the commit record written,
        # and every segment but one commits its part; that one is slow.
        for segment in tx.touched:
            session.connection(segment).execute(f"PREPARE TRANSACTION '{gid(tx.gxid)}'")
        tx._write_commit_record()
        for segment in fast:
            session.connection(segment).execute(f"COMMIT PREPARED '{gid(tx.gxid)}'")
        record_ts = int(time.time() * 1000)
        # Until the slow segment's watermark has read its prepared list well past the record.
        deadline = time.monotonic() + 90
        while not any(w.get("prepared_ts_ms", -1) > record_ts + 2000 and tx.gxid in w.get("prepared", ())
                      for w in read_captured(config).watermarks[slow]):
            assert time.monotonic() < deadline, "no watermark of the slow segment"
            threading.Event().wait(0.2)  # polling Kafka for the worker's next watermark
        target_cluster = target.cluster()
        with Replayer(config, settings=ReplaySettings(clock_skew_ms=0)) as replayer:
            waiting = replayer.run()
        assert waiting.pending >= 1, "in doubt: waiting, not applied, and not called missing"
        assert table_rows(target_cluster, table) == []
        session.connection(slow).execute(f"COMMIT PREPARED '{gid(tx.gxid)}'")
        session.connection(-1).execute("SELECT gp_dist.dtx_end(%s)", (tx.gxid,))
        tx.state = "committed"
    finally:
        session.close()
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config, settings=ReplaySettings(clock_skew_ms=0)) as replayer:
        done = replayer.run()
    assert done.pending == 0
    assert table_rows(target_cluster, table) == table_rows(source, table) and len(table_rows(source, table)) == 12


def test_a_broker_that_lost_its_data_is_refused_by_capture_status_and_replay(source, work_dir):
    import shutil

    import pytest

    from gpcdc_toolkit.bootstrap import Pipeline, drop_slots
    from gpcdc_toolkit.broker import EmbeddedBroker
    from gpcdc_toolkit.capture import CaptureGroup
    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.errors import GpcdcError
    from gpcdc_toolkit.sandbox import Sandbox

    broker_dir = work_dir / f"lost-{uuid.uuid4().hex[:4]}"
    broker = EmbeddedBroker(broker_dir).up()
    target = None
    table = f"lost_{uuid.uuid4().hex[:6]}"
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"l{uuid.uuid4().hex[:8]}", "source.sandbox": "source"}, environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.3}))
    status = ["--source-sandbox", "source", "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
              "--kafka-topic-prefix", config.kafka.topic_prefix, "status"]
    try:
        with Session(source) as session:
            session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
            bootstrap(source, pipeline, "snapshot")
            group.start()
            with session.transaction() as tx:
                tx.insert(table, [{"id": i, "v": "before"} for i in range(10)])
            wait_until_acknowledged(source, pipeline.slot)
            broker.kill()
            with session.transaction() as tx:
                tx.insert(table, [{"id": i, "v": "while away"} for i in range(10, 20)])
            wait_until_status_shows_kafka_away(work_dir, status)
        # The broker comes back on its port with its disk lost; capture, started again,
        # refuses to write on.
        shutil.rmtree(broker.data)
        broker = EmbeddedBroker(broker_dir).up()
        assert broker.bootstrap_servers == config.kafka.bootstrap_servers
        group.stop()
        with pytest.raises(GpcdcError, match="Kafka lost events it had acknowledged"):
            group.start()
        shown = gpcdc(work_dir, *status)
        assert shown.returncode == 3 and "stopped for good" in shown.stderr and "bootstrap the pipeline again" in shown.stderr
        # A replay into a fresh target loads the snapshot, then refuses the stream.
        target = Sandbox(f"target-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
        line = one_line_error(gpcdc(work_dir, "--target-sandbox", target.name, *status[:-1], "replay", "--once"))
        assert "not even the pipeline's marker" in line and "bootstrap the pipeline again" in line
    finally:
        group.stop()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)
        broker.down()
        if target is not None:
            target.down(remove=True)
