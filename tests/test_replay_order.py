"""The replay order, tested on simulated source histories (no servers).

A small simulator runs distributed transactions over segments the way the source does:
each takes row locks on the segments it writes, a two-phase one prepares, writes its
commit record and then commits its parts one segment at a time (in any order, at any
later moment), releasing each segment's locks as it commits there; a one-phase one
commits on its only segment. That yields per-segment logs whose orders disagree with
each other and with the coordinator, as they do for real. The reassembler is then fed
those logs and the records in many random interleavings, and must hand out every
transaction once, whole, with every pair that shares a row in the order its segment
committed them.
"""

import random
from itertools import combinations

import pytest

from gpcdc_toolkit.replay import Part, Reassembler, ReassemblyError, Record, resume_point


def simulate(rng, segments=3, transactions=30, keys=6):
    """Returns (segment logs [[gxid]], coordinator order [gxid], writes {gxid: {(seg, key)}})."""
    writes = {}
    for gxid in range(1, transactions + 1):
        touched = rng.sample(range(segments), rng.choice([1, 1, 2, 3][: segments + 1]))
        writes[gxid] = {(s, rng.randrange(keys)) for s in touched for _ in range(rng.randint(1, 2))}
    locks = {}  # (segment, key) -> gxid
    state = {g: "waiting" for g in writes}
    pending_commits = {}
    logs = [[] for _ in range(segments)]
    coordinator = []

    def segs(g):
        return sorted({s for s, _ in writes[g]})

    while any(v != "done" for v in state.values()):
        actions = []
        for g, st in state.items():
            if st == "waiting" and all(locks.get(w) in (None, g) for w in writes[g]):
                actions.append(("lock", g))
            elif st == "locked":
                actions.append(("commit", g))
            elif st == "recorded":
                actions += [("part", g, s) for s in pending_commits[g]]
        action = rng.choice(actions)
        g = action[1]
        if action[0] == "lock":
            for w in writes[g]:
                locks[w] = g
            state[g] = "locked"
        elif action[0] == "commit":
            if len(segs(g)) == 1:
                logs[segs(g)[0]].append(g)
                for w in writes[g]:
                    del locks[w]
                state[g] = "done"
            else:
                coordinator.append(g)
                pending_commits[g] = segs(g)
                state[g] = "recorded"
        else:
            s = action[2]
            logs[s].append(g)
            for w in [w for w in writes[g] if w[0] == s]:
                del locks[w]
            pending_commits[g] = [x for x in pending_commits[g] if x != s]
            if not pending_commits[g]:
                state[g] = "done"
    return logs, coordinator, writes


def feed_in_random_interleaving(rng, logs, coordinator, writes, duplicates=False, watermarks=False, dropped=None):
    """The logs and the records fed in a random interleaving, whatever is ready handed
    out as it goes. With ``watermarks``, times: a record's commit at 10 ms per place in
    the coordinator's order, each part of it committed on its segment a little later;
    the coordinator's watermarks after some of the records, each saying what it does
    (every record of a commit before it has come). ``dropped``: a record never fed, and
    no watermark right after it, so that later records may come before one proves it lost."""
    segs_of = {g: sorted({s for s, _ in w}) for g, w in writes.items()}
    record_ts = {g: 10 * i for i, g in enumerate(coordinator)}
    queues = [[("part", s, g) for g in log] for s, log in enumerate(logs)] + [[("record", g) for g in coordinator]]
    if duplicates:  # a capture restart sends a tail of a segment's log again
        for q in queues[:-1]:
            if q:
                q.extend(q[rng.randrange(len(q)):])
    r = Reassembler(len(logs), clock_skew_ms=0)
    out = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        event = q.pop(0)
        if event[0] == "part":
            _, s, g = event
            two_phase = len(segs_of[g]) > 1
            # The commit LSN is the position in the segment's log (duplicates repeat it).
            position = logs[s].index(g)
            r.add_part(Part(s, g, one_phase=not two_phase, commit_lsn=position + 1,
                            commit_ts_ms=record_ts[g] + rng.randint(0, 5) if watermarks and two_phase else 0))
        else:
            g = event[1]
            if g != dropped:
                r.add_record(Record(g, tuple(segs_of[g]), commit_ts_ms=record_ts[g]))
            if watermarks and g != dropped and rng.random() < 0.5:
                r.add_watermark(-1, record_ts[g] + 9)
        out += r.ready()
    out += r.ready()
    return out, r


def check(out, logs, writes):
    order = [w.gxid for w in out]
    assert sorted(order) == sorted(writes), "every transaction exactly once"
    position = {g: i for i, g in enumerate(order)}
    for w in out:
        assert sorted(p.segment for p in w.parts) == sorted({s for s, _ in writes[w.gxid]}), "whole"
    for a, b in combinations(writes, 2):
        shared = {s for (s, k) in writes[a] & writes[b]}
        for s in shared:
            first, second = (a, b) if logs[s].index(a) < logs[s].index(b) else (b, a)
            assert position[first] < position[second], (
                f"gxids {first} and {second} share a row on segment {s}, which committed {first} first")


@pytest.mark.parametrize("seed", range(200))
def test_conflicting_writes_keep_the_source_order(seed):
    rng = random.Random(seed)
    logs, coordinator, writes = simulate(rng, segments=rng.choice([2, 3, 4]), transactions=rng.randint(5, 40),
                                         keys=rng.choice([2, 4, 8]))
    for _ in range(5):
        out, r = feed_in_random_interleaving(rng, logs, coordinator, writes, duplicates=rng.random() < 0.3)
        check(out, logs, writes)
        assert r.pending == 0


def test_the_simulator_produces_disagreeing_segment_orders():
    """The property tests above only mean something if segments really disagree."""
    disagreements = 0
    for seed in range(50):
        logs, coordinator, writes = simulate(random.Random(seed), segments=3, transactions=30, keys=8)
        rank = {g: i for i, g in enumerate(coordinator)}
        for log in logs:
            two_phase = [g for g in log if g in rank]
            disagreements += sum(rank[a] > rank[b] for a, b in zip(two_phase, two_phase[1:]))
    assert disagreements > 20


def test_two_segments_commit_two_transactions_in_opposite_orders():
    r = Reassembler(2)
    # Segment 0 committed gxid 2 before 1; segment 1 the other way; the coordinator 1 then 2.
    r.add_part(Part(0, 2, False, 10))
    r.add_part(Part(0, 1, False, 11))
    r.add_part(Part(1, 1, False, 10))
    r.add_part(Part(1, 2, False, 11))
    assert r.ready() == []  # no record yet: nothing is whole
    r.add_record(Record(1, (0, 1)))
    r.add_record(Record(2, (0, 1)))
    assert [w.gxid for w in r.ready()] == [1, 2]


def test_a_one_phase_transaction_follows_its_anchor():
    r = Reassembler(2)
    r.add_part(Part(0, 5, False, 1))  # two-phase 5 on segment 0, then one-phase 6 there
    r.add_part(Part(0, 6, True, 2))
    r.add_part(Part(1, 7, True, 1))  # one-phase 7 on segment 1, before anything there
    assert [w.gxid for w in r.ready()] == [7]  # 6 waits: its anchor's record is unknown
    r.add_record(Record(5, (0, 1)))
    assert r.ready() == []  # 5 waits for its part on segment 1, and 6 waits for 5
    r.add_part(Part(1, 5, False, 2))
    assert [w.gxid for w in r.ready()] == [5, 6]


def test_a_part_is_missing_only_when_its_segment_no_longer_holds_it_prepared_past_the_record():
    r = Reassembler(2, clock_skew_ms=100)
    r.add_record(Record(9, (0, 1), commit_ts_ms=1_000))
    r.add_part(Part(0, 9, False, 1))
    r.add_watermark(1, 1_050, prepared=[], prepared_ts_ms=1_040)
    assert r.ready() == [] and r.missing() == []  # late, not missing
    r.add_watermark(1, 9_000)
    assert r.missing() == [], "a watermark that does not say what is prepared proves nothing"
    r.add_watermark(1, 9_000, prepared=[9], prepared_ts_ms=8_990)
    assert r.missing() == [] and r.in_doubt() == [(9, 1)], "still prepared there: in doubt, not missing"
    r.add_watermark(1, 9_500, prepared=[3], prepared_ts_ms=9_490)
    [missing] = r.missing()
    assert (missing.gxid, missing.segment, missing.present, missing.damage) == (9, 1, (0,), None)
    assert r.ready() == [], "nothing partial is handed out"


def test_a_late_part_that_arrives_after_a_long_doubt_is_applied():
    r = Reassembler(2, clock_skew_ms=100)
    r.add_record(Record(9, (0, 1), commit_ts_ms=1_000))
    r.add_part(Part(0, 9, False, 1))
    r.add_watermark(1, 7_000, prepared=[9], prepared_ts_ms=6_990)  # a slow segment: 6 s later, still prepared
    assert r.missing() == [] and r.ready() == []
    r.add_part(Part(1, 9, False, 1))
    assert [w.gxid for w in r.ready()] == [9] and r.missing() == []


def test_a_damaged_part_stops_the_order_where_it_stands():
    r = Reassembler(2)
    r.add_record(Record(1, (0, 1), offset=3))
    r.add_record(Record(2, (0, 1), offset=4))
    r.add_part(Part(0, 1, False, 1, offset=10))
    r.add_part(Part(1, 1, False, 1, offset=20))
    r.add_part(Part(0, 2, False, 2, offset=11, damage="it holds 7 of its 9 row events"))
    r.add_part(Part(1, 2, False, 2, offset=21))
    r.add_part(Part(1, 3, True, 3, offset=22))  # one-phase after 2: must wait for it
    assert [w.gxid for w in r.ready()] == [1]
    [damaged] = r.missing()
    assert (damaged.gxid, damaged.segment, damaged.damage) == (2, 0, "it holds 7 of its 9 row events")
    assert dict(damaged.offsets) == {-1: 4, 0: 11, 1: 21}
    assert r.ready() == []


def test_a_damaged_one_phase_part_is_not_handed_out():
    r = Reassembler(1)
    r.add_part(Part(0, 1, True, 1))
    r.add_part(Part(0, 2, True, 2, damage="sequence numbers 3 are absent"))
    r.add_part(Part(0, 3, True, 3))
    assert [w.gxid for w in r.ready()] == [1] and r.missing()[0].gxid == 2


def test_contradictions_are_refused():
    r = Reassembler(3)
    r.add_record(Record(4, (0, 1)))
    with pytest.raises(ReassemblyError, match="part on segment 2, but its commit record lists segments \\[0, 1\\]"):
        r.add_part(Part(2, 4, False, 1))


def test_a_record_naming_a_segment_beyond_those_read_stops_the_replay_as_a_cluster_change():
    from gpcdc_toolkit.errors import ClusterChangedError

    r = Reassembler(2)
    with pytest.raises(ClusterChangedError,
                       match=r"gxid 7 lists segments \[2, 3\], beyond segments 0 to 1, which this replay reads") as raised:
        r.add_record(Record(7, (0, 2, 3)))
    assert raised.value.exit_code == 5 and "run the replay again" in str(raised.value)


def partitions_of(logs, coordinator, writes):
    """Each partition's messages as (offset, Part | Record); the coordinator is -1."""
    segs_of = {g: tuple(sorted({s for s, _ in w})) for g, w in writes.items()}
    out = {s: [(i, Part(s, g, one_phase=len(segs_of[g]) == 1, commit_lsn=i + 1, offset=i)) for i, g in enumerate(log)]
           for s, log in enumerate(logs)}
    out[-1] = [(i, Record(g, segs_of[g], commit_lsn=i + 1, offset=i)) for i, g in enumerate(coordinator)]
    return out


def replay_from(rng, partitions, start, reassembler, stop_after=None):
    """Feed each partition from ``start`` in a random interleaving; returns what was handed
    out, and the next offset of each partition when it stopped (after ``stop_after`` events)."""
    cursor = dict(start)
    out, fed = [], 0
    while stop_after is None or fed < stop_after:
        open_ = [p for p, messages in partitions.items() if cursor[p] < len(messages)]
        if not open_:
            break
        p = rng.choice(open_)
        _, item = partitions[p][cursor[p]]
        cursor[p] += 1
        fed += 1
        (reassembler.add_record if p == -1 else reassembler.add_part)(item)
        out += reassembler.ready()
    return out, cursor


@pytest.mark.parametrize("seed", range(100))
def test_a_restart_from_the_resume_point_applies_everything_once_in_order(seed):
    """Stop at a random moment with a random share of the handed-out transactions applied,
    resume from resume_point knowing what was applied: the two runs together hand out
    every transaction once, in an order true to the source."""
    rng = random.Random(1000 + seed)
    logs, coordinator, writes = simulate(rng, segments=rng.choice([2, 3]), transactions=rng.randint(10, 40), keys=4)
    partitions = partitions_of(logs, coordinator, writes)
    first = Reassembler(len(logs))
    total = sum(len(m) for m in partitions.values())
    handed, read = replay_from(rng, partitions, {p: 0 for p in partitions}, first, stop_after=rng.randint(0, total))
    applied = handed[:rng.randint(0, len(handed))]
    resume = resume_point(read, first, handed[len(applied):])
    assert all(resume[p] <= read[p] for p in partitions)

    second = Reassembler(len(logs), applied={w.gxid for w in applied})
    rest, _ = replay_from(rng, partitions, resume, second)
    check(applied + rest, logs, writes)
    assert second.pending == 0


def test_legacy_parts_go_segment_by_segment_with_ddl_placed_by_time():
    from gpcdc_toolkit.replay import SegmentOrder

    order = SegmentOrder(2, clock_skew_ms=100)

    def part(segment, lsn, ts):
        return Part(segment, None, one_phase=False, commit_lsn=lsn, commit_ts_ms=ts, offset=lsn)

    order.add_part(part(0, 1, 1000))
    order.add_part(part(1, 1, 1500))
    assert order.ready() == []  # a DDL committed before them may still come
    order.add_watermark(-1, 1500)
    assert [w.parts[0].segment for w in order.ready()] == [0]  # 1500 is within the skew allowance
    order.add_record(Record(7, (), commit_ts_ms=2000, ddl=("ALTER TABLE t ADD c int",), commit_lsn=1, offset=0))
    order.add_part(part(0, 2, 2500))  # after the DDL: must wait for it
    order.add_part(part(0, 2, 2500))  # a resend
    assert [(w.parts[0].segment, w.parts[0].commit_lsn) for w in order.ready()] == [(1, 1)]
    # Segment 0 has shown a part after the DDL's time; segment 1 has not yet shown that
    # it committed nothing else before it.
    assert order.ready() == [] and order.pending == 2
    order.add_watermark(1, 2050)
    assert order.ready() == []  # within the skew allowance
    order.add_watermark(1, 2100)
    out = order.ready()
    assert [w.gxid for w in out] == [7] and out[0].record.ddl
    order.add_watermark(-1, 2600)  # no other DDL before the held part
    assert [w.parts[0].commit_lsn for w in order.ready()] == [2]
    assert order.pending == 0 and order.missing() == []


def test_a_part_lost_and_sent_again_after_a_later_one_stops_the_order():
    r = Reassembler(1)
    r.add_part(Part(0, 1, True, 10))
    r.add_part(Part(0, 3, True, 30))
    r.add_part(Part(0, 1, True, 10))  # a resend of one seen: dropped
    with pytest.raises(ReassemblyError, match="commit LSN 20.*never seen before: a message was lost and sent again"):
        r.add_part(Part(0, 2, True, 20))  # never seen, yet below one seen: its place is gone


def test_a_commit_record_lost_and_sent_again_stops_the_order():
    r = Reassembler(2)
    r.add_record(Record(1, (0, 1), commit_lsn=10))
    r.add_record(Record(3, (0, 1), commit_lsn=30))
    r.add_record(Record(1, (0, 1), commit_lsn=10))
    with pytest.raises(ReassemblyError, match="gxid 2 .*never seen before"):
        r.add_record(Record(2, (0, 1), commit_lsn=20))


def test_a_lost_segment_makes_the_first_transaction_it_cannot_complete_missing_and_nothing_after():
    r = Reassembler(2, clock_skew_ms=100)
    r.add_record(Record(1, (0, 1), commit_ts_ms=1_000, offset=3))
    r.add_record(Record(2, (0, 1), commit_ts_ms=2_000, offset=4))
    r.add_part(Part(0, 1, False, 10, offset=10))
    r.add_part(Part(1, 1, False, 10, offset=20))
    r.add_part(Part(0, 2, False, 11, offset=11))
    r.add_part(Part(0, 3, True, 12, offset=12))  # one-phase after 2 on segment 0: waits for it
    assert [w.gxid for w in r.ready()] == [1] and r.missing() == []  # gxid 2's part on 1: late, not missing
    r.add_watermark(1, -1, lost="segment 1 is on timeline 2, not 1", lost_at=21)
    [missing] = r.missing()
    assert (missing.gxid, missing.segment, missing.present, missing.damage) == (2, 1, (0,), None)
    assert missing.lost == "segment 1 is lost to the pipeline (segment 1 is on timeline 2, not 1)"
    assert dict(missing.offsets) == {-1: 4, 0: 11}
    assert r.ready() == [] and r.resume_offsets()[1] == 21, "the mark is read again after a restart"


def test_a_lost_segment_does_not_stop_what_it_was_not_part_of():
    r = Reassembler(2)
    r.add_watermark(1, -1, lost="slot s is missing", lost_at=5)
    r.add_record(Record(1, (0,), commit_ts_ms=1_000))
    r.add_part(Part(0, 1, False, 10))
    r.add_part(Part(0, 2, True, 11))
    assert [w.gxid for w in r.ready()] == [1, 2] and r.missing() == []


def test_with_the_coordinator_lost_a_part_whose_record_never_came_is_missing():
    r = Reassembler(2)
    r.add_record(Record(1, (0, 1)))
    r.add_part(Part(0, 1, False, 10, offset=10))
    r.add_part(Part(1, 1, False, 10, offset=20))
    r.add_part(Part(1, 2, False, 11, offset=21))
    assert [w.gxid for w in r.ready()] == [1] and r.missing() == []  # gxid 2's record may still come
    r.add_watermark(-1, -1, lost="slot s on coordinator was invalidated", lost_at=7)
    [missing] = r.missing()
    assert (missing.gxid, missing.segment, missing.present) == (2, 1, (1,))
    assert missing.lost.startswith("the coordinator is lost to the pipeline (slot s on coordinator was invalidated)")
    assert r.resume_offsets()[-1] == 7


def test_with_the_coordinator_lost_a_record_held_behind_a_part_whose_record_never_came_names_that_part():
    r = Reassembler(2)
    r.add_part(Part(1, 2, False, 10, offset=20))  # its record, before gxid 3's or after it, never comes
    r.add_record(Record(3, (0, 1)))
    r.add_part(Part(0, 3, False, 10, offset=10))
    r.add_part(Part(1, 3, False, 11, offset=21))
    assert r.ready() == [] and r.missing() == []  # gxid 3 may have to follow gxid 2, whose record may still come
    r.add_watermark(-1, -1, lost="slot s on coordinator was invalidated", lost_at=7)
    [missing] = r.missing()
    assert (missing.gxid, missing.segment, missing.present) == (2, 1, (1,)) and r.ready() == []


def test_a_record_after_a_part_whose_record_comes_later_waits_for_it_then_goes_first():
    """Two transactions that do not conflict: segment 0 commits 1 then 2, while the
    coordinator wrote 2's record first."""
    r = Reassembler(1)
    r.add_part(Part(0, 1, False, 10, offset=0))
    r.add_part(Part(0, 2, False, 11, offset=1))
    r.add_record(Record(2, (0,)))
    assert r.ready() == []  # gxid 1's record, still to come, may have been written first
    r.add_record(Record(1, (0,)))
    assert [w.gxid for w in r.ready()] == [2, 1] and r.pending == 0


def test_a_record_whose_part_changed_nothing_waits_for_a_part_there_whose_record_has_not_come():
    """Its DDL, applied from the record, may have waited for that part's locks: the other
    transaction's record came first, or was lost."""
    r = Reassembler(1, clock_skew_ms=100)
    r.add_part(Part(0, 1, False, 10, commit_ts_ms=1_000, offset=0, number=1))
    r.add_record(Record(2, (0,), commit_ts_ms=1_500, ddl=("ALTER TABLE t DROP COLUMN c",)))
    r.add_watermark(0, 2_000, prepared=[], prepared_ts_ms=1_700)  # gxid 2 changed no row on segment 0
    assert r.ready() == [] and r.missing() == []
    r.add_watermark(-1, 1_000 + 100 + 2)  # the coordinator's watermark passes gxid 1's commit
    [missing] = r.missing()
    assert (missing.gxid, missing.segment) == (1, 0) and r.ready() == []


def test_a_record_whose_part_changed_nothing_goes_out_once_the_waiting_parts_record_comes():
    r = Reassembler(1, clock_skew_ms=100)
    r.add_part(Part(0, 1, False, 10, commit_ts_ms=1_000, offset=0, number=1))
    r.add_record(Record(2, (0,), commit_ts_ms=1_500, ddl=("ALTER TABLE t ADD COLUMN c int",)))
    r.add_watermark(0, 2_000, prepared=[], prepared_ts_ms=1_700)
    r.add_record(Record(1, (0,), commit_ts_ms=1_400))  # the two did not conflict: 1's record came later
    assert [w.gxid for w in r.ready()] == [2, 1] and r.missing() == [] and r.pending == 0


def test_a_part_arriving_after_its_transaction_went_out_without_it_stops_the_order():
    r = Reassembler(2, clock_skew_ms=100)
    r.add_part(Part(0, 1, False, 10, commit_ts_ms=1_000, offset=0, number=1))
    r.add_part(Part(1, 7, True, 10, commit_ts_ms=900, offset=0, number=1))
    r.add_record(Record(1, (0, 1), commit_ts_ms=1_000))
    r.add_watermark(1, 2_000, prepared=[], prepared_ts_ms=1_700)  # proves gxid 1 changed nothing on segment 1
    assert [w.gxid for w in r.ready()] == [7, 1]
    with pytest.raises(ReassemblyError, match="segment 1's part of gxid 1 at offset 1 arrives after the transaction "
                                              "went out without it"):
        r.add_part(Part(1, 1, False, 11, commit_ts_ms=1_000, offset=1, number=2))


def test_a_one_phase_part_after_a_lost_part_waits_at_the_gap_in_the_numbers():
    """The lost part is not in its segment's log, so the one-phase part after it has the
    part before the loss as its anchor. Only the gap in the numbers holds it: it may
    change what the lost part wrote (here, delete the row gxid 2 inserted)."""
    r = Reassembler(1, clock_skew_ms=100)
    r.add_record(Record(1, (0,), commit_ts_ms=990))
    r.add_record(Record(2, (0,), commit_ts_ms=1_100))
    r.add_part(Part(0, 1, False, 10, commit_ts_ms=1_000, offset=0, number=1))
    # gxid 2's part, number 2 at offset 1, was lost on its way
    r.add_part(Part(0, 3, True, 12, commit_ts_ms=1_200, offset=2, number=3))
    assert [w.gxid for w in r.ready()] == [1] and r.missing() == []  # gxid 2's part may be late
    r.add_watermark(0, 2_000, prepared=[], prepared_ts_ms=1_300, parts=3)
    [missing] = r.missing()
    assert (missing.gxid, missing.segment, missing.gap) == (2, 0, (2, 2)) and r.ready() == []


@pytest.mark.parametrize("seed", range(200))
def test_a_lost_part_holds_everything_after_it_on_its_segment_and_is_named(seed):
    """A random two-phase part dropped from a numbered stream: the replay stops at its
    transaction, and nothing that shares a row with it and came after it there went out."""
    rng = random.Random(seed)
    logs, coordinator, writes = simulate(rng, segments=rng.choice([2, 3]), transactions=rng.randint(5, 40), keys=3)
    if not coordinator:
        return
    victim = rng.choice(coordinator)
    lost_on = rng.choice(sorted({s for s, _ in writes[victim]}))
    record_ts = {g: 10 * (i + 1) for i, g in enumerate(coordinator)}
    queues = [[("part", s, g) for g in log if (s, g) != (lost_on, victim)] for s, log in enumerate(logs)]
    queues.append([("record", g) for g in coordinator])
    # Commit times: a part after its record, and after the part before it in its log.
    commit_ts = {}
    for s, log in enumerate(logs):
        last = 0
        for g in log:
            last = commit_ts[s, g] = max(last, record_ts.get(g, 0)) + 1
    r = Reassembler(len(logs), clock_skew_ms=0)
    for s in range(len(logs)):
        r.add_watermark(s, 0, parts=0)  # each partition's pipeline marker: no part before it
    out = []
    while any(queues):
        event = rng.choice([q for q in queues if q]).pop(0)
        if event[0] == "part":
            _, s, g = event
            two_phase = g in record_ts
            r.add_part(Part(s, g, one_phase=not two_phase, commit_lsn=logs[s].index(g) + 1,
                            commit_ts_ms=commit_ts[s, g], offset=logs[s].index(g), number=logs[s].index(g) + 1))
        else:
            r.add_record(Record(event[1], tuple(sorted({s for s, _ in writes[event[1]]})),
                                commit_ts_ms=record_ts[event[1]]))
        out += r.ready()
    end = 10 * (len(coordinator) + 2)
    for s, log in enumerate(logs):
        r.add_watermark(s, end, prepared=[], prepared_ts_ms=end, parts=len(log))
    out += r.ready()
    assert [(m.gxid, m.segment) for m in r.missing()] == [(victim, lost_on)]
    handed = [w.gxid for w in out]
    assert victim not in handed
    for g in handed:
        assert not any(logs[lost_on].index(victim) < logs[lost_on].index(g)
                       for s, _ in writes[victim] & writes[g] if s == lost_on), (
            f"gxid {g} went out, yet it follows gxid {victim}, whose part on segment {lost_on} was lost, on a row "
            "they share there")


def _repair(segment=1, number=1, xmax=3, running=(), coordinator_lsn=100, offset=30):
    from gpcdc_toolkit.protocol import DistributedSnapshot
    from gpcdc_toolkit.replay._order import RepairMark

    return RepairMark(segment, number, DistributedSnapshot(xmax, frozenset(running)), coordinator_lsn, offset)


def test_a_repaired_segment_hands_out_what_its_copy_covers_then_the_copy_then_its_new_stream():
    r = Reassembler(2, clock_skew_ms=100)
    r.add_record(Record(1, (0, 1), commit_ts_ms=1_000, commit_lsn=10, offset=3))
    r.add_part(Part(0, 1, False, 10, offset=10))
    r.add_part(Part(1, 1, False, 10, offset=20))  # acknowledged before the loss
    r.add_record(Record(2, (0, 1), commit_ts_ms=2_000, commit_lsn=11, offset=4))
    r.add_part(Part(0, 2, False, 11, offset=11))  # its part on 1 was lost
    r.add_watermark(1, -1, lost="segment 1 is on timeline 2, not 1", lost_at=29)
    r.add_record(Record(3, (0, 1), commit_ts_ms=3_000, commit_lsn=200, offset=5))  # after the cut (xmax 3)
    r.add_part(Part(0, 3, False, 13, offset=12))
    assert [w.gxid for w in r.ready()] == [1] and [m.gxid for m in r.missing()] == [2]
    r.add_repair(_repair())
    r.add_part(Part(1, 4, True, 50, offset=31))  # a one-phase part of the new stream: after the copy
    out = r.ready()
    assert [(w.gxid, w.covered, w.reconcile is not None) for w in out] == [
        (2, (1,), False), (None, (), True), (4, (), False)]
    assert r.missing() == [] and r.in_doubt() == [(3, 1)]  # gxid 3's part on 1 comes from the new slot
    r.add_part(Part(1, 3, False, 51, offset=32))
    assert [(w.gxid, w.covered) for w in r.ready()] == [(3, ())]


def test_after_the_copy_the_repaired_segments_one_phase_part_goes_before_a_later_record_that_follows_it_there():
    """Found by the random-cut property test: the record at the head when the copy went
    out was handed out in the same pass, ahead of a one-phase part that the segment
    committed before its part."""
    r = Reassembler(2)
    r.add_repair(_repair(xmax=3, offset=1))
    r.add_record(Record(2, (0, 1), commit_ts_ms=1_000, commit_lsn=3, offset=4))  # seen by the cut
    r.add_part(Part(0, 2, False, 11, offset=11))
    r.add_part(Part(1, 5, True, 50, offset=2))  # after the cut, committed on 1 before gxid 6's part there
    r.add_record(Record(6, (0, 1), commit_ts_ms=2_000, commit_lsn=200, offset=5))
    r.add_part(Part(0, 6, False, 12, offset=12))
    r.add_part(Part(1, 6, False, 51, offset=3))
    assert [(w.gxid, w.reconcile is not None) for w in r.ready()] == [(2, False), (None, True), (5, False), (6, False)]


def test_the_copy_waits_until_the_coordinator_is_past_the_cut_when_no_record_is_waiting():
    r = Reassembler(2)
    r.add_watermark(1, -1, lost="slot s is missing", lost_at=29)
    r.add_repair(_repair(xmax=3, coordinator_lsn=5))
    r.add_part(Part(1, 4, True, 50, offset=31))  # the new stream's: after the copy
    r.add_watermark(-1, 1_000, resolved_lsn=4)
    assert r.ready() == []  # a record the cut saw may still come
    r.add_record(Record(2, (0, 1), commit_ts_ms=1_000, commit_lsn=3, offset=4))
    r.add_part(Part(0, 2, False, 11, offset=11))
    [whole] = r.ready()
    assert whole.gxid == 2 and [p.segment for p in whole.parts] == [0] and whole.covered == (1,)
    r.add_watermark(-1, 2_000, resolved_lsn=5)
    assert [(w.gxid, w.reconcile is not None) for w in r.ready()] == [(None, True), (4, False)]


def test_a_replay_resumed_after_the_copy_was_applied_does_not_apply_it_again():
    r = Reassembler(2, copies_applied={1: 1}, applied={2})
    r.add_watermark(1, -1, lost="slot s is missing", lost_at=29)
    r.add_repair(_repair())
    r.add_record(Record(3, (0, 1), commit_ts_ms=3_000, commit_lsn=200))
    r.add_part(Part(0, 3, False, 13, offset=12))
    r.add_part(Part(1, 3, False, 51, offset=32))
    assert [(w.gxid, w.reconcile) for w in r.ready()] == [(3, None)]
    assert 1 not in r.resume_offsets(), "its copy applied, nothing before the marks is read again"
    fresh = Reassembler(2)
    fresh.add_watermark(1, -1, lost="slot s is missing", lost_at=29)
    fresh.add_repair(_repair())
    assert fresh.resume_offsets()[1] == 29, "until the copy is applied, the marks are read again after a restart"


def test_a_joined_segments_mark_is_read_again_at_every_resume_until_its_copy_is_applied():
    r = Reassembler(2)
    r.add_repair(_repair(offset=1))  # joined: no lost mark before it
    r.add_part(Part(0, 7, True, 10, offset=40))
    r.add_watermark(-1, 1_000, resolved_lsn=200)  # past the cut
    assert sorted((w.gxid or 0, w.reconcile is not None) for w in r.ready()) == [(0, True), (7, False)]
    assert r.resume_offsets()[1] == 1, "until the copy is applied, the mark is read again"
    assert 1 not in Reassembler(2, copies_applied={1: 1}).resume_offsets()
    after = Reassembler(2, copies_applied={1: 1})
    after.add_repair(_repair(offset=1))
    assert 1 not in after.resume_offsets(), "its copy applied, the mark is not needed again"


def test_a_segment_lost_again_after_its_repair_stops_the_replay_at_its_next_missing_part():
    r = Reassembler(2)
    r.add_watermark(1, -1, lost="slot s is missing", lost_at=29)
    r.add_repair(_repair(xmax=3, offset=30))
    r.add_watermark(-1, 1_000, resolved_lsn=100)
    assert [w.reconcile is not None for w in r.ready()] == [True]
    r.add_watermark(1, -1, lost="segment 1 is on timeline 3, not 2", lost_at=40)
    r.add_record(Record(5, (0, 1), commit_ts_ms=5_000, commit_lsn=300))
    r.add_part(Part(0, 5, False, 20, offset=13))
    [missing] = r.missing()
    assert (missing.gxid, missing.segment) == (5, 1) and "timeline 3" in missing.lost


def test_a_later_repair_of_the_same_segment_replaces_the_earlier():
    r = Reassembler(2, copies_applied={1: 1})
    r.add_repair(_repair(number=1))
    r.add_repair(_repair(number=2, xmax=7, offset=60))
    r.add_watermark(-1, 1_000, resolved_lsn=100)
    [copy] = r.ready()
    assert copy.reconcile is not None and copy.reconcile.number == 2


def consistent_cut(logs, coordinator, writes, c):
    """Each segment's log prefix at a cut after the first ``c`` commit records, taken as
    the commit lock takes it (no commit phase in flight): every part of those records
    in, none of later ones; None when the logs allow no such cut."""
    before, after = set(coordinator[:c]), set(coordinator[c:])
    prefixes = []
    for log in logs:
        n = max((i + 1 for i, g in enumerate(log) if g in before), default=0)
        if any(g in after for g in log[:n]):
            return None
        prefixes.append(n)
    return prefixes


@pytest.mark.parametrize("seed", range(200))
def test_a_segment_lost_and_repaired_at_a_random_cut_replays_to_the_source_state(seed):
    """A segment's stream stops at a random point (the loss) and goes on after a
    consistent cut taken later (the repair: its rows copied as of the cut). Fed in a
    random interleaving, the reassembler's output, applied with the copy, leaves every
    row as the source's last writer left it."""
    replay_with_a_cut(random.Random(seed), joined=False)


@pytest.mark.parametrize("seed", range(100))
def test_a_segment_joined_at_a_random_cut_replays_to_the_source_state(seed):
    """A segment added to the source (an expansion) is in the stream only from a
    consistent cut on (``gpcdc bootstrap extend``: its rows copied as of the cut), with
    no lost mark: its part of every transaction before the cut is in the copy."""
    replay_with_a_cut(random.Random(seed), joined=True)


def replay_with_a_cut(rng, *, joined):
    from gpcdc_toolkit.protocol import DistributedSnapshot

    logs, coordinator, writes = simulate(rng, segments=3, transactions=25, keys=4)
    cuts = [(c, p) for c in range(len(coordinator) + 1) if (p := consistent_cut(logs, coordinator, writes, c))]
    c, prefixes = rng.choice(cuts)
    lost_segment = rng.randrange(3)
    cut_at = prefixes[lost_segment]
    # The parts from here to the cut never reach the stream (joined: none before it does).
    lost_from = 0 if joined else rng.randint(0, cut_at)
    seen = set(coordinator[:c]) | {g for s, log in enumerate(logs) for g in log[:prefixes[s]]}
    snapshot = DistributedSnapshot(len(writes) + 1, frozenset(set(writes) - seen))
    segs_of = {g: sorted({s for s, _ in w}) for g, w in writes.items()}

    def part(s, i):
        g = logs[s][i]
        return ("part", s, Part(s, g, one_phase=len(segs_of[g]) == 1, commit_lsn=i + 1, offset=i if i < lost_from
                                else i + 2))

    queues = [[part(s, i) for i in range(len(log)) if s != lost_segment or i < lost_from or i >= cut_at]
              for s, log in enumerate(logs)]
    lost_queue = queues[lost_segment]
    at = sum(1 for e in lost_queue if e[2].offset < lost_from)
    lost_queue[at:at] = [("repaired", 1)] if joined else [("lost", lost_from), ("repaired", lost_from + 1)]
    queues.append([("record", g, i) for i, g in enumerate(coordinator)] + [("resolved", len(coordinator) + 1)])
    r = Reassembler(3)
    out = []
    while any(queues):
        event = rng.choice([q for q in queues if q]).pop(0)
        if event[0] == "part":
            r.add_part(event[2])
        elif event[0] == "record":
            r.add_record(Record(event[1], tuple(segs_of[event[1]]), commit_lsn=event[2] + 1))
        elif event[0] == "lost":
            r.add_watermark(lost_segment, -1, lost="slot s is missing", lost_at=event[1])
        elif event[0] == "repaired":
            r.add_repair(_repair(lost_segment, 1, snapshot.xmax, snapshot.in_progress, coordinator_lsn=c + 1,
                                 offset=event[1]))
        else:
            r.add_watermark(-1, 1_000, resolved_lsn=event[1])
        out += r.ready()
    out += r.ready()

    def last_writers(applied):
        state = {}
        for s, g in applied:
            for seg, key in writes[g]:
                if seg == s:
                    state[(s, key)] = g
        return state

    applied = []
    for whole in out:
        if whole.reconcile is not None:
            copy = last_writers((lost_segment, g) for g in logs[lost_segment][:cut_at])
            applied = [(s, g) for s, g in applied if s != lost_segment]
            applied += [(lost_segment, g) for (_s, _k), g in sorted(copy.items(), key=lambda kv: logs[lost_segment].index(kv[1]))]
        else:
            applied += [(p.segment, whole.gxid) for p in whole.parts]
    [copy_at] = [i for i, w in enumerate(out) if w.reconcile is not None]
    for i, whole in enumerate(out):  # what the copy stands for goes before it, and nothing older after it
        if whole.covered:
            assert i < copy_at and whole.covered == (lost_segment,) and snapshot.sees(whole.gxid)
        if i > copy_at:
            assert all(p.offset > lost_from for p in whole.parts if p.segment == lost_segment)
    source = last_writers((s, g) for s, log in enumerate(logs) for g in log)
    assert last_writers(applied) == source
    assert r.missing() == [] and r.pending == 0


def _two_transactions_sharing_both_segments(r, record_first):
    """gxids 1 and 2 commit on segments 0 and 1 at 100 and 200 ms: 1's record lost
    (never added), 2's added (before or after the parts)."""
    if record_first:
        r.add_record(Record(2, (0, 1), commit_ts_ms=190))
    for segment in (0, 1):
        r.add_part(Part(segment, 1, False, 10, commit_ts_ms=100, offset=10))
        r.add_part(Part(segment, 2, False, 20, commit_ts_ms=200, offset=11))
    if not record_first:
        r.add_record(Record(2, (0, 1), commit_ts_ms=190))


@pytest.mark.parametrize("record_first", [True, False])
def test_a_record_lost_is_proven_by_the_coordinators_watermark_and_nothing_after_it_goes_out(record_first):
    r = Reassembler(2, clock_skew_ms=50)
    r.add_watermark(-1, 151)  # not yet past gxid 1's commit by the skew and the times' rounding: it may still come
    _two_transactions_sharing_both_segments(r, record_first)
    r.add_watermark(-1, 152)  # every record of a commit before 152 ms by the coordinator's clock has come
    assert r.ready() == []  # gxid 2 may have had to follow gxid 1
    [missing] = r.missing()
    assert (missing.gxid, missing.present, missing.record_ts_ms) == (1, (0, 1), -1)
    assert missing.lost == "the coordinator's watermark passed its commit, and gxid 1's commit record never came"
    assert r.pending == 2


def test_a_late_record_is_waited_for_until_the_coordinators_watermark_passes_its_commit():
    r = Reassembler(2, clock_skew_ms=50)
    _two_transactions_sharing_both_segments(r, record_first=True)
    r.add_watermark(-1, 149)
    assert r.missing() == []
    r.add_record(Record(1, (0, 1), commit_ts_ms=90))  # late, and in the coordinator's order after gxid 2's
    r.add_watermark(-1, 1000)
    assert sorted(w.gxid for w in r.ready()) == [1, 2] and r.missing() == [] and r.pending == 0


@pytest.mark.parametrize("seed", range(100))
def test_true_coordinator_watermarks_never_stop_a_replay_and_a_dropped_record_is_named(seed):
    rng = random.Random(seed)
    logs, coordinator, writes = simulate(rng, segments=3, transactions=rng.randint(5, 30), keys=4)
    out, r = feed_in_random_interleaving(rng, logs, coordinator, writes, watermarks=True)
    assert r.missing() == []
    check(out, logs, writes)
    if coordinator:
        dropped = rng.choice(coordinator)
        out, r = feed_in_random_interleaving(rng, logs, coordinator, writes, watermarks=True, dropped=dropped)
        r.add_watermark(-1, 10**12)
        assert [m.gxid for m in r.missing()] == [dropped] and r.ready() == []
        handed = [w.gxid for w in out]
        assert dropped not in handed
        for g in handed:  # nothing that had to follow it went out before it was named
            assert not any(logs[s].index(dropped) < logs[s].index(g) for s, _ in writes[dropped] & writes[g]), (
                f"gxid {g} went out, yet it follows gxid {dropped}, whose record was lost, on a row they share")
