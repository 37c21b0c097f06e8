"""Framing the pipeline's messages into parts, records and watermarks (no servers)."""

import pytest

from gpcdc_toolkit.replay import Framer, LegacyStreamError, Part, Record, StreamError, Watermark


def begin(segment, lsn, gxid=5):
    return {"status": "BEGIN", "segment": segment, "commit_lsn": lsn, "gxid": gxid}


def row(segment, lsn, seq, gxid=5):
    return {"op": "c", "after": {"id": seq}, "before": None,
            "source": {"segment": segment, "commit_lsn": lsn, "seq": seq, "gxid": gxid, "schema": "public", "table": "t"}}


def end(segment, lsn, gxid=5, one_phase=False):
    return {"status": "END", "segment": segment, "commit_lsn": lsn, "gxid": gxid, "one_phase": one_phase,
            "commit_ts_ms": 1000 + lsn}


def feed_all(framer, partition, messages, first_offset=0):
    out = [framer.feed(partition, first_offset + i, m) for i, m in enumerate(messages)]
    return [f for f in out if f is not None]


def test_a_part_keeps_each_row_once_and_where_it_began():
    framer = Framer("p")
    # A capture restart in the middle of the transaction sends it again from BEGIN.
    (part,) = feed_all(framer, 1, [begin(1, 100), row(1, 100, 1), begin(1, 100), row(1, 100, 1), row(1, 100, 2),
                                   end(1, 100)], first_offset=40)
    assert isinstance(part, Part) and part.offset == 40 and [r["source"]["seq"] for r in part.payload] == [1, 2]
    assert framer.resume_offsets() == {}


def test_records_carry_their_ddl_and_watermarks_pass_through():
    framer = Framer("p")
    out = feed_all(framer, -1, [
        {"type": "ddl", "gxid": 9, "statement": "ALTER TABLE t ADD c int"},
        {"type": "resolved", "resolved_ts_ms": 5},
        {"type": "commit", "gxid": 9, "segments": [0, 1], "commit_ts_ms": 7, "commit_lsn": 70},
    ], first_offset=10)
    assert out[0] == Watermark(-1, 5)
    assert out[1] == Record(9, (0, 1), 7, ("ALTER TABLE t ADD c int",), 70, 10)


def test_after_a_restart_a_resend_past_the_read_offset_is_dropped_but_the_window_is_not():
    # Before the restart: read to offset 6 of partition 0; highest commit LSN 200.
    framer = Framer("p", read={0: 6}, lsn={0: 200})
    window = feed_all(framer, 0, [begin(0, 200), end(0, 200)], first_offset=4)
    resent = feed_all(framer, 0, [begin(0, 200), row(0, 200, 1), end(0, 200)], first_offset=6)
    new = feed_all(framer, 0, [begin(0, 300), end(0, 300)], first_offset=9)
    assert [p.commit_lsn for p in window] == [200] and resent == [] and [p.commit_lsn for p in new] == [300]
    assert framer.last_lsn == {0: 300}


def test_legacy_and_key_dispatched_streams_are_refused_in_one_line():
    with pytest.raises(LegacyStreamError, match="legacy markers.*--legacy-per-segment"):
        feed_all(Framer("p"), 0, [begin(0, 1, gxid=None), end(0, 1, gxid=None, one_phase=None)])
    with pytest.raises(LegacyStreamError, match="lists no segments"):
        feed_all(Framer("p"), -1, [{"type": "commit", "gxid": 3, "segments": None, "commit_ts_ms": 1, "commit_lsn": 1}])
    with pytest.raises(StreamError, match="segment dispatcher"):
        feed_all(Framer("p"), 0, [begin(2, 1)])
    (part,) = feed_all(Framer("p", legacy=True), 0, [begin(0, 1, gxid=None), end(0, 1, gxid=None, one_phase=None)])
    assert part.gxid is None
