"""The audit's rules on streams written by hand (Spark, no other servers).

Every example is a Spark audit of its own: a suite of their own (`./dev test-audits`)."""

import re

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.audit import FINDING_COLUMNS, RULES, Thresholds, audit_events, events_frame, prepare
from gpcdc_toolkit.audit import _rules as rules
from gpcdc_toolkit.audit._faults import Message
from gpcdc_toolkit.replay._order import Part, Reassembler, Record
from gpcdc_toolkit.replay._source import Framer, Watermark

from ._audit_stream import StreamBuilder

pytestmark = pytest.mark.audits

SKEW = 1000
THRESHOLDS = Thresholds(clock_skew_ms=SKEW)


def findings_of(spark, builder):
    findings, _ = audit_events(events_frame(spark, builder.messages()), THRESHOLDS)
    return [f.asDict() for f in findings.collect()]


def test_every_rule_gives_the_findings_schema(spark):
    stream = prepare(events_frame(spark, StreamBuilder().part(0, 7, 100, 1000).record(7, [0], 90, 999).messages()))
    for rule in RULES:
        frame = rule(stream, Thresholds())
        assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == list(FINDING_COLUMNS), rule.__name__


def opposite_orders(keys_on_0):
    """gxid 1 then 2 in coordinator order; segment 0 commits gxid 2 (writing the first
    key) then gxid 1 (the second), segment 1 commits them in coordinator order."""
    b = StreamBuilder().record(1, [0, 1], 10, 1000).record(2, [0, 1], 20, 1001)
    b.part(0, 2, 100, 1002, rows=[("t", keys_on_0[0])]).part(0, 1, 110, 1003, rows=[("t", keys_on_0[1])])
    b.part(1, 1, 100, 1002, rows=[("t", 3)]).part(1, 2, 110, 1003, rows=[("t", 4)])
    for node in (-1, 0, 1, 2):
        b.watermark(node, 1000, 5000, prepared_ts=5000)
    return b


def test_segments_committing_in_different_orders_is_no_finding(spark):
    assert findings_of(spark, opposite_orders((1, 2))) == []


def test_two_writers_of_one_key_against_coordinator_order_is_an_error(spark):
    [finding] = findings_of(spark, opposite_orders((1, 1)))
    assert (finding["rule"], finding["gxid"], finding["segments"], finding["table"]) == ("key_order", 1, [0], "public.t")


@st.composite
def keys_written(draw):
    """Transactions in a coordinator order, each writing keys of a small pool (two
    tables, one named with a space and capitals) on some segments, each segment
    committing its parts in an order of its own."""
    count = draw(st.integers(2, 5))
    coordinator = draw(st.permutations(range(1, count + 1)))
    row = st.tuples(st.sampled_from(["t", "Order Items"]), st.integers(0, 3))
    writes = {g: {s: draw(st.lists(row, min_size=1, max_size=3)) for s in draw(st.sets(st.integers(0, 2), min_size=1))}
              for g in range(1, count + 1)}
    orders = {s: draw(st.permutations([g for g in writes if s in writes[g]])) for s in range(3)}
    return coordinator, writes, orders


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys_written())
def test_key_order_finds_each_key_a_segment_wrote_against_coordinator_order(spark, case):
    coordinator, writes, orders = case
    b = StreamBuilder(segments=3)
    for lsn, gxid in enumerate(coordinator, 1):
        b.record(gxid, sorted(writes[gxid]), 10 * lsn, 1000 + lsn)
    for segment, order in orders.items():
        for lsn, gxid in enumerate(order, 1):
            b.part(segment, gxid, 100 * lsn, 2000 + lsn, rows=writes[gxid][segment])
    # Each key's versions on a segment, in commit order there: a version after another
    # transaction's that the coordinator committed later is one key against its order.
    position = {gxid: i for i, gxid in enumerate(coordinator)}
    expected: dict[tuple[int, int, int], int] = {}
    for segment, order in orders.items():
        last: dict[tuple[str, int], int] = {}
        for gxid in order:
            for written in writes[gxid][segment]:
                before = last.get(written)
                if before is not None and before != gxid and position[before] > position[gxid]:
                    expected[(segment, before, gxid)] = expected.get((segment, before, gxid), 0) + 1
                last[written] = gxid
    found = {}
    for f in rules.key_order(prepare(events_frame(spark, b.messages())), THRESHOLDS).collect():
        before = int(re.search(r"gxid (\d+) wrote key", f["evidence"]).group(1))
        keys = int(re.search(r"; (\d+) key\(s\) in all$", f["evidence"]).group(1))
        found[(f["segments"][0], before, f["gxid"])] = keys
    assert found == expected


def test_a_legacy_stream_is_one_warning_per_node_with_each_part_and_record_as_detail(spark):
    b = StreamBuilder().part(0, None, 100, 1000).part(0, 5, 110, 1001, one_phase=True).part(1, None, 100, 1000)
    b.record(9, None, 10, 999)
    for node in (-1, 0, 1, 2):
        b.watermark(node, 1000, 1100, prepared_ts=1100)
    found = sorted((f["rule"], f["severity"], f["segments"][0]) for f in findings_of(spark, b))
    assert found == [("legacy_part", "info", 0), ("legacy_part", "info", 1), ("legacy_record", "info", -1),
                     ("legacy_share", "warning", -1), ("legacy_share", "warning", 0), ("legacy_share", "warning", 1)]
    share = {f["segments"][0]: f["evidence"] for f in findings_of(spark, b) if f["rule"] == "legacy_share"}
    assert "1 of its 2 transactions (50.0%)" in share[0] and "1 carry no gxid" in share[0]
    assert "0 carry no gxid (no gpcdc.gxid marker), 0 no one-phase flag" not in share[1]
    assert "the coordinator: 1 of its 1 commit records list no segments" in share[-1]


def replayer_head(messages, segments):
    """The replayer's verdict on the first transaction it cannot hand out: (gxid,
    segment) of the parts it proves missing, and of those it still waits for."""
    framer, reassembler = Framer("t"), Reassembler(segments, clock_skew_ms=SKEW)
    for m in sorted(messages, key=lambda m: (m.topic.endswith(".dtx"), m.partition, m.offset)):
        framed = framer.feed(-1 if m.topic.endswith(".dtx") else m.partition, m.offset, orjson.loads(m.value))
        if isinstance(framed, Part):
            reassembler.add_part(framed)
        elif isinstance(framed, Record):
            reassembler.add_record(framed)
        elif isinstance(framed, Watermark):
            reassembler.add_watermark(framed.segment, framed.resolved_ts_ms, framed.prepared, framed.prepared_ts_ms,
                                      framed.parts, framed.lost, framed.offset)
        reassembler.ready()
    missing = {(m.gxid, m.segment) for m in reassembler.missing()}
    return missing, set(reassembler.in_doubt()) - missing


@st.composite
def doubtful_streams(draw, numbered=False):
    """Two-phase transactions with parts delivered or not, and each segment's last
    prepared list read before, around or after their records, holding some of them.
    Numbered: a part not delivered either changed nothing (never numbered) or was lost."""
    b = StreamBuilder(segments=3, numbered=numbered)
    transactions = draw(st.integers(1, 4))
    undelivered = []
    for gxid in range(1, transactions + 1):
        segments = sorted(draw(st.sets(st.integers(0, 2), min_size=2, max_size=3)))
        b.record(gxid, segments, 10 * gxid, 1000 + 10 * gxid)
        for s in segments:
            if draw(st.booleans()):
                b.part(s, gxid, 100 * gxid, 1001 + 10 * gxid, rows=[("t", 100 * gxid + s)])
            else:
                undelivered.append((gxid, s))
                if numbered and draw(st.booleans()):
                    b.part(s, gxid, 100 * gxid, 1001 + 10 * gxid, lost=True)
    for s in range(3):
        held = [g for g, seg in undelivered if seg == s and draw(st.booleans())]
        read_at = 1000 + draw(st.integers(-500, 2500))
        b.watermark(s, 10_000, read_at + 5, prepared=held, prepared_ts=read_at)
    b.watermark(-1, 10_000, 5000, prepared_ts=5000)
    return b


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doubtful_streams())
def test_missing_and_late_agree_with_the_replayer(spark, builder):
    missing, late = replayer_head(builder.messages(), 3)
    found = findings_of(spark, builder)
    audit_missing = {(f["gxid"], f["segments"][0]) for f in found if f["rule"] == "missing_part"}
    audit_late = {(f["gxid"], f["segments"][0]) for f in found if f["rule"] == "late_part"}
    head = {g for g, _ in missing | late}
    assert missing == {p for p in audit_missing if p[0] in head}
    assert late == {p for p in audit_late if p[0] in head}
    assert {f["rule"] for f in found} <= {"missing_part", "late_part"}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doubtful_streams(numbered=True))
def test_in_a_numbered_stream_a_part_that_changed_nothing_is_no_finding_and_a_lost_one_is(spark, builder):
    missing, late = replayer_head(builder.messages(), 3)
    found = findings_of(spark, builder)
    lost = {f["segments"][0] for f in found if f["rule"] == "lost_parts"}
    gapped = {s for s, last in builder.numbers.items()
              if last > sum(1 for m in builder.messages() if m.partition == s and b'"status":"END"' in m.value)}
    assert lost == gapped  # exactly the segments that lost a numbered part
    audit_missing = {(f["gxid"], f["segments"][0]) for f in found if f["rule"] == "missing_part"}
    named = {(g, s) for g, s in missing if g is not None}  # the replayer's gaps name no transaction
    head = {g for g, _ in named | late}
    assert named == {p for p in audit_missing if p[0] in head}
    assert {s for g, s in missing if g is None} <= lost
    assert all(s in gapped for _g, s in audit_missing)  # missing only where a number is missing


def test_a_lost_mark_is_a_finding_and_the_replayer_calls_what_it_cuts_off_missing(spark):
    b = StreamBuilder(segments=2)
    b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001).part(1, 1, 100, 1001)
    b.record(2, [0, 1], 20, 2000).part(0, 2, 110, 2001)
    b.lost(1, "segment 1 is on timeline 2, not 1")
    missing, late = replayer_head(b.messages(), 2)
    assert missing == {(2, 1)} and late == set()
    found = findings_of(spark, b)
    lost = [f for f in found if f["rule"] == "lost_node"]
    assert [(f["severity"], f["segments"]) for f in lost] == [("error", [1])]
    assert "node 1 is lost to the pipeline" in lost[0]["evidence"]
    # The audit names the same transaction the replayer stops at: its part never comes.
    cut_off = [f for f in found if f["rule"] in ("missing_part", "late_part")]
    assert [(f["rule"], f["severity"], f["gxid"], f["segments"]) for f in cut_off] == [("missing_part", "error", 2, [1])]
    assert "segment 1 is lost to the pipeline: it never comes" in cut_off[0]["evidence"]


def test_a_repaired_node_is_a_warning_and_its_parts_in_the_copy_are_no_finding(spark):
    b = StreamBuilder(segments=2)
    b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001).part(1, 1, 100, 1001)
    b.record(2, [0, 1], 20, 2000).part(0, 2, 110, 2001)  # its part on 1 was lost: in the repair's copy
    b.record(4, [0, 1], 40, 4000).part(0, 4, 130, 4001)  # running at the cut: its part on 1 comes after the marks
    b.watermark(1, 100, 1_000)
    b.lost(1, "segment 1 is on timeline 2, not 1")
    b.repaired(1, 1, xmax=5, running=[4])
    b.part(1, 4, 300, 4001)  # from the new slot
    b.watermark(1, 300, 100_000)  # silent from the loss to the repair: lost_node says why
    found = findings_of(spark, b)
    assert "watermark_gap" not in {f["rule"] for f in found}
    [lost] = [f for f in found if f["rule"] == "lost_node"]
    assert lost["severity"] == "warning" and re.search(r"; repair 1 \(offset \d+\) captures it again", lost["evidence"])
    assert {(f["rule"], f["gxid"], f["severity"]) for f in found if f["rule"].endswith("_part")} == {
        ("covered_part", 2, "info")}
    covered = next(f for f in found if f["rule"] == "covered_part")
    assert "it is in repair 1's copy of segment 1's rows" in covered["evidence"]


def test_a_part_a_lost_mark_cut_off_before_its_end_is_the_loss_not_damage(spark):
    """A worker killed between a part's rows and its END, whose node is then lost and
    repaired: the rows never get their END, the repair's copy holds the part. The
    replayer drops them at the mark; the audit reports the loss, not a damaged part.
    Without a mark between, the same rows are damage."""
    def stream(marked):
        b = StreamBuilder(segments=2)
        b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001).part(1, 1, 100, 1001)
        b.record(2, [0, 1], 20, 2000).part(0, 2, 110, 2001).part(1, 2, 110, 2001, rows=[("t", 7), ("t", 8)],
                                                                 ended=False)
        if marked:
            b.lost(1, "the slot of segment 1 was invalidated")
            b.repaired(1, 1, xmax=5)
        b.record(6, [0, 1], 60, 6000).part(0, 6, 150, 6001).part(1, 6, 300 if marked else 150, 6001)
        return b

    found = findings_of(spark, stream(marked=True))
    assert not [f for f in found if f["severity"] == "error"], found
    assert [(f["rule"], f["severity"]) for f in found if f["rule"] == "lost_node"] == [("lost_node", "warning")]
    assert [(f["rule"], f["gxid"]) for f in found if f["rule"].endswith("_part")] == [("covered_part", 2)]
    framer = Framer("t")
    framed = [framer.feed(-1 if m.topic.endswith(".dtx") else m.partition, m.offset, orjson.loads(m.value))
              for m in stream(marked=True).messages()]
    assert [(p.gxid, p.commit_lsn) for p in framed if isinstance(p, Part) and p.segment == 1] == [(1, 100), (6, 300)]

    [damaged] = [f for f in findings_of(spark, stream(marked=False)) if f["rule"] == "damaged_part"]
    assert (damaged["gxid"], damaged["segments"], damaged["severity"]) == (2, [1], "error")
    assert "has no END before the next transaction" in damaged["evidence"]


def test_a_node_lost_again_after_its_repair_is_an_error_and_its_parts_after_are_missing(spark):
    b = StreamBuilder(segments=2)
    b.lost(1, "slot gpcdc_x is missing")
    b.repaired(1, 1, xmax=3)
    b.lost(1, "segment 1 is on timeline 3, not 2")
    b.record(5, [0, 1], 50, 5000).part(0, 5, 150, 5001)
    found = findings_of(spark, b)
    assert sorted(f["severity"] for f in found if f["rule"] == "lost_node") == ["error", "warning"]
    assert [(f["gxid"], f["severity"]) for f in found if f["rule"] == "missing_part"] == [(5, "error")]


def test_a_lost_node_is_not_also_called_silent_but_a_silent_one_still_is(spark):
    b = StreamBuilder(segments=2)
    b.watermark(0, 100, 1_000).watermark(1, 100, 1_000).watermark(-1, 100, 1_000)
    b.lost(1, "slot gpcdc_x is missing")
    b.watermark(0, 200, 100_000).watermark(-1, 200, 100_000)
    silent = {f["segments"][0] for f in findings_of(spark, b) if f["rule"] == "silent_node"}
    assert silent == set()
    b.watermark(0, 300, 200_000)  # now the coordinator is behind too, and not lost
    assert {f["segments"][0] for f in findings_of(spark, b) if f["rule"] == "silent_node"} == {-1}


@st.composite
def redelivered_streams(draw):
    """A clean stream, then copies of some of its messages put at the end of any
    partition of their topic (as a capture restarted, or a repartitioned topic, would),
    some row events with other content. Returns the messages, and for each copied
    message the positions of its copies and which of them differ."""
    b = StreamBuilder()
    for gxid in range(1, draw(st.integers(1, 5)) + 1):
        segments = sorted(draw(st.sets(st.integers(0, 2), min_size=1, max_size=3)))
        for segment in segments:
            b.part(segment, gxid, 100 * gxid, 1000 + gxid, rows=[("t", gxid), ("t", -gxid)])
        b.record(gxid, segments, 100 * gxid - 10, 1000 + gxid)
    messages = b.messages()
    with_identity = [m for m in messages if b"pipeline" not in m.value]
    copied = draw(st.lists(st.tuples(st.sampled_from(with_identity), st.integers(0, 2), st.booleans()), max_size=12))
    ends = {}
    for m in messages:
        ends[(m.topic, m.partition)] = max(ends.get((m.topic, m.partition), 0), m.offset + 1)
    copies = []
    for original, partition, alter in copied:
        partition = partition if original.topic == b.changes else 0
        value = original.value
        if alter and b'"after"' in value:
            value = value.replace(b'"v":', b'"v":1', 1)  # the same identity, another content
        offset = ends.get((original.topic, partition), 0)
        ends[(original.topic, partition)] = offset + 1
        copies.append((original, Message(original.topic, partition, offset, original.timestamp_ms, original.key, value)))
    return messages, copies


def _position(m):
    return (m.topic, m.partition, m.offset)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(redelivered_streams(), st.booleans())
def test_of_the_copies_of_a_message_the_first_in_position_order_stays_and_the_rest_are_duplicates(
        spark, monkeypatch, delivered, broadcast):
    messages, copies = delivered
    # Both ways of joining the events to the repeated identities: by broadcast, by shuffle.
    monkeypatch.setattr(rules, "BROADCAST_REPEATS", 1_000 if broadcast else 0)
    groups = {}
    for original, copy in copies:
        groups.setdefault(_position(original), [original]).append(copy)
    expected_copies, expected_conflicts = set(), set()
    for group in groups.values():
        first = min(group, key=_position)
        for m in group:
            if m is not first:
                expected_copies.add(_position(m))
                if m.value != first.value:
                    expected_conflicts.add((_position(m), first.offset))
    stream = prepare(events_frame(spark, messages + [copy for _original, copy in copies]))
    duplicates = stream.duplicates.select("topic", "partition", "offset", "_first_offset", "_hash",
                                          "_first_hash").collect()
    assert {(d.topic, d.partition, d.offset) for d in duplicates} == expected_copies
    assert {((d.topic, d.partition, d.offset), d._first_offset) for d in duplicates
            if d._hash != d._first_hash} == expected_conflicts
    kept = {(e.topic, e.partition, e.offset) for e in stream.events.select("topic", "partition", "offset").collect()}
    assert kept == {_position(m) for m in messages + [c for _o, c in copies]} - expected_copies


# Well-formed transactions, then a few twists that make identities collide in every way
# a damaged or hostile stream can: a message sent again (to its partition or another),
# a row numbered like a BEGIN or END (-1, -2) or a record (-3, -4) or past a part's
# 64-bit mask, a record on a segment, a statement on a framed message, a kind or field
# lost or changed, a framed message also corrupt.
@st.composite
def colliding_events(draw):
    rows = [{"topic": "p.dtx", "partition": 0, "kind": "pipeline", "segment": -1}]
    for lsn in range(10, 10 + draw(st.integers(1, 4))):
        segment = draw(st.integers(0, 1))
        frame = {"topic": "p.changes", "partition": segment, "segment": segment, "commit_lsn": lsn, "commit_ts": lsn}
        rows += ([{**frame, "kind": "begin"}] + [{**frame, "kind": "row", "seq": n} for n in
                                                 range(1, draw(st.integers(0, 3)) + 1)] + [{**frame, "kind": "end"}])
        rows.append({"topic": "p.dtx", "partition": 0, "kind": "commit", "segment": -1, "commit_lsn": lsn})
        if draw(st.booleans()):
            rows.append({"topic": "p.dtx", "partition": 0, "kind": "ddl", "segment": -1, "commit_lsn": lsn,
                         "statement": "ALTER TABLE t ADD c int"})
    rows.append({"topic": "p.changes", "partition": 1, "kind": "resolved", "segment": 1, "resolved_ts": 4})
    copy = st.tuples(st.just("copy"), st.integers(0, 1))  # the likeliest twist: the one a capture restart makes
    twist = st.one_of(
        copy, copy, copy, st.tuples(st.just("seq"), st.sampled_from([-4, -3, -2, -1, 0, 1, 63, 64, None])),
        st.tuples(st.just("segment"), st.sampled_from([0, None])), st.tuples(st.just("statement"), st.just("s")),
        st.tuples(st.just("commit_lsn"), st.none()), st.tuples(st.just("_corrupt_record"), st.just("x")),
        st.tuples(st.just("kind"), st.sampled_from(["begin", "end", "row", "commit", "ddl", None])))
    for what, value in draw(st.lists(twist, max_size=4)):
        r = rows[draw(st.integers(1, len(rows) - 1))]  # any but the pipeline marker, which has no identity
        if what == "copy":
            rows.append({**r, "partition": value if r["topic"] == "p.changes" else 0})
        else:
            r[what] = value
    offsets: dict[tuple[str, int], int] = {}
    for r in rows:
        for field in ("segment", "commit_lsn", "seq", "statement", "commit_ts", "resolved_ts"):
            r.setdefault(field, None)
        r["offset"] = offsets[(r["topic"], r["partition"])] = offsets.get((r["topic"], r["partition"]), -1) + 1
        r.setdefault("_corrupt_record", "x" if r["kind"] is None else None)
    seen = draw(st.none() | st.lists(st.tuples(st.sampled_from([0, 1, -1]), st.integers(10, 13)), max_size=2))
    return rows, seen


_PAYLOAD = ("kind", "seq", "statement", "commit_ts")  # the content a copy's hash covers, of what is generated


def _identity(r):
    seq = {"row": r["seq"], "begin": -1, "end": -2, "commit": -3, "ddl": -4}.get(r["kind"])
    return None if seq is None else (r["segment"], r["commit_lsn"], seq, r["statement"] or "")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(colliding_events())
def test_messages_set_apart_and_the_window_starts_are_those_of_every_identity_compared(spark, case):
    """Whatever path prepare takes (a part's mask shows its identities distinct, or they
    are compared one by one), the copies, the messages kept and where each partition's
    window starts are those of the identities compared in plain Python."""
    import datetime as dt

    import pyarrow as pa

    from gpcdc_toolkit.ingest._rows import arrow_schema

    rows, seen = case
    order = sorted(rows, key=lambda r: (r["topic"], r["partition"], r["offset"]))
    first: dict[tuple, dict] = {}
    for r in order:
        if _identity(r) is not None:
            first.setdefault(_identity(r), r)
    repeated = {i for i in first if sum(_identity(r) == i for r in rows) > 1}
    copies, kept = {}, set()
    for r in order:
        position, identity = (r["topic"], r["partition"], r["offset"]), _identity(r)
        again = identity in repeated and first[identity] is not r
        if identity is not None and seen is not None and (r["segment"], r["commit_lsn"]) in set(seen):
            again = True
        if again:  # a copy: its first copy's offset, and whether its content differs, when its identity repeats
            f = first[identity]
            copies[position] = ((f["offset"], any(r[c] != f[c] for c in _PAYLOAD)) if identity in repeated
                                else (None, None))
        else:
            kept.add(position)
    starts = {}
    for r in rows:
        key = (r["topic"], r["partition"])
        ts = r["commit_ts"] if r["commit_ts"] is not None else r["resolved_ts"]
        # As SQL's OR: null or true is true.
        pipeline = True if seen is not None else None if r["kind"] is None else r["kind"] == "pipeline"
        s = starts.setdefault(key, [None, r["offset"], ts])
        s[0] = pipeline if s[0] is None else (max(s[0], pipeline) if pipeline is not None else s[0])
        s[1] = min(s[1], r["offset"])
        s[2] = ts if s[2] is None else (min(s[2], ts) if ts is not None else s[2])

    def stamp(ms):
        return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC)

    table = pa.Table.from_pylist([{**r, "commit_ts": stamp(r["commit_ts"]), "resolved_ts": stamp(r["resolved_ts"]),
                                   "timestamp": stamp(1)} for r in rows], schema=arrow_schema())
    seen_frame = None if seen is None else spark.createDataFrame(seen, "segment int, commit_lsn bigint")
    stream = prepare(spark.createDataFrame(table), seen_frame)
    got_copies = {(d.topic, d.partition, d.offset): (d._first_offset, None if d._first_hash is None else
                                                     d._hash != d._first_hash) for d in stream.duplicates.collect()}
    assert got_copies == copies
    assert {(e.topic, e.partition, e.offset) for e in stream.events.collect()} == kept
    got_starts = {(s.topic, s.partition): [None if s.from_start is None else bool(s.from_start), s.first_offset,
                                           None if s.first_ts is None else int(s.first_ts.timestamp() * 1000)]
                  for s in stream.starts.collect()}
    assert got_starts == starts
    framed = [r for r in rows if (r["topic"], r["partition"], r["offset"]) in kept and r["kind"] in ("row", "begin", "end")
              and r["segment"] is not None and r["segment"] >= 0]
    assert sorted(p.offset for p in stream.parts.collect()) == sorted(
        min(r["offset"] for r in framed if (r["topic"], r["partition"], r["segment"], r["commit_lsn"]) == k)
        for k in {(r["topic"], r["partition"], r["segment"], r["commit_lsn"]) for r in framed})
