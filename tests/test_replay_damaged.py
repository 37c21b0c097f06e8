"""Replay of a real pipeline's topics copied with one message damaged: each damage is
refused or set aside and said, never applied as if whole, and exit status 0 only where
the target equals the source."""

import time
import uuid

import orjson
import pytest
from confluent_kafka import Producer

from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, ensure_topics, wait_until_acknowledged
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.ingest._consumer import located, read_to_end
from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.replay import ReassemblyError, Replayer
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import table_rows
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, reset_tables, run_workload

from .test_cli import gpcdc


@pytest.fixture(scope="module")
def captured(source, broker, work_dir):
    """A workload captured: (config, the source's rows per table, the changes topic's
    messages as (partition, offset, key, value), the dtx topic's)."""
    prefix = f"dmg{uuid.uuid4().hex[:6]}"
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": prefix, "source.sandbox": "source"}, environ={})
    pipeline = Pipeline(config.work_dir, prefix)
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.3}))
    reset_tables(source)
    bootstrap(source, pipeline, "snapshot")
    group.start()
    try:
        run_workload(source, WorkloadSpec(threads=2, transactions=60, hot_keys=3, multi_segment_share=0.7, seed=5))
        wait_until_acknowledged(source, pipeline.slot)
        _wait_for_the_coordinators_watermark_past_every_commit(config, prefix)
    finally:
        group.stop()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)
    kafka = kafka_client_settings(config)
    messages = {topic: [(*located(m), m.key(), m.value()) for m in read_to_end(kafka, topic)]
                for topic in (Topics(prefix).changes, Topics(prefix).dtx)}
    rows = {table: table_rows(source, table) for table in (ACCOUNTS, EVENTS)}
    return config, rows, messages[Topics(prefix).changes], messages[Topics(prefix).dtx]


def _wait_for_the_coordinators_watermark_past_every_commit(config, prefix, timeout=60.0):
    """Until the coordinator's topic holds a watermark past every commit record's time by
    more than the replay's clock skew: what proves a record that is not there lost."""
    kafka = kafka_client_settings(config)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        values = [orjson.loads(m.value()) for m in read_to_end(kafka, Topics(prefix).dtx)]
        last_commit = max(v["commit_ts_ms"] for v in values if v.get("type") == "commit")
        if any((v.get("resolved_ts_ms") or 0) > last_commit + config.replay.clock_skew_ms + 100 for v in values):
            return
    raise AssertionError("the coordinator's watermark did not pass the last commit")


def _replayed(captured, work_dir, damage, drop_record=None):
    """The topics copied under a new prefix with ``damage`` done to the last account
    update's message, then ``gpcdc replay --once`` into a fresh target: (its result, the
    target's rows per table)."""
    prefix = _copied(captured, damage, drop_record)
    target = Sandbox(f"dmg-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    try:
        return _replay(captured, work_dir, prefix, target)
    finally:
        target.down(remove=True)


def _copied(captured, damage, drop_record=None):
    """The captured topics and the pipeline's record copied under a new prefix, with
    ``damage`` done to the last account update's message and the commit record of gxid
    ``drop_record`` left out; the new prefix."""
    import shutil

    config, _rows, changes, dtx = captured
    last = max((p, o) for p, o, _k, v in changes
               if (d := orjson.loads(v)).get("op") == "u" and d["source"]["table"] == ACCOUNTS)
    prefix = f"{config.kafka.topic_prefix}x{uuid.uuid4().hex[:4]}"
    kafka = kafka_client_settings(config)
    ensure_topics(kafka, Topics(prefix), max(p for p, *_ in changes) + 1)
    producer = Producer({**kafka, "enable.idempotence": True})
    # Offset by offset across the partitions: every partition's marker goes first, and a
    # copy sent to another partition lands in its midst, whatever order they were read in.
    for partition, offset, key, value in sorted(changes, key=lambda m: (m[1], m[0])):
        for to_partition, sent in damage(partition, orjson.loads(value)) if (partition, offset) == last else [
                (partition, value)]:
            producer.produce(Topics(prefix).changes, sent if isinstance(sent, bytes) else orjson.dumps(sent), key=key,
                             partition=to_partition)
    for _partition, _offset, key, value in dtx:
        if drop_record is None or orjson.loads(value).get("gxid") != drop_record or b'"commit"' not in value:
            producer.produce(Topics(prefix).dtx, value, key=key, partition=0)
    assert producer.flush(30) == 0
    shutil.copytree(Pipeline(config.work_dir, config.kafka.topic_prefix).directory,
                    Pipeline(config.work_dir, prefix).directory, ignore=shutil.ignore_patterns("*.tmp"))
    return prefix


def _replay(captured, work_dir, prefix, target):
    """``gpcdc replay --once`` of the topics of ``prefix`` into the sandbox ``target``:
    (its result, the target's rows per table)."""
    config, rows, _changes, _dtx = captured
    done = gpcdc(work_dir, "--source-sandbox", "source", "--target-sandbox", target.name,
                 "--kafka-bootstrap-servers", config.kafka.bootstrap_servers, "--kafka-topic-prefix", prefix,
                 "replay", "--once")
    cluster = target.cluster()
    names = cluster.table_names()  # none of the source's where the replay stopped before its initial load
    return done, {table: table_rows(cluster, table) if table in names else [] for table in rows}


def _changed(event, **after):
    return {**event, "after": {**event["after"], **after}}


def test_a_copy_as_it_was_replays_equal(captured, work_dir):
    done, target = _replayed(captured, work_dir, lambda p, event: [(p, event)])
    assert done.returncode == 0, done.stderr
    assert target == captured[1]


@pytest.mark.parametrize(("damage", "said"), [
    # Sent again with another balance: which is the source's cannot be told.
    (lambda p, e: [(p, e), (p, _changed(e, balance=987654321))], "it holds two different row events numbered"),
    # Its image cut: set aside, and its part lacks it.
    (lambda p, e: [(p, {**e, "after": None})], "sequence numbers"),
])
def test_a_part_made_ambiguous_or_incomplete_is_refused_as_damaged(captured, work_dir, damage, said):
    done, target = _replayed(captured, work_dir, damage)
    assert done.returncode != 0 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr  # a warning of what was set aside, then the error
    balances = {row[0]: row[1] for row in target[ACCOUNTS]}
    assert 987654321 not in balances.values()


def test_an_update_without_a_column_it_does_not_list_as_unchanged_is_refused(captured, work_dir):
    def cut(partition, event):
        return [(partition, {**event, "after": {k: v for k, v in event["after"].items() if k != "balance"}})]

    done, _target = _replayed(captured, work_dir, cut)
    assert done.returncode == 1
    assert "carries no value for 'balance' and does not list them as unchanged" in done.stderr, done.stderr


@pytest.mark.parametrize("damage", [
    # A copy in the other segment's partition, changed: set aside there; its own part is whole.
    lambda p, e: [(p, e), ((p + 1) % 3, _changed(e, balance=55555))],  # the source has 3 segments
    # A message nested deeper than Python's recursion limit.
    lambda p, e: [(p, e), (p, b'{"op":' + b"[" * 1000 + b"]" * 1000 + b',"source":{}}')],
])
def test_a_stray_message_is_set_aside_and_the_target_equals_the_source(captured, work_dir, damage):
    done, target = _replayed(captured, work_dir, damage)
    assert done.returncode == 0, done.stderr
    assert "1 malformed messages set aside" in done.stdout + done.stderr
    assert target == captured[1]


def test_a_commit_record_lost_is_named_once_the_coordinators_watermark_passes_its_commit(captured, work_dir):
    """Its parts wait for it; the coordinator commits before its segments, so a watermark
    past their commit proves it lost. Nothing after it goes out: a later transaction may
    have had to follow it."""
    _config, _rows, _changes, dtx = captured
    records = [v for _p, _o, _k, value in dtx if (v := orjson.loads(value)).get("type") == "commit"
               and len(v["segments"]) > 1]
    lost = records[len(records) // 2]["gxid"]
    done, _target = _replayed(captured, work_dir, lambda p, e: [(p, e)], drop_record=lost)
    assert done.returncode != 0
    assert (f"gxid {lost} cannot be replayed whole: the coordinator's watermark passed its commit, and gxid {lost}'s "
            "commit record never came") in done.stderr, done.stderr


def test_a_part_of_a_transaction_applied_by_a_run_before_read_after_the_restart_is_refused_as_late(captured,
                                                                                                     work_dir):
    """A two-phase part that comes, while a replay follows the stream, after a run
    before applied its transaction (one of its parts sent again with a new commit LSN
    and the next number, as a broken or hostile writer would). Its record was read
    before the restart, and the window the run read again at its start does not hold
    the transaction: the replay asks the target, and refuses the part as one its
    transaction went out without, rather than calling the record lost. Nothing more is
    applied."""
    config, rows, changes, dtx = captured
    records = [v for _p, _o, _k, value in dtx if (v := orjson.loads(value)).get("type") == "commit"
               and len(v["segments"]) > 1 and not v.get("syncpoint")]
    gxid, segment = records[len(records) // 2]["gxid"], records[len(records) // 2]["segments"][-1]
    events = [orjson.loads(value) for p, _o, _k, value in changes if p == segment]
    begin = next(i for i, e in enumerate(events) if e.get("status") == "BEGIN" and e.get("gxid") == gxid)
    end = next(i for i, e in enumerate(events) if e.get("status") == "END" and e.get("gxid") == gxid)
    lsn = max(e.get(f) or 0 for e in events for f in ("commit_lsn", "end_lsn", "resolved")) + 1_000
    number = max(e.get("number") or e.get("parts") or 0 for e in events) + 1
    prefix = _copied(captured, lambda p, e: [(p, e)])
    target = Sandbox(f"dmg-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    try:
        first, replayed = _replay(captured, work_dir, prefix, target)
        assert first.returncode == 0 and replayed == rows, first.stderr

        sent: list[float] = []

        def send_once_caught_up(progress):  # the run's first window read: what comes now is read past it
            if progress.caught_up and not sent:
                producer = Producer({**kafka_client_settings(config), "enable.idempotence": True})
                for event in events[begin:end + 1]:
                    producer.produce(Topics(prefix).changes, orjson.dumps(_relocated(event, lsn, number)),
                                     partition=segment)
                # The coordinator's watermark again, later: it proves every record before it read.
                watermark = [v for *_, value in dtx if (v := orjson.loads(value)).get("type") == "resolved"][-1]
                producer.produce(Topics(prefix).dtx, orjson.dumps({
                    **watermark, "resolved": watermark["resolved"] + 1, "resolved_ts_ms": watermark["resolved_ts_ms"] + 1}),
                    partition=0)
                assert producer.flush(30) == 0
                sent.append(time.monotonic())

        following = config.with_settings({"kafka.topic_prefix": prefix, "target.sandbox": target.name})
        with Replayer(following) as replayer, pytest.raises(ReassemblyError) as refused:
            replayer.run(follow=True, progress=send_once_caught_up, progress_interval=0.1,
                         should_stop=lambda: bool(sent) and time.monotonic() - sent[0] > 60)
        replayed = {table: table_rows(target.cluster(), table) for table in rows}
    finally:
        target.down(remove=True)
    offset = sum(1 for p, *_ in changes if p == segment)  # where the part sent again begins
    assert (f"segment {segment}'s part of gxid {gxid} at offset {offset} arrives after the transaction went out "
            "without it") in str(refused.value), refused.value
    assert replayed == rows


def _relocated(event, lsn, number):
    """A part's message as if committed again at ``lsn`` and numbered ``number``."""
    event = {**event}
    if "commit_lsn" in event:
        event["commit_lsn"] = lsn
    if "end_lsn" in event:
        event["end_lsn"] = lsn + 100
    if "number" in event:
        event["number"] = number
    if isinstance(event.get("source"), dict):
        event["source"] = {**event["source"], "commit_lsn": lsn}
    return event
