"""Framing the pipeline's messages into parts, records and watermarks (no servers)."""

from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.protocol import problem_of
from gpcdc_toolkit.replay import Framer, LegacyStreamError, MalformedMessageError, Part, Record, StreamError, Watermark
from gpcdc_toolkit.replay._source import resent_content


def begin(segment, lsn, gxid=5):
    return {"status": "BEGIN", "segment": segment, "commit_lsn": lsn, "gxid": gxid}


def row(segment, lsn, seq, gxid=5, value=None):
    return {"op": "c", "after": {"id": seq, **({} if value is None else {"v": value})}, "before": None,
            "source": {"version": 2, "segment": segment, "commit_lsn": lsn, "seq": seq, "gxid": gxid, "schema": "public",
                       "table": "t"}}


def end(segment, lsn, gxid=5, one_phase=False, count=0):
    return {"status": "END", "segment": segment, "commit_lsn": lsn, "gxid": gxid, "one_phase": one_phase,
            "commit_ts_ms": 1000 + lsn, "event_count": count}


def feed_all(framer, partition, messages, first_offset=0):
    out = [framer.feed(partition, first_offset + i, m) for i, m in enumerate(messages)]
    return [f for f in out if f is not None]


def test_a_part_keeps_each_row_once_and_where_it_began():
    framer = Framer("p")
    # A capture restart in the middle of the transaction sends it again from BEGIN.
    (part,) = feed_all(framer, 1, [begin(1, 100), row(1, 100, 1), begin(1, 100), row(1, 100, 1), row(1, 100, 2),
                                   end(1, 100, count=2)], first_offset=40)
    assert isinstance(part, Part) and part.offset == 40 and [r["source"]["seq"] for r in part.payload] == [1, 2]
    assert part.damage is None
    assert framer.resume_offsets() == {}


def test_records_carry_their_ddl_and_watermarks_pass_through():
    framer = Framer("p")
    out = feed_all(framer, -1, [
        {"type": "ddl", "gxid": 9, "statement": "ALTER TABLE t ADD c int"},
        {"type": "resolved", "resolved_ts_ms": 5},
        {"type": "commit", "gxid": 9, "segments": [0, 1], "commit_ts_ms": 7, "commit_lsn": 70},
    ], first_offset=10)
    assert out[0] == Watermark(-1, 5, offset=11)  # where it is: a gap a watermark shows is read again at a resume
    assert out[1] == Record(9, (0, 1), 7, ("ALTER TABLE t ADD c int",), 70, 10)


def test_a_watermark_without_a_time_still_counts_the_parts_before_it():
    """Capture's first watermark of a session says no time: its count is read all the same,
    as a replay resumed after it reads it (``ingest.last_numbering``), so that a part
    lost before it is a gap in both."""
    framer = Framer("p")
    untimed = {"type": "resolved", "segment": 0, "resolved": 400, "resolved_ts_ms": None, "parts": 2}
    assert feed_all(framer, 0, [untimed], first_offset=7) == [Watermark(0, -1, parts=2, offset=7)]
    assert feed_all(framer, 0, [{**untimed, "parts": None}], first_offset=8) == []


def test_after_a_restart_a_resend_past_the_read_offset_is_dropped_but_the_window_is_not():
    # Before the restart: read to offset 6 of partition 0; highest commit LSN 200.
    framer = Framer("p", read={0: 6}, lsn={0: 200})
    window = feed_all(framer, 0, [begin(0, 200), end(0, 200)], first_offset=4)
    resent = feed_all(framer, 0, [begin(0, 200), row(0, 200, 1), end(0, 200, count=1)], first_offset=6)
    new = feed_all(framer, 0, [begin(0, 300), end(0, 300)], first_offset=9)
    assert [p.commit_lsn for p in window] == [200] and resent == [] and [p.commit_lsn for p in new] == [300]
    assert framer.last_lsn == {0: 300}
    assert [p.new for p in window + new] == [False, True], "only the part whose END lies past the offset read is new"
    # A part begun before that offset and ended past it was not read whole then: new too.
    straddling = Framer("p", read={0: 6}, lsn={0: 200})
    [part] = feed_all(straddling, 0, [begin(0, 300), row(0, 300, 1), end(0, 300, count=1)], first_offset=4)
    assert part.new and part.offset == 4


def test_legacy_and_key_dispatched_streams_are_refused_in_one_line():
    with pytest.raises(LegacyStreamError, match="legacy markers.*--replay-legacy-per-segment"):
        feed_all(Framer("p"), 0, [begin(0, 1, gxid=None), end(0, 1, gxid=None, one_phase=None)])
    with pytest.raises(LegacyStreamError, match="lists no segments"):
        feed_all(Framer("p"), -1, [{"type": "commit", "gxid": 3, "segments": None, "commit_ts_ms": 1, "commit_lsn": 1}])
    with pytest.raises(StreamError, match="segment dispatcher"):
        feed_all(Framer("p"), 0, [begin(2, 1)])
    (part,) = feed_all(Framer("p", legacy=True), 0, [begin(0, 1, gxid=None), end(0, 1, gxid=None, one_phase=None)])
    assert part.gxid is None


@given(count=st.integers(0, 40), data=st.data())
def test_a_part_is_whole_only_with_every_sequence_number_up_to_its_count(count, data):
    seqs = data.draw(st.sets(st.integers(1, 45)), label="sequence numbers received")
    framer = Framer("p")
    (part,) = feed_all(framer, 0, [begin(0, 7), *(row(0, 7, s) for s in sorted(seqs)), end(0, 7, count=count)])
    whole = seqs == set(range(1, count + 1))
    assert (part.damage is None) == whole
    if not whole:
        assert f"{len(seqs)} of its {count} row events" in part.damage


def test_an_end_without_a_count_is_damage():
    (part,) = feed_all(Framer("p"), 0, [begin(0, 7), row(0, 7, 1), {**end(0, 7), "event_count": None}])
    assert "no event count" in part.damage


def test_a_transaction_whose_end_was_lost_stops_the_framing_before_the_next():
    framer = Framer("p")
    feed_all(framer, 0, [begin(0, 7), row(0, 7, 1)], first_offset=3)
    with pytest.raises(StreamError, match="offset 3 of p.changes .*gxid 5.* has no END before the next transaction at offset 5"):
        feed_all(framer, 0, [begin(0, 9)], first_offset=5)


def test_a_resend_that_starts_over_from_an_earlier_transaction_is_not_damage():
    framer = Framer("p")
    # Capture restarts in the middle of the large transaction at 9 and sends again from 7.
    partial = feed_all(framer, 0, [begin(0, 7), end(0, 7), begin(0, 9), row(0, 9, 1)])
    again = feed_all(framer, 0, [begin(0, 7), end(0, 7), begin(0, 9), row(0, 9, 1), row(0, 9, 2), end(0, 9, count=2)],
                     first_offset=4)
    assert [p.commit_lsn for p in partial + again] == [7, 7, 9] and all(p.damage is None for p in partial + again)


class ListSpill:
    """A Spill in memory, for the framing rules alone."""

    def __init__(self):
        self.rows = {}
        self.differs = set()

    def put(self, seq, event):
        if seq in self.rows and resent_content(self.rows[seq]) != resent_content(event):
            self.differs.add(seq)
        self.rows[seq] = event

    def conflicting(self):
        return min(self.differs, default=None)

    def seqs(self):
        return iter(sorted(self.rows))

    def __iter__(self):
        return (self.rows[s] for s in sorted(self.rows))

    def __len__(self):
        return len(self.rows)


@given(seqs=st.lists(st.integers(1, 30), max_size=60), count=st.integers(0, 30), limit=st.integers(0, 10))
def test_a_spilled_part_frames_as_one_held_in_memory(seqs, count, limit):
    def frame(**spill):
        framer = Framer("p", **spill)
        (part,) = feed_all(framer, 0, [begin(0, 7), *(row(0, 7, s) for s in seqs), end(0, 7, count=count)])
        return part

    held, spilled = frame(), frame(spill=ListSpill, spill_rows=limit)
    assert list(spilled.payload) == list(held.payload) and spilled.damage == held.damage
    assert isinstance(spilled.payload, ListSpill) == (len(set(seqs)) > limit)


def test_sqlite_spill_keeps_one_row_per_sequence_number_in_order(tmp_path):
    from gpcdc_toolkit.replay._spill import SqliteSpill

    spill = SqliteSpill(tmp_path)
    for seq in [3, 1, 2, 1, 5000, *range(4, 4000)]:
        spill.put(seq, row(0, 7, seq))
    assert spill.conflicting() is None  # each sent again as it was: a resend
    spill.put(1, {**row(0, 7, 1), "ts_ms": 99})  # captured again later: the same row
    spill.put(2, row(0, 7, 2))
    spill.put(2, row(0, 7, 2, value="other"))
    rows = list(spill)
    assert len(spill) == len(rows) == 4000 and [r["source"]["seq"] for r in rows] == [*range(1, 4000), 5000]
    assert rows[0]["ts_ms"] == 99 and list(spill.seqs()) == [r["source"]["seq"] for r in rows]
    assert spill.conflicting() == 2
    assert spill.path.exists()
    spill.close()
    assert not spill.path.exists()


PIPELINE_NAMES = st.text("ab.-_1", min_size=1, max_size=6)  # the characters of Kafka topic names


@settings(max_examples=50, deadline=None)
@given(mine=PIPELINE_NAMES, other=PIPELINE_NAMES)
def test_a_replayer_removes_the_spills_a_killed_replayer_of_its_pipeline_left_and_no_other(tmp_path_factory, mine,
                                                                                             other):
    from gpcdc_toolkit.replay._spill import SpillDirectory

    root = tmp_path_factory.mktemp("spills")

    def left_by_a_killed_replayer(pipeline, name):  # its lock file, which no one holds any more
        directory = root / f"gpcdc-spill+{pipeline}+{name}"
        directory.mkdir()
        (directory / "lock").touch()
        (directory / "part-1.sqlite").write_bytes(b"rows")
        return directory

    running = SpillDirectory(str(root), mine)
    killed, others = left_by_a_killed_replayer(mine, "killed"), left_by_a_killed_replayer(other, "others")
    own = SpillDirectory(str(root), mine)
    assert not killed.exists() and Path(running.name).is_dir() and others.exists() == (other != mine)
    assert Path(own.name).parent == root and Path(own.name).name.startswith(f"gpcdc-spill+{mine}+")
    for directory in (running, own):
        directory.cleanup()
        assert not Path(directory.name).exists()


def test_the_spill_directory_of_a_replayer_killed_by_sigkill_is_removed_by_the_next(tmp_path):
    import signal
    import subprocess
    import sys

    from gpcdc_toolkit.replay._spill import SpillDirectory

    holder = subprocess.Popen([sys.executable, "-c", "import sys; from gpcdc_toolkit.replay._spill import "
                               f"SpillDirectory; d = SpillDirectory({str(tmp_path)!r}, 'p'); print(d.name, flush=True); "
                               "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        left = Path(holder.stdout.readline().strip())
        assert left.is_dir()
        SpillDirectory(str(tmp_path), "p").cleanup()
        assert left.is_dir()  # its replayer still runs
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    SpillDirectory(str(tmp_path), "p").cleanup()
    assert not left.exists() and list(tmp_path.iterdir()) == []


def test_a_commit_record_missing_one_of_its_ddl_records_is_refused():
    framer = Framer("p")
    commit = {"type": "commit", "gxid": 9, "segments": [0], "commit_ts_ms": 7, "commit_lsn": 70, "ddl_count": 1}
    with pytest.raises(StreamError, match="announces 1 DDL records, and 0 came before it"):
        feed_all(framer, -1, [commit])
    (record,) = feed_all(Framer("p"), -1, [{"type": "ddl", "gxid": 9, "statement": "ALTER TABLE t ADD c int"}, commit])
    assert record.ddl == ("ALTER TABLE t ADD c int",)


@settings(max_examples=200)
@given(count=st.integers(1, 20), data=st.data())
def test_a_row_event_sent_again_changed_makes_its_part_damaged_held_or_spilled(count, data):
    """A resend after a capture restart repeats its row (its capture time may differ); two
    different rows under one sequence number cannot both be the source's: the part is
    damaged, never applied with either."""
    sent = [row(0, 7, s) for s in range(1, count + 1)]
    again = data.draw(st.lists(st.integers(1, count), max_size=8), label="sent again")
    changed = data.draw(st.sets(st.sampled_from(again)) if again else st.just(set()), label="changed when sent again")
    for s in again:
        sent.append({**row(0, 7, s, value="other" if s in changed else None), "ts_ms": 5})
    for spill in ({}, {"spill": ListSpill, "spill_rows": data.draw(st.integers(0, 5))}):
        (part,) = feed_all(Framer("p", **spill), 0, [begin(0, 7), *sent, end(0, 7, count=count)])
        if changed:
            assert part.damage == f"it holds two different row events numbered {min(changed)}"
        else:
            assert part.damage is None and [r["source"]["seq"] for r in part.payload] == list(range(1, count + 1))


@pytest.mark.parametrize("event, reason", [
    ({**row(0, 7, 1), "after": None}, "a row event with op 'c' and no after image"),
    ({**row(0, 7, 1), "op": "u", "after": None}, "a row event with op 'u' and no after image"),
    ({**row(0, 7, 1), "op": "d", "after": None}, "a row event with op 'd' and no before image"),
    (row(1, 7, 1), "a row event of segment 1"),  # another segment's, in partition 0
    ({**row(0, 7, 1), "op": "x"}, "a row event with op 'x'"),
])
def test_a_row_event_the_replayer_cannot_apply_is_set_aside_and_its_part_shows_the_gap(event, reason):
    framer = Framer("p")
    feed_all(framer, 0, [begin(0, 7)])
    with pytest.raises(MalformedMessageError) as refused:
        framer.feed(0, 1, event)
    assert refused.value.reason == reason
    (part,) = feed_all(framer, 0, [end(0, 7, count=1)], first_offset=2)
    assert part.damage == "it holds 0 of its 1 row events; sequence numbers 1 are absent"


NESTING_PLACES = [b'{"op": %b, "source": {}}', b'{"op": "c", "source": %b}', b'{"status": "BEGIN", "segment": %b, "commit_lsn": 1}',
                  b'{"op": "c", "source": {"segment": 0, "commit_lsn": 1, "seq": 1, "gxid": %b}}']


@given(depth=st.integers(1, 1020), place=st.sampled_from(NESTING_PLACES))  # orjson reads 1024 levels
def test_deeply_nested_values_are_named_as_problems_without_recursing(depth, place):
    problem = problem_of(orjson.loads(place % (b"[" * depth + b"]" * depth)))
    assert problem is not None and len(problem) < 200


@given(depth=st.integers(1, 1020), place=st.sampled_from(NESTING_PLACES))
def test_a_deeply_nested_message_is_read_into_a_corrupt_record(depth, place):
    from gpcdc_toolkit.ingest._rows import CORRUPT, to_row

    value = place % (b"[" * depth + b"]" * depth)
    row = to_row("p.changes", 0, 1, 1, None, value)
    assert row[CORRUPT] == value.decode()
