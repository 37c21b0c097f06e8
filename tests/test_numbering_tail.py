"""What a segment partition's tail says of its parts' numbering, read from a real broker
(``ingest.last_numbering``): capture numbers on from it after a restart, a replay
resumed partway through checks the number before its first part against it.

Partitions are generated whole: a marker that counts parts or not, then rows, ENDs and
watermarks with or without numbers, lost marks, malformed and foreign messages; then
retention removes a generated head (the marker with it, or not), and the numbering is
read before a generated offset. After a repaired mark, capture streams from a new slot:
the number goes on, its LSN does not. The answer must be the one a plain backward reading
of the same messages gives, across the reader's growing windows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.ingest import UNNUMBERED, end_offsets, last_numbering
from gpcdc_toolkit.protocol import lost_marker, pipeline_marker

# What follows the marker, message by message.
KINDS = ("row", "end", "end", "resolved", "end unnumbered", "resolved unnumbered", "end without lsn",
         "resolved without lsn", "lost", "repaired", "garbage", "foreign")


def _message(kind: str, lsn: int, number: int) -> bytes:
    if kind == "row":
        return orjson.dumps({"op": "c", "after": {"id": lsn}, "source": {"segment": 0, "commit_lsn": lsn, "seq": 1}})
    end = {"status": "END", "segment": 0, "commit_lsn": lsn, "gxid": lsn, "one_phase": False, "commit_ts_ms": lsn}
    if kind == "end":
        return orjson.dumps({**end, "number": number})
    if kind == "end unnumbered":
        return orjson.dumps(end)
    if kind == "end without lsn":  # malformed: says nothing
        return orjson.dumps({k: v for k, v in end.items() if k != "commit_lsn"} | {"number": number})
    if kind == "resolved":
        return orjson.dumps({"type": "resolved", "segment": 0, "resolved": lsn, "parts": number})
    if kind == "resolved unnumbered":
        return orjson.dumps({"type": "resolved", "segment": 0, "resolved": lsn})
    if kind == "resolved without lsn":  # says nothing: no position to number on from
        return orjson.dumps({"type": "resolved", "segment": 0, "parts": number})
    if kind == "lost":
        return lost_marker(0, "gone").value
    if kind == "repaired":  # the segment streams from a new slot after it: its LSNs are not the old one's
        return orjson.dumps({"type": "repaired", "segment": 0, "number": 1, "xmax": 9, "in_progress": [],
                             "coordinator_lsn": 7, "version": 2})
    if kind == "garbage":
        return b'{"status": "END", "number": '
    return b'"a JSON string"'


def _expected(values: list[bytes], low: int, before: int) -> tuple[int, int] | str | None:
    """A plain backward reading: the marker decides where it is left; where retention
    removed it, the last END or watermark (numbered or not) does."""
    def decoded(value: bytes) -> object:
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return None

    if low >= len(values):
        return None
    head = decoded(values[low])
    marked = isinstance(head, dict) and head.get("type") == "pipeline"
    if marked and "parts" not in head:
        return UNNUMBERED
    repaired = False
    for offset in range(min(before, len(values)) - 1, low - 1, -1):
        value = decoded(values[offset])
        if not isinstance(value, dict):
            continue
        kind = "end" if value.get("status") == "END" else value.get("type")
        if kind == "end" and "commit_lsn" in value:
            if "number" in value:
                return -1 if repaired else value["commit_lsn"], value["number"]
            if not marked:
                return UNNUMBERED
        elif kind == "resolved" and "resolved" in value:
            if "parts" in value:
                return -1 if repaired else value["resolved"], value["parts"]
            if not marked:
                return UNNUMBERED
        elif kind == "repaired":
            repaired = True
        elif kind == "pipeline" and "parts" in value:
            return -1, value["parts"]
    return None


@st.composite
def partitions(draw: st.DrawFn) -> tuple[list[bytes], int, int]:
    numbered = draw(st.booleans())
    body = draw(st.lists(st.sampled_from(KINDS), max_size=40))
    # Long runs of rows between them, so that the reader's windows (256, then 1,024, ...) end anywhere.
    gaps = draw(st.lists(st.integers(0, 150), min_size=len(body), max_size=len(body)))
    values = [pipeline_marker("p", 0, numbered=numbered).value]
    number = 0
    for kind, gap in zip(body, gaps):
        values += [_message("row", len(values) + i, 0) for i in range(gap)]
        number += kind in ("end", "resolved")
        values.append(_message(kind, len(values), number))
    low = draw(st.integers(0, len(values)))
    before = draw(st.integers(0, len(values)))
    return values, low, before


@contextmanager
def _partition(broker: Any, values: list[bytes], low: int) -> Iterator[tuple[dict[str, str], str]]:
    """A topic of one partition holding ``values``, those before offset ``low`` removed
    (as retention removes them); deleted afterwards."""
    kafka = {"bootstrap.servers": broker.bootstrap_servers}
    topic = f"numbering-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(kafka)
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)
    try:
        producer = Producer({**kafka, "linger.ms": 5})
        for value in values:
            producer.produce(topic, value, partition=0)
        assert producer.flush(30) == 0
        if low:
            for future in admin.delete_records([TopicPartition(topic, 0, low)]).values():
                future.result(30)
        assert end_offsets(kafka, topic, [0]) == {0: len(values)}
        yield kafka, topic
    finally:
        for future in admin.delete_topics([topic]).values():
            future.result(30)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(partitions())
def test_the_numbering_before_an_offset_is_what_a_backward_reading_finds(broker, partition):
    values, low, before = partition
    with _partition(broker, values, low) as (kafka, topic):
        assert last_numbering(kafka, topic, 0, before) == _expected(values, low, before)


@pytest.mark.parametrize("numbered", [False, True])
def test_a_partition_whose_marker_retention_removed_says_its_numbering_by_its_last_end(broker, numbered):
    """The case of a pipeline bootstrapped before parts were numbered, whose marker is gone."""
    values = [pipeline_marker("p", 0, numbered=numbered).value, _message("row", 1, 0),
              _message("end" if numbered else "end unnumbered", 2, 1), _message("row", 3, 0)]
    with _partition(broker, values, 1) as (kafka, topic):
        assert last_numbering(kafka, topic, 0, 4) == ((2, 1) if numbered else UNNUMBERED)
        assert last_numbering(kafka, topic, 0, 2) is None, "nothing before the END says"


def test_after_a_repaired_mark_the_number_goes_on_and_the_old_slots_lsn_holds_nothing_back(broker):
    """A repaired segment streams from a new slot, whose LSNs may lie below the old one's:
    its capture, restarted, numbers on without dropping them as sent before."""
    values = [pipeline_marker("p", 0, numbered=True).value, _message("end", 900, 1), _message("lost", 0, 0),
              _message("repaired", 0, 0), _message("row", 5, 0)]
    with _partition(broker, values, 0) as (kafka, topic):
        assert last_numbering(kafka, topic, 0, len(values)) == (-1, 1)
        assert last_numbering(kafka, topic, 0, 3) == (900, 1), "before the mark, the old slot's LSN holds"
    values.append(_message("end", 40, 2))  # the new slot's first part
    with _partition(broker, values, 0) as (kafka, topic):
        assert last_numbering(kafka, topic, 0, len(values)) == (40, 2)
