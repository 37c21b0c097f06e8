"""Numbered streams (no servers): a part listed by a commit record that never arrives
changed nothing when the segment's numbers have no gap, and is missing when they do;
a gap anywhere stops the segment's order and is reported once all before it is out."""

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.replay import MissingPartError, Part, Reassembler, ReassemblyError, Record

SKEW = 100


def part(segment, gxid, number, lsn, *, one_phase=False, offset=None):
    return Part(segment, gxid, one_phase, lsn, commit_ts_ms=1000 + lsn, payload=(), offset=offset or lsn,
                number=number)


def record(gxid, segments, lsn):
    return Record(gxid, tuple(segments), commit_ts_ms=1000 + lsn, commit_lsn=lsn, offset=lsn)


def numbered(segments):
    """A reassembler reading numbered partitions from their beginning (their pipeline
    markers say numbering starts there)."""
    r = Reassembler(segments, clock_skew_ms=SKEW)
    for s in range(segments):
        r.add_watermark(s, -1, parts=0)
    return r


def proving_watermark(reassembler, segment, parts, at=10_000):
    """A watermark whose prepared list (empty) is read late enough to prove absences."""
    reassembler.add_watermark(segment, at, prepared=[], prepared_ts_ms=at, parts=parts)


def test_a_listed_part_that_never_comes_changed_nothing_when_no_number_is_missing():
    r = numbered(2)
    r.add_record(record(7, [0, 1], 10))
    r.add_part(part(0, 7, 1, 20))
    assert r.ready() == [] and r.missing() == []  # segment 1 may still be late
    proving_watermark(r, 1, parts=0)  # segment 1 handed out no part at all
    [whole] = r.ready()
    assert whole.gxid == 7 and [p.segment for p in whole.parts] == [0]


def test_a_listed_part_that_never_comes_is_missing_where_every_listed_part_is_decoded():
    """The sandbox's records say so (each participant wrote its gxid marker in its part):
    a part that never comes was lost, though no number is missing (Kafka lost a
    partition's acknowledged tail and capture numbered on from what was left, or a
    segment's clock ran ahead by more than the skew allowed)."""
    r = numbered(2)
    r.add_record(replace(record(7, [0, 1], 10), all_parts_decoded=True))
    r.add_part(part(0, 7, 1, 20))
    proving_watermark(r, 0, parts=1)
    proving_watermark(r, 1, parts=0)
    assert r.ready() == []
    [missing] = r.missing()
    assert (missing.gxid, missing.segment) == (7, 1)


def test_a_part_read_first_after_a_restart_whose_transaction_was_applied_is_refused_as_late():
    """Nothing past where the run before the restart had read was applied with its
    transaction: a part of an applied transaction there went out without it (a replay
    run again after the first refused it would otherwise pass over it)."""
    r = Reassembler(2, clock_skew_ms=SKEW, applied={7})
    r.add_part(part(0, 7, None, 20))  # read before the restart: its transaction was applied with it
    with pytest.raises(ReassemblyError, match="segment 1's part of gxid 7 at offset 40 arrives after the "
                                              "transaction went out without it"):
        r.add_part(replace(part(1, 7, None, 40), new=True))


def test_a_part_read_first_after_a_restart_waits_for_a_record_read_before_it_and_is_refused_once_the_target_says():
    """Past the window a run begins with, a part of a transaction applied in a run before
    waits for a record read before the restart; the coordinator's watermark names that
    record lost, and the target, asked, says the transaction went out without the part."""
    r = numbered(2)
    r.add_part(replace(part(1, 7, 1, 40), new=True))  # past where the run before the restart had read
    r.add_part(part(1, 8, 2, 50, one_phase=True))
    r.add_watermark(-1, 10_000)
    assert r.ready() == []  # nothing after it goes out: its order is not proven
    [missing] = r.missing()
    assert missing.record_never_came and (missing.gxid, missing.present) == (7, (1,)), missing
    assert str(r.went_out_without(7)).startswith("segment 1's part of gxid 7 at offset 40 arrives after the "
                                                 "transaction went out without it")


def test_a_part_arriving_once_its_handed_out_place_is_forgotten_is_named_by_its_record_until_the_target_is_asked():
    """Past the positions kept of transactions handed out without a part, the late part
    waits for a record, as if unrecorded: only the target can say it went out without
    it (the replay asks it before calling the record lost)."""
    r = numbered(2)
    r.add_record(record(7, [0, 1], 10))
    r.add_part(part(0, 7, 1, 20))
    proving_watermark(r, 1, parts=0)
    assert [w.gxid for w in r.ready()] == [7]
    for i in range(12_000):  # each handed out without its part on segment 1, which changed nothing
        r.add_record(record(100 + i, [0, 1], 100 + i))
        r.add_part(part(0, 100 + i, 2 + i, 20_000 + i))
        proving_watermark(r, 1, parts=0, at=20_000 + i)
        r.ready()
    assert r.pending == 0
    r.add_part(part(1, 7, 1, 40_000))
    r.add_watermark(-1, 100_000)
    [missing] = r.missing()
    assert missing.record_never_came and missing.gxid == 7, missing
    assert "segment 1's part of gxid 7 at offset 40000 arrives after the transaction went out without it" in str(
        r.went_out_without(7))


def test_a_part_arriving_long_after_its_transaction_went_out_without_it_is_refused_as_such():
    """However many transactions went out since: the positions of those handed out without
    a part are kept past the forgetting of the others."""
    r = numbered(2)
    r.add_record(record(7, [0, 1], 10))
    r.add_part(part(0, 7, 1, 20))
    proving_watermark(r, 1, parts=0)
    assert [w.gxid for w in r.ready()] == [7]
    for i in range(12_000):
        r.add_record(record(100 + i, [0], 100 + i))
        r.add_part(part(0, 100 + i, 2 + i, 20_000 + i))
        r.ready()
    assert r.pending == 0
    with pytest.raises(ReassemblyError, match="segment 1's part of gxid 7 at offset 40000 arrives after the "
                                              "transaction went out without it"):
        r.add_part(part(1, 7, 1, 40_000))


def test_a_listed_part_lost_from_the_stream_is_missing_by_its_gap():
    r = numbered(2)
    r.add_record(record(7, [0, 1], 10))
    r.add_part(part(0, 7, 1, 20))
    r.add_part(part(1, 8, 2, 30, one_phase=True))  # number 1 of segment 1 never came
    proving_watermark(r, 1, parts=2)
    assert r.ready() == []
    [missing] = r.missing()
    assert (missing.gxid, missing.segment, missing.damage, missing.gap) == (7, 1, None, (1, 1))

    message = str(MissingPartError(missing, Topics("p"), read_to=30))
    assert "segment 1's part is missing" in message and "parts numbered 1 never arrived" in message


def test_a_gap_is_named_without_waiting_for_records_written_after_it():
    """A stream that goes on keeps bringing records whose parts have not arrived yet: only
    those written before the gap was seen may be the lost part's."""
    r = numbered(1)
    r.add_record(record(6, [0], 5))
    r.add_record(record(7, [0], 10))  # the two do not conflict: 7 committed first on segment 0
    r.add_part(part(0, 6, 2, 30))  # number 1 never came: 6 is held behind the gap
    r.add_record(record(9, [0], 5_000))  # its part is still to come
    proving_watermark(r, 0, parts=2, at=2_000)  # late enough for gxid 7, not for gxid 9
    assert r.ready() == []
    [missing] = r.missing()
    assert (missing.gxid, missing.segment, missing.gap) == (7, 0, (1, 1))


def test_a_gap_a_watermark_showed_is_read_again_at_every_resume():
    """Resumed past it, the replay would count on from the watermark's number: the part
    lost before it would look like one that changed nothing. It is read again from the
    number before it, which shows the gap even where retention removed all before."""
    r = numbered(1)
    r.add_part(part(0, 5, 1, 20, one_phase=True))
    assert [w.gxid for w in r.ready()] == [5]
    assert r.resume_offsets()[0] == 20, "the latest number read"
    r.add_watermark(0, 5_000, parts=2, at=30)  # part 2 never came
    r.add_watermark(0, 6_000, parts=2, at=40)
    assert r.resume_offsets()[0] == 20


def test_a_gap_a_part_showed_is_read_again_from_the_number_before_it():
    r = numbered(1)
    r.add_part(part(0, 5, 1, 20, one_phase=True))
    r.add_part(part(0, 6, 3, 30, one_phase=True))  # part 2 never came
    r.add_watermark(0, 5_000, parts=3, at=40)
    assert [w.gxid for w in r.ready()] == [5]
    assert r.resume_offsets()[0] == 20


def test_a_gap_that_what_came_before_it_waits_behind_is_reported_all_the_same():
    """Coordinator order 7, 15, 4. Segment 1 committed 15, then the one-phase 2 (after
    15, so it waits for gxid 15's record), then gxid 4's part, lost, then gxid 7's.
    Record 7 waits on its part after the gap; record 15 and part 2 behind it never pass:
    the gap is reported without them."""
    r = numbered(2)
    for gxid, lsn in ((7, 1), (15, 2), (4, 3)):
        r.add_record(record(gxid, [0, 1], lsn))
    for number, gxid in enumerate([7, 15, 4], start=1):
        r.add_part(part(0, gxid, number, 10 * number))
    r.add_part(part(1, 15, 1, 10))
    r.add_part(part(1, 2, 2, 20, one_phase=True))
    r.add_part(part(1, 7, 4, 40))  # number 3, gxid 4's part, never came
    proving_watermark(r, 0, parts=3)
    proving_watermark(r, 1, parts=4)
    assert r.ready() == []
    [missing] = r.missing()
    assert (missing.gxid, missing.segment) == (4, 1)


def test_a_transaction_whose_every_part_changed_nothing_goes_out_empty():
    r = numbered(2)
    r.add_record(record(7, [0, 1], 10))
    proving_watermark(r, 0, parts=0)
    proving_watermark(r, 1, parts=0)
    [whole] = r.ready()
    assert whole.gxid == 7 and whole.parts == ()


def test_a_lost_last_part_shows_against_the_watermarks_count():
    r = numbered(1)
    r.add_part(part(0, None, 1, 10, one_phase=True))
    r.add_record(record(7, [0], 15))
    proving_watermark(r, 0, parts=2)  # part 2 (gxid 7's) was handed out before it, and is not here
    assert [w.gxid for w in r.ready()] == [None]
    [missing] = r.missing()
    assert (missing.gxid, missing.segment) == (7, 0)


def test_a_lost_one_phase_part_stops_its_segment_and_is_reported_after_what_came_before():
    r = numbered(1)
    r.add_part(part(0, None, 1, 10, one_phase=True))
    r.add_part(part(0, None, 3, 30, one_phase=True))  # number 2 never came
    assert [p.commit_lsn for w in r.ready() for p in w.parts] == [10]
    [lost] = r.missing()
    assert lost.gxid is None and lost.segment == 0 and "numbered 2 never arrived" in lost.damage
    assert r.ready() == []  # nothing after the gap goes out


def test_numbers_that_go_back_are_refused():
    r = Reassembler(1)
    r.add_part(part(0, None, 5, 10, one_phase=True))
    with pytest.raises(ReassemblyError, match="numbering goes back"):
        r.add_part(part(0, None, 5, 20, one_phase=True))


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=12), st.data())
def test_dropping_any_numbered_part_is_caught_and_nothing_after_it_goes_out(spec, data):
    """A segment's numbered parts, one-phase or of two-segment transactions whose other
    part may have changed nothing; one part, if any, is lost."""
    parts, records, others, lsn = [], [], [], 0
    for gxid, (two_phase, other_empty) in enumerate(spec, start=1):
        lsn += 10
        if two_phase:
            records.append(record(gxid, [0, 1], lsn))
            parts.append(part(0, gxid, len(parts) + 1, lsn + 1))
            if not other_empty:
                others.append(part(1, gxid, len(others) + 1, lsn + 2))
        else:
            parts.append(part(0, gxid, len(parts) + 1, lsn + 1, one_phase=True))
    lost = data.draw(st.one_of(st.none(), st.integers(0, len(parts) - 1)))
    r = numbered(2)
    for rec in records:
        r.add_record(rec)
    for p in others:
        r.add_part(p)
    for i, p in enumerate(parts):
        if i != lost:
            r.add_part(p)
    proving_watermark(r, 0, parts=len(parts))
    proving_watermark(r, 1, parts=len(others))  # the rest of segment 1's parts changed nothing
    out = r.ready()
    handed = [w.gxid for w in out]
    if lost is None:
        assert handed == [p.gxid for p in parts] and r.missing() == []
    else:
        assert handed == [p.gxid for p in parts[:lost]]  # the source order, up to the loss
        assert len(r.missing()) == 1 and r.missing()[0].segment == 0
