"""Protocol messages as typed rows, and stream planning arithmetic (no servers)."""

import datetime as dt

import orjson
import pytest

from gpcdc_toolkit.ingest import COLUMNS, to_row
from gpcdc_toolkit.ingest._spark_source import SourceOptionError, _limit, _offsets_option

NAMES = [name for name, _ in COLUMNS]


def row(value, key=None):
    out = to_row("gpcdc.changes", 1, 7, 1_700_000_000_000, key, orjson.dumps(value) if not isinstance(value, bytes) else value)
    assert len(out) == len(COLUMNS)
    return dict(zip(NAMES, out))


def test_row_event():
    r = row({"before": {"id": 1}, "after": {"id": 2, "ok": True, "x": 1.5, "n": None},
             "source": {"segment": 1, "gxid": 9, "txId": 4, "commit_lsn": 100, "ts_ms": 1_700_000_000_500,
                        "schema": "public", "table": "t", "seq": 3, "one_phase": False},
             "op": "u", "ts_ms": 1, "transaction": {}}, key=b'{"id":2}')
    assert (r["kind"], r["segment"], r["gxid"], r["xid"], r["op"], r["table_name"], r["seq"]) == ("row", 1, 9, 4, "u", "t", 3)
    assert r["after"] == {"id": "2", "ok": "true", "x": "1.5", "n": None} and r["before"] == {"id": "1"}
    assert r["commit_ts"] == 1_700_000_000_500  # epoch ms until it becomes an Arrow timestamp
    assert r["key"] == '{"id":2}' and r["_corrupt_record"] is None and r["offset"] == 7


def test_transaction_record_and_watermark_kinds():
    end = row({"status": "END", "id": "1:4", "ts_ms": 1, "event_count": 3, "data_collections": [], "gxid": 9,
               "one_phase": True, "end_lsn": 140, "segment": 1, "xid": 4, "commit_lsn": 100, "commit_ts_ms": 1})
    assert (end["kind"], end["event_count"], end["end_lsn"], end["one_phase"]) == ("end", 3, 140, True)
    commit = row({"type": "commit", "gxid": 9, "segments": [0, 1], "segment": -1, "xid": 2, "commit_lsn": 50,
                  "commit_ts_ms": 1})
    assert (commit["kind"], commit["segments"], commit["segment"]) == ("commit", [0, 1], -1)
    ddl = row({"type": "ddl", "gxid": 9, "statement": "DROP TABLE t", "segment": -1, "xid": 2, "commit_lsn": 50,
               "commit_ts_ms": 1})
    assert ddl["statement"] == "DROP TABLE t"
    mark = row({"resolved": 500, "resolved_ts_ms": 1_700_000_000_000, "segment": 2, "ts_ms": 1})
    assert (mark["kind"], mark["resolved_lsn"], mark["segment"]) == ("resolved", 500, 2)


@pytest.mark.parametrize("value", [b"not json", b"[1, 2]", b'{"type": "other"}', b'{"op": "c"}', b"\xff\xfe"])
def test_corrupt_messages_keep_their_text_and_position(value):
    r = row(value)
    assert r["_corrupt_record"] is not None and r["kind"] is None
    assert (r["partition"], r["offset"]) == (1, 7)


def test_read_limit_shares():
    assert _limit({0: 0, 1: 0}, {0: 10, 1: 10}, 100) == {0: 10, 1: 10}
    limited = _limit({0: 0, 1: 0, 2: 5}, {0: 90, 1: 10, 2: 5}, 20)
    assert sum(limited[p] - s for p, s in {0: 0, 1: 0, 2: 5}.items()) == 20 and limited[0] > limited[1]
    assert _limit({0: 0, 1: 0, 2: 0}, {0: 1, 1: 1, 2: 1}, 2) in ({0: 1, 1: 1, 2: 0}, {0: 1, 1: 0, 2: 1}, {0: 0, 1: 1, 2: 1})


def test_offset_options():
    assert _offsets_option({"startingoffsets": '{"0": 5}'}, "startingOffsets", "earliest") == {0: 5}
    assert _offsets_option({}, "endingOffsets", "latest") == "latest"
    with pytest.raises(SourceOptionError, match="not earliest, latest or a JSON object"):
        _offsets_option({"startingoffsets": "first"}, "startingOffsets", "earliest")


def test_rows_become_one_arrow_batch_with_nulls_in_place():
    from gpcdc_toolkit.ingest._rows import arrow_schema, to_arrow

    first = {"before": None, "after": {"a": 1}, "op": "c",
             "source": {"segment": 0, "gxid": 1, "txId": 1, "commit_lsn": 1, "ts_ms": 1_700_000_000_000,
                        "schema": "s", "table": "t", "seq": 1, "one_phase": True}}
    second = {**first, "op": "u", "before": {"a": 2}, "after": {"a": 3, "b": None}}
    rows = [to_row("t", 0, 1, 5, None, orjson.dumps(first)), to_row("t", 0, 2, 6, None, b"bad"),
            to_row("t", 0, 3, 7, None, orjson.dumps(second))]
    batch = to_arrow(rows, arrow_schema())
    assert batch.num_rows == 3 and batch.schema.names == NAMES
    assert batch.column("after").to_pylist() == [[("a", "1")], None, [("a", "3"), ("b", None)]]
    assert batch.column("before").to_pylist() == [None, None, [("a", "2")]]
    assert batch.column("_corrupt_record").to_pylist() == [None, "bad", None]
    stamps = batch.column("commit_ts").to_pylist()
    assert stamps[1] is None and stamps[0] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_held_off_while_a_batch_is_parsed_and_left_as_it_was(enabled):
    import gc

    from gpcdc_toolkit.ingest._rows import collector_paused

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        with pytest.raises(ValueError), collector_paused():
            raise ValueError("a batch that failed half-way")
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
