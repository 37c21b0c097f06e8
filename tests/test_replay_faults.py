"""Replay under faults: a replayer killed at random moments, a part dropped from the stream."""

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import orjson
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from gpcdc_toolkit.bootstrap import Pipeline, bootstrap
from gpcdc_toolkit.capture import ensure_topics, wait_until_acknowledged
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.ingest import end_offsets, read_values
from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.replay import APPLIED, MissingPartError, Replayer, ReplaySettings
from gpcdc_toolkit.validate import read_captured, table_rows
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, reset_tables, run_workload

from ._load import BackgroundLoad
from .conftest import TARGETS


@pytest.fixture
def captured_pipeline(source, replay_target):
    """Capture running on the source into a fresh pipeline; (target, config, pipeline, group)."""
    target, config, pipeline, group = replay_target
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=20, hot_keys=3, seed=3))
    bootstrap(source, pipeline, "snapshot")
    group.start()
    return target, config, pipeline, group


def applied_count(cluster):
    with cluster.coordinator_connection() as conn:  # made when the first replay starts on the target
        if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (APPLIED,)).fetchone()[0]:
            return 0
    return sum(len(r) for r in cluster.rows_by_segment(APPLIED).values())


ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPCDC_")}


def replay_command(work_dir, target, config, *args):
    return [sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(work_dir), "--source-sandbox", "source",
            "--target-sandbox", target.name, "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
            "--kafka-topic-prefix", config.kafka.topic_prefix, "replay", *args]


def wait_for_first_commit(target_cluster, replayer, before):
    deadline = time.monotonic() + 60
    while applied_count(target_cluster) == before and replayer.poll() is None and time.monotonic() < deadline:
        threading.Event().wait(0.05)  # polling the target for the replayer's first commit
    assert replayer.poll() is None, replayer.stderr.read() if replayer.stderr else "(output in a file)"
    assert applied_count(target_cluster) > before, "the replayer committed nothing within 60 s"


def test_following_replay_stops_cleanly_on_sigterm(source, work_dir, captured_pipeline):
    target, config, pipeline, group = captured_pipeline
    target_cluster = target.cluster()
    replayer = subprocess.Popen(replay_command(work_dir, target, config), env=ENV, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_workload(source, WorkloadSpec(threads=2, transactions=60, hot_keys=3, seed=9))
        wait_for_first_commit(target_cluster, replayer, 0)
        wait_until_acknowledged(source, pipeline.slot)
        deadline = time.monotonic() + 60
        while table_rows(target_cluster, ACCOUNTS) != table_rows(source, ACCOUNTS) and time.monotonic() < deadline:
            threading.Event().wait(0.1)  # polling the target while the replayer follows
        replayer.send_signal(signal.SIGTERM)
        out, err = replayer.communicate(timeout=60)
    finally:
        if replayer.poll() is None:
            replayer.kill()
            replayer.wait()
    assert replayer.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("initial load: ") and lines[-1].startswith("applied ") and "transactions" in lines[-1]
    for table in (ACCOUNTS, EVENTS):
        assert table_rows(target_cluster, table) == table_rows(source, table), f"{table} differs"


@pytest.mark.parametrize("replay_target", TARGETS, indirect=True)
def test_replayer_and_capture_killed_at_random_moments_apply_everything_once(source, work_dir, captured_pipeline):
    target, config, pipeline, group = captured_pipeline
    target_cluster = target.cluster()
    spec = WorkloadSpec(threads=3, rate=120, hot_keys=3, update_share=0.3, delete_share=0.1,
                        move_share=0.05, abort_share=0.05)
    command = replay_command(work_dir, target, config, "--replay-batch-transactions", "7")
    rng = random.Random(11)
    kills = 0
    replayer = None
    # The workload writes through every kill, so each new replayer has something to commit.
    with BackgroundLoad(source, spec) as load:
        try:
            while kills < 5 or load.committed < 400:
                replayer = subprocess.Popen(command, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, text=True)
                wait_for_first_commit(target_cluster, replayer, applied_count(target_cluster))
                threading.Event().wait(rng.uniform(0.0, 0.6))  # a random moment while it applies
                replayer.kill()
                replayer.wait()
                kills += 1
                # A capture worker killed too, so the stream holds resends for the next
                # replayer to recognise, across its own restart.
                node = rng.choice([-1, 0, 1, 2])
                group.kill(node)
                group.start_node(node, group.log_file(node))
        finally:
            if replayer is not None and replayer.poll() is None:
                replayer.kill()
                replayer.wait()
    wait_until_acknowledged(source, pipeline.slot, timeout=90)
    with Replayer(config) as last:
        last.run()
    assert kills >= 5
    for table in (ACCOUNTS, EVENTS):
        assert table_rows(target_cluster, table) == table_rows(source, table), f"{table} differs"
    # Every committed transaction of the stream is recorded once (the key forbids twice).
    # (Resends are likely after these kills, not certain: a worker killed when Kafka had
    # acknowledged all it sent resends nothing. Either way each is applied once.)
    captured = read_captured(config)
    committed = {end["gxid"] for end in captured.ends.values()} | set(captured.records)
    applied = [row[1] for row in table_rows(target_cluster, APPLIED)]
    assert sorted(applied) == sorted(committed)


def copy_dropping(config, drop, suffix="x"):
    """The pipeline's topics copied under a new prefix, without the changes-topic
    messages for which ``drop(partition, value)`` is true; returns (config, dropped)."""
    kafka = kafka_client_settings(config)
    old, new = Topics(config.kafka.topic_prefix), Topics(f"{config.kafka.topic_prefix}{suffix}")
    changes = read_values(kafka, old.changes)
    ensure_topics(kafka, new, max(p for p, _o, _v in changes) + 1)
    producer = Producer({**kafka, "enable.idempotence": True})  # order kept across retries
    dropped = 0
    for partition, _offset, value in changes:
        if drop(partition, value):
            dropped += 1
            continue
        producer.produce(new.changes, orjson.dumps(value), partition=partition)
    for _partition, _offset, value in read_values(kafka, old.dtx):
        producer.produce(new.dtx, orjson.dumps(value), partition=0)
    assert producer.flush(30) == 0
    # The capture workers are still running: a state file being written atomically
    # exists for an instant as ``*.tmp`` beside it, and is no state to copy.
    shutil.copytree(Pipeline(config.work_dir, old.prefix).directory, Pipeline(config.work_dir, new.prefix).directory,
                    ignore=shutil.ignore_patterns("*.tmp"))
    return load_config({"work_dir": str(config.work_dir), "kafka.bootstrap_servers": config.kafka.bootstrap_servers,
                        "kafka.topic_prefix": new.prefix, "source.sandbox": config.source.sandbox,
                        "target.sandbox": config.target.sandbox}, environ={}), dropped


def gxid_of(value):
    return value["source"]["gxid"] if "op" in value else value.get("gxid")


def test_a_missing_part_stops_the_replay_with_a_report_and_nothing_partial(source, captured_pipeline):
    target, config, pipeline, group = captured_pipeline
    run_workload(source, WorkloadSpec(threads=2, transactions=120, hot_keys=3, multi_segment_share=0.8, seed=5))
    wait_until_acknowledged(source, pipeline.slot)
    captured = read_captured(config)
    two_phase = [g for g, segments in captured.records.items() if segments and len(segments) >= 2]
    victim = two_phase[len(two_phase) // 2]
    dropped_segment = captured.records[victim][0]
    # Wait for a watermark of that segment whose list of prepared parts was read after
    # the victim's commit record: what lets the replayer call the part missing, not late.
    record_ts = next(v["commit_ts_ms"] for _p, _o, v in read_values(kafka_client_settings(config), Topics(config.kafka.topic_prefix).dtx)
                     if v.get("type") == "commit" and v["gxid"] == victim)
    deadline = time.monotonic() + 90
    while not any(w.get("prepared_ts_ms", -1) > record_ts for w in read_captured(config).watermarks[dropped_segment]):
        assert time.monotonic() < deadline, "no watermark past the record"
        threading.Event().wait(0.2)  # polling Kafka for the worker's next watermark
    broken, dropped = copy_dropping(config, lambda p, v: p == dropped_segment and gxid_of(v) == victim)
    assert dropped >= 2  # at least its BEGIN and END
    target_cluster = target.cluster()
    with Replayer(broken, settings=ReplaySettings(clock_skew_ms=0)) as replayer, \
            pytest.raises(MissingPartError) as raised:
        replayer.run()
    missing = raised.value.missing
    assert (missing.gxid, missing.segment) == (victim, dropped_segment)
    assert f"gxid {victim} cannot be replayed whole: segment {dropped_segment}'s part is missing" in str(raised.value)
    assert "offset" in str(raised.value) and "\n" not in str(raised.value)
    applied = {row[1] for row in table_rows(target_cluster, APPLIED)}
    assert victim not in applied and applied  # what came before it was applied, it was not
    # Run again, it resumes where it stopped, partway through the partitions: it stops at
    # the same part (the gap in the numbers is seen across the resume point).
    with Replayer(broken, settings=ReplaySettings(clock_skew_ms=0)) as replayer, \
            pytest.raises(MissingPartError) as again:
        replayer.run()
    assert (again.value.missing.gxid, again.value.missing.segment) == (victim, dropped_segment)
    assert victim not in {row[1] for row in table_rows(target_cluster, APPLIED)}
    # Nothing of the victim reached the target: none of its rows on any segment.
    victim_rows = [r for r in captured.rows if r["source"]["gxid"] == victim and r["op"] == "c"]
    assert victim_rows
    for row in victim_rows:
        table = f"{row['source']['schema']}.{row['source']['table']}"
        key = " AND ".join(f"{c} = %s" for c in row["after"])
        assert target_cluster.fetch_all(f"SELECT 1 FROM {table} WHERE {key}", list(row["after"].values())) == []


def test_a_part_damaged_inside_stops_the_replay_before_it(source, captured_pipeline):
    target, config, pipeline, group = captured_pipeline
    # A few transactions first, which the replay applies before it stops: the damaged
    # part is the largest, which may be the workload's first (its large transaction).
    run_workload(source, WorkloadSpec(threads=1, transactions=3, hot_keys=3, seed=11))
    run_workload(source, WorkloadSpec(threads=2, transactions=120, hot_keys=3, multi_segment_share=0.8,
                                      large_transaction_rows=40, seed=12))
    wait_until_acknowledged(source, pipeline.slot)
    captured = read_captured(config)
    rows_per_part = {}
    for row in captured.rows:
        key = (row["source"]["segment"], row["source"]["gxid"])
        rows_per_part.setdefault(key, []).append(row["source"]["seq"])
    (segment, victim), seqs = next((k, v) for k, v in sorted(rows_per_part.items(), key=lambda kv: -len(kv[1]))
                                   if len(v) >= 3)
    middle = sorted(seqs)[len(seqs) // 2]
    # One row event from the middle of the part goes; its BEGIN and END stay.
    broken, dropped = copy_dropping(config, lambda p, v: p == segment and "op" in v and gxid_of(v) == victim
                                    and v["source"]["seq"] == middle)
    assert dropped >= 1
    target_cluster = target.cluster()
    with Replayer(broken) as replayer, pytest.raises(MissingPartError) as raised:
        replayer.run()
    line = str(raised.value)
    assert raised.value.missing.gxid == victim and raised.value.missing.segment == segment
    assert f"segment {segment}'s part at offset" in line and "is damaged" in line
    assert f"sequence numbers {middle} are absent" in line and "\n" not in line
    applied = {row[1] for row in table_rows(target_cluster, APPLIED)}
    assert victim not in applied and applied


POISON = [b"\xff\xfe not json", b"null", b"[]", b'{"status": "END", "commit_lsn": 1}',
          b'{"op": "x", "source": {"segment": 0, "commit_lsn": 1, "seq": 1}}', b'{"type": "commit", "gxid": "7"}',
          b'{"segment": 99999999999999999999, "resolved": 1}', b"{" * 1_000_000]


def test_poison_in_every_partition_is_set_aside_with_its_offset_and_nothing_is_lost(source, captured_pipeline):
    target, config, pipeline, group = captured_pipeline
    kafka = kafka_client_settings(config)
    topics = Topics(config.kafka.topic_prefix)
    partitions = [(topics.changes, p) for p in range(source.segment_count)] + [(topics.dtx, 0)]
    injected = set()

    def delivered(error, message):
        assert error is None, error
        injected.add((message.topic(), message.partition(), message.offset()))

    producer = Producer({**kafka, "message.max.bytes": 2_000_000})
    run_workload(source, WorkloadSpec(threads=2, transactions=60, hot_keys=3, seed=8))
    for i, (topic, partition) in enumerate(partitions):
        for value in (POISON[2 * i % len(POISON)], POISON[(2 * i + 1) % len(POISON)]):
            producer.produce(topic, value, partition=partition, on_delivery=delivered)
    run_workload(source, WorkloadSpec(threads=2, transactions=60, hot_keys=3, seed=9))
    assert producer.flush(30) == 0 and len(injected) == 2 * len(partitions)
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config) as replayer:
        done = replayer.run()
    assert done.set_aside == len(injected) and "malformed messages set aside" in done.line()
    quarantined = [orjson.loads(line) for line in (pipeline.directory / "quarantine.jsonl").read_bytes().splitlines()]
    assert {(q["topic"], q["partition"], q["offset"]) for q in quarantined} == injected
    assert all(q["reason"] for q in quarantined) and max(q["bytes"] for q in quarantined) == 1_000_000
    target_cluster = target.cluster()
    for table in (ACCOUNTS, EVENTS):
        assert table_rows(target_cluster, table) == table_rows(source, table)


def test_a_pipeline_whose_partitions_began_unnumbered_goes_on_unnumbered_and_replays_whole(source, replay_target):
    """Partitions whose markers carry no count, as capture wrote them before every segment's
    parts were numbered: capture goes on without numbers there, and the replay is whole."""
    from gpcdc_toolkit.protocol import pipeline_marker

    target, config, pipeline, group = replay_target
    reset_tables(source)
    bootstrap(source, pipeline, "snapshot")
    kafka, topics = kafka_client_settings(config), Topics(config.kafka.topic_prefix)
    segments = len(source.segments)
    ensure_topics(kafka, topics, segments)
    producer = Producer(kafka)
    for segment in range(segments):
        producer.produce(topics.changes, pipeline_marker(pipeline.start_point().identity, segment).value,
                         partition=segment)
    assert producer.flush(30) == 0
    group.start()
    run_workload(source, WorkloadSpec(threads=2, transactions=40, hot_keys=3, multi_segment_share=0.5, seed=21))
    wait_until_acknowledged(source, pipeline.slot)
    values = [v for _p, _o, v in read_values(kafka, topics.changes)]
    assert any(v.get("status") == "END" for v in values)
    assert not [v for v in values if v.get("number") is not None or v.get("parts") is not None]
    with Replayer(config, settings=ReplaySettings(clock_skew_ms=0)) as replayer:
        assert replayer.run().pending == 0
    # Resumed partway through the partitions: nothing before says a number, nothing waits for one.
    run_workload(source, WorkloadSpec(threads=2, transactions=20, hot_keys=3, multi_segment_share=0.5, seed=22))
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config, settings=ReplaySettings(clock_skew_ms=0)) as replayer:
        assert replayer.run().pending == 0
    # Retention removes each partition's head, its marker with it: capture, restarted,
    # tells from the partition's last END or watermark that its parts are not numbered.
    group.stop()
    ends = end_offsets(kafka, topics.changes)
    admin = AdminClient(kafka)
    for future in admin.delete_records([TopicPartition(topics.changes, p, end - 1) for p, end in ends.items()]).values():
        future.result(30)
    group.start()
    run_workload(source, WorkloadSpec(threads=2, transactions=20, hot_keys=3, multi_segment_share=0.5, seed=23))
    wait_until_acknowledged(source, pipeline.slot)
    later = [v for p, o, v in read_values(kafka, topics.changes) if o >= ends[p]]
    assert any(v.get("status") == "END" for v in later)
    assert not [v for v in later if v.get("number") is not None or v.get("parts") is not None]
    with Replayer(config, settings=ReplaySettings(clock_skew_ms=0)) as replayer:
        assert replayer.run().pending == 0
    target_cluster = target.cluster()
    for table in (ACCOUNTS, EVENTS):
        assert table_rows(target_cluster, table) == table_rows(source, table), f"{table} differs"
