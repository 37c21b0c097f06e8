"""The record of the last event of a node's partition that Kafka confirmed, kept in the
work directory's file and in Kafka's own group offsets, on a real broker: any host
reads what a worker recorded once it stopped, and only for the pipeline and the slot
it was made for."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.capture import _record, ensure_topics
from gpcdc_toolkit.capture._record import ConfirmedRecord, group_of
from gpcdc_toolkit.errors import BrokerError
from gpcdc_toolkit.protocol import Topics

TOPICS = Topics(f"records{uuid.uuid4().hex[:8]}")
TOPIC = TOPICS.changes  # Kafka takes a group's offsets only for a topic it has


@pytest.fixture(scope="module", autouse=True)
def topics(broker):
    ensure_topics({"bootstrap.servers": broker.bootstrap_servers}, TOPICS, 3)


def made(broker, group, file=None, *, identity="p1", repair=0):
    return ConfirmedRecord(file, {"bootstrap.servers": broker.bootstrap_servers}, group, identity=identity,
                           repair=repair)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=30))
def test_another_host_reads_the_highest_offset_recorded_once_the_worker_stopped(broker, tmp_path_factory, offsets):
    group = f"gpcdc.t{uuid.uuid4().hex[:8]}.capture.node1"
    file = tmp_path_factory.mktemp("host") / "node1.confirmed.json"
    with made(broker, group, file) as record:
        for offset in offsets:
            record.record(TOPIC, 1, offset)
        assert record.highest(TOPIC, 1) == max(offsets)  # this process's own, whatever is written yet
    with made(broker, group, file) as again:
        assert again.highest(TOPIC, 1) == max(offsets)  # the file and Kafka
    with made(broker, group) as elsewhere:
        assert elsewhere.highest(TOPIC, 1) == max(offsets)  # Kafka alone: another host
        assert elsewhere.highest(TOPIC, 2) is None  # another partition


def test_a_record_counts_only_for_its_pipeline_and_the_slot_it_was_made_with(broker, tmp_path):
    group = group_of(f"t{uuid.uuid4().hex[:8]}", 1)
    with made(broker, group, tmp_path / "node1.confirmed.json") as record:
        record.record(TOPIC, 1, 41)
    with made(broker, group, tmp_path / "node1.confirmed.json") as again:
        assert again.highest(TOPIC, 1) == 41
    for other in ({"identity": "p2"}, {"repair": 1}):
        with made(broker, group, tmp_path / "node1.confirmed.json", **other) as record:
            assert record.highest(TOPIC, 1) is None


@pytest.mark.parametrize("metadata", ["", "not json", "[1]", json.dumps({"pipeline": "p1"}),
                                      json.dumps({"pipeline": "p1", "repair": "0"})])
def test_an_offset_the_group_committed_without_the_records_own_metadata_is_not_taken_for_it(broker, metadata):
    group = group_of(f"t{uuid.uuid4().hex[:8]}", 1)
    other = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group, "enable.auto.commit": False})
    try:
        other.commit(offsets=[TopicPartition(TOPIC, 1, 500, metadata=metadata)], asynchronous=False)
    finally:
        other.close()
    with made(broker, group) as record:
        assert record.highest(TOPIC, 1) is None


def test_a_broker_that_does_not_answer_is_said_in_one_line(monkeypatch):
    monkeypatch.setattr(_record, "_ANSWER_WAIT", 1.0)
    with ConfirmedRecord(None, {"bootstrap.servers": "127.0.0.1:9"}, "gpcdc.t.capture.node1", identity="p1",
                         repair=0) as record, \
            pytest.raises(BrokerError, match=r"^Kafka did not say what gpcdc\.t\.capture\.node1 committed: .+: "
                                             "check the broker and kafka.bootstrap_servers$"):
        record.highest(TOPIC, 1)


def test_a_worker_stopping_with_its_broker_gone_waits_for_its_last_commit_no_longer_than_it_says(monkeypatch):
    """Its stop is waited for, then killed: the last commit is given a few seconds, and
    nothing waits for a broker that is gone beyond them."""
    monkeypatch.setattr(_record, "_LAST_COMMIT_WAIT", 1.0)
    record = ConfirmedRecord(None, {"bootstrap.servers": "127.0.0.1:9"}, "gpcdc.t.capture.node1", identity="p1",
                             repair=0)
    record.open()
    record.record(TOPIC, 1, 7)
    began = time.monotonic()
    record.close()
    assert time.monotonic() - began < 1.0 + 5.0  # the wait, and no more than a moment beyond it
