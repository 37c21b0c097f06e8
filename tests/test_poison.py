"""Poison input (no servers): whatever bytes or JSON a topic holds, the decoders and the
framer give a value or a protocol error (one line, naming where), never another
exception; what the ingest readers cannot read becomes a corrupt record, which Arrow
(and so Spark) still takes."""

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.errors import StreamError
from gpcdc_toolkit.ingest._rows import CORRUPT, WIDTH, arrow_schema, to_arrow, to_row
from gpcdc_toolkit.protocol import PgoutputError, parse, problem_of
from gpcdc_toolkit.replay import Framer, MalformedMessageError
from gpcdc_toolkit.replay._source import _row_problem

SOURCE = {"version": 2, "connector": "gpcdc", "name": "p", "db": "postgres", "schema": "public", "table": "t",
          "segment": 0, "txId": 100, "commit_lsn": 1000, "ts_ms": 1, "gxid": 7, "seq": 1, "one_phase": False}
VALID = {
    "row": {"before": None, "after": {"id": "1"}, "source": SOURCE, "op": "c", "ts_ms": 1},
    "begin": {"status": "BEGIN", "id": "x", "ts_ms": 1, "event_count": None, "data_collections": None, "gxid": 7,
              "one_phase": False, "end_lsn": 1010, "segment": 0, "xid": 100, "commit_lsn": 1000, "commit_ts_ms": 1},
    "end": {"status": "END", "id": "x", "ts_ms": 1, "event_count": 1, "data_collections": [], "gxid": 7,
            "one_phase": False, "end_lsn": 1010, "segment": 0, "xid": 100, "commit_lsn": 1000, "commit_ts_ms": 1},
    "resolved": {"resolved": 1000, "resolved_ts_ms": 1, "prepared": [7], "prepared_ts_ms": 1, "segment": 0, "ts_ms": 1},
    "commit": {"type": "commit", "gxid": 7, "segments": [0, 1], "ddl_count": 0, "segment": -1, "xid": 5,
               "commit_lsn": 900, "commit_ts_ms": 1},
    "ddl": {"type": "ddl", "gxid": 8, "statement": "ALTER TABLE t ADD COLUMN c int", "segment": -1, "xid": 6,
            "commit_lsn": 950, "commit_ts_ms": 1},
    "pipeline": {"type": "pipeline", "pipeline": "abc", "segment": 0, "version": 2},
}
json_value = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3), max_leaves=8)


@st.composite
def damaged(draw):
    """A valid message of some kind with fields dropped or replaced by any JSON value."""
    kind = draw(st.sampled_from(sorted(VALID)))
    message = orjson.loads(orjson.dumps(VALID[kind]))
    holders = [message] + ([message["source"]] if kind == "row" else [])
    for _ in range(draw(st.integers(1, 3))):
        holder = draw(st.sampled_from(holders))
        name = draw(st.sampled_from(sorted(holder)))
        if draw(st.booleans()):
            del holder[name]
        else:
            holder[name] = draw(json_value)
    return message


def poison():
    return st.one_of(damaged(), json_value)


@pytest.mark.parametrize("kind", sorted(VALID))
def test_every_kind_as_capture_writes_it_is_well_formed(kind):
    assert problem_of(VALID[kind]) is None
    row = to_row("p.changes", 0, 1, 1, b'{"id":1}', orjson.dumps(VALID[kind]))
    assert row[4] == kind and row[CORRUPT] is None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), poison().map(orjson.dumps)))
def test_any_bytes_become_a_row_or_a_corrupt_record_that_arrow_takes(value):
    row = to_row("p.changes", 3, 42, 1_700_000_000_000, None, value)
    assert len(row) == WIDTH and row[:3] == ("p.changes", 3, 42)
    decodes = True
    try:
        problem = problem_of(orjson.loads(value))
    except orjson.JSONDecodeError:
        decodes, problem = False, "not JSON"
    assert (row[CORRUPT] is not None) == (problem is not None or not decodes or row[4] is None)
    to_arrow([row], arrow_schema())  # the batch Spark reads: wrong types never reach it


@settings(max_examples=400, deadline=None)
@given(st.lists(poison(), min_size=1, max_size=6), st.sampled_from([-1, 0, 1]))
def test_the_framer_frames_or_refuses_in_one_line_never_anything_else(messages, partition):
    framer = Framer("p")
    for offset, value in enumerate(messages):
        try:
            framer.feed(partition, offset, value)
        except MalformedMessageError as e:
            assert e.offset == offset and e.partition == partition
            # Malformed, or a row event the replayer cannot apply (an op it does not know,
            # an image missing, another segment's).
            assert e.reason == (problem_of(value) or _row_problem(partition, value))
            assert f"offset {offset} of partition {partition}" in str(e) and "\n" not in str(e)
        except StreamError as e:  # a well-formed message the protocol's order refuses
            assert problem_of(value) is None and "\n" not in str(e)


@pytest.mark.parametrize("value, reason", [
    (None, "a JSON NoneType, not an object"),
    ([], "a JSON list, not an object"),
    ({"status": "END", "commit_lsn": 1}, "a end message without segment"),
    ({"type": "commit", "gxid": 1, "segments": ["0"], "commit_ts_ms": 1, "commit_lsn": 1},
     "a commit message whose segments holds something other than ints"),
    ({"op": "c", "source": {"segment": True, "commit_lsn": 1, "seq": 1}}, "a row event's source whose segment is bool"),
    ({"hello": "world"}, "no kind of the protocol"),
])
def test_malformed_messages_say_what_is_wrong(value, reason):
    assert problem_of(value).startswith(reason)


def test_a_row_event_with_an_unknown_op_is_well_formed_but_not_replayed():
    value = {"op": "x", "source": {"segment": 0, "commit_lsn": 1, "seq": 1, "version": 2}}
    assert problem_of(value) is None  # the audit's expectations say what is wrong with it
    with pytest.raises(MalformedMessageError, match="a row event with op 'x'"):
        Framer("p").feed(0, 5, value)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64) | st.sampled_from(list(b"BCRIUDTMOY")).flatmap(
    lambda kind: st.binary(max_size=63).map(lambda rest: bytes([kind]) + rest)))
def test_pgoutput_decoding_of_any_bytes_is_a_message_or_a_protocol_error(buf):
    try:
        parse(buf)
    except PgoutputError as e:
        assert str(e) and "\n" not in str(e)
