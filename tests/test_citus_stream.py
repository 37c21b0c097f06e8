"""The Citus stream translation (pure): a worker's two-phase decoding stream and the
coordinator's commit decisions, turned into the protocol the sandbox's capture writes."""

import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpcdc_toolkit.citus import CitusGidError, CitusStream, gxid_of_gid
from gpcdc_toolkit.protocol import (
    COORDINATOR,
    LocalSnapshot,
    NodeStart,
    ProtocolError,
    StartPoint,
    UnknownNodesError,
    kind_of,
    numbering_of,
    pipeline_marker,
)
from tests import _pgwire as w

PID = 4242
SHARD_RELID = 700
COLUMNS = [("id", 23, True), ("v", 25, False)]


def shards(schema, relation):
    return ("public", "acct") if schema == "public" and re.fullmatch(r"acct_\d+", relation) else None


def worker(start=None, numbered_after=(-1, 0)):
    return CitusStream(1, shards=shards, groups={1: 0, 2: 1}, source_name="t", database="db", start=start,
                       numbered_after=numbered_after)


def decode(outbound):
    return [orjson.loads(o.value) for o in outbound]


def test_gxids_name_the_distributed_transaction_not_the_connection():
    assert gxid_of_gid("citus_0_3756_7_6") == gxid_of_gid("citus_0_3756_7_1")
    assert gxid_of_gid("citus_0_3756_7_6") != gxid_of_gid("citus_0_3756_8_6")
    assert gxid_of_gid("citus_0_3756_7_6") != gxid_of_gid("citus_0_3757_7_6")
    assert gxid_of_gid("gpcdc_12") is None and gxid_of_gid("citus_0_1_2") is None
    with pytest.raises(CitusGidError, match="node group 2, not the coordinator"):
        gxid_of_gid("citus_2_3756_7_6")


@st.composite
def worker_wal(draw):
    """A worker's decoding stream: distributed transactions with 1-3 parts each
    (prepared, then committed in any order, or all rolled back), and one-phase
    commits, interleaved as the server may write them. Returns (messages, expected):
    expected is, in the order capture must hand them out, (gxid or None, sorted ids);
    records are the WAL records decoded, as (LSN, messages): a session started at an LSN
    is sent those at or after it."""
    count = draw(st.integers(1, 5))
    steps = []  # (dtx index or None, kind, part number)
    for i in range(count):
        parts = draw(st.integers(1, 3))
        outcome = draw(st.sampled_from(["commit", "commit", "rollback"]))
        steps.append([(i, "prepare", c) for c in range(parts)]
                     + [(i, outcome, c) for c in draw(st.permutations(range(parts)))])
    steps += [[(None, "one_phase", j)] for j in range(draw(st.integers(0, 3)))]
    order: list[tuple] = []
    queues = [list(s) for s in steps]
    while any(queues):  # interleave, keeping each transaction's own order
        live = [q for q in queues if q]
        order.append(draw(st.sampled_from(live)).pop(0))
    messages, slots, committed, records = [], [], set(), []
    lsn, next_id, xid = 1000, 1, 500
    rows: dict[int, list[int]] = {}
    for dtx, kind, part in order:
        lsn += 100
        first = len(messages)
        gid = f"citus_0_{PID}_{dtx}_{part}" if dtx is not None else None
        if kind in ("prepare", "one_phase"):
            xid += 1
            ids = list(range(next_id, next_id + draw(st.integers(0, 3))))
            next_id += len(ids)
            messages.append(w.begin_prepare(lsn, lsn + 50, xid, gid) if gid else w.begin(lsn, xid))
            messages.append(w.relation(SHARD_RELID, "public", f"acct_{102008 + part}", COLUMNS))
            messages += [w.insert(SHARD_RELID, [str(i), f"v{i}"]) for i in ids]
            if gid:
                messages.append(w.prepare(lsn, lsn + 50, xid, gid))
                rows.setdefault(dtx, []).extend(ids)
            else:
                messages.append(w.commit(lsn, lsn + 50))
                if ids:  # an empty local transaction is nothing to the stream
                    slots.append((None, ids))
        elif kind == "commit":
            messages.append(w.commit_prepared(lsn, lsn + 50, 0, gid))
            if dtx not in committed:  # handed out at its first commit
                committed.add(dtx)
                slots.append((dtx, None))
        else:
            messages.append(w.rollback_prepared(lsn - 50, lsn + 50, 0, gid))
        records.append((lsn, messages[first:]))
    expected = [(gxid_of_gid(f"citus_0_{PID}_{dtx}_0"), sorted(rows[dtx])) if dtx is not None else (None, ids)
                for dtx, ids in slots]
    rolled_back = sum(1 for dtx, kind, _ in order if kind == "rollback")
    return messages, expected, rolled_back, records


@settings(max_examples=300, deadline=None)
@given(worker_wal())
def test_a_worker_hands_out_each_distributed_transaction_whole_at_its_first_commit(case):
    messages, expected, rolled_back, _records = case
    stream = worker()
    out = []
    prepared_at: dict[str, int] = {}
    for payload in messages:
        if payload[:1] == b"b":
            prepared_at[payload[29:-1].decode()] = int.from_bytes(payload[1:9], "big")
        elif payload[:1] == b"r":  # rolled back: never to be handed out
            prepared_at.pop(payload[38:-1].decode())
        out += decode(stream.feed(payload))
        handed_out = {e["gxid"] for e in out if e.get("status") == "BEGIN"}
        # Never acknowledged past the PREPARE of a part not handed out yet, committed or not.
        waiting = [lsn for g, lsn in prepared_at.items() if gxid_of_gid(g) not in handed_out]
        if waiting and not stream.in_transaction:  # (inside one, nothing is acknowledged)
            assert stream.ack_limit is not None and stream.ack_limit <= min(waiting)
    parts, current, numbers = [], None, []
    for event in out:
        if event.get("status") == "BEGIN":
            current = (event["gxid"], [])
            numbers.append(event["number"])
        elif event.get("op") == "c":
            assert event["source"]["table"] == "acct" and event["source"]["gxid"] == current[0]
            assert event["source"]["seq"] == len(current[1]) + 1
            current[1].append(event["after"]["id"])
        elif event.get("status") == "END":
            assert event["event_count"] == len(current[1])
            assert event["one_phase"] is (current[0] is None)
            parts.append((current[0], sorted(current[1])))
    assert parts == expected
    assert numbers == list(range(1, len(parts) + 1))  # numbered in the order handed out
    assert stream.rolled_back_parts == rolled_back
    assert stream.held_from is None and stream.ack_limit is None
    assert orjson.loads(stream.resolved(10**9, 0).value)["parts"] == len(parts)
    # A session resumed from the partition's tail (the k-th part and its commit LSN) hands
    # out what follows, numbered on: nothing twice, no number skipped.
    ends = [e for e in out if e.get("status") == "END"]
    for k in range(len(ends) + 1):
        tail = (ends[k - 1]["commit_lsn"], k) if k else (-1, 0)
        again = worker(numbered_after=tail)
        resumed = [e for p in messages for e in decode(again.feed(p))]
        assert comparable(resumed) == [e for n, e in zip(part_numbers(out), comparable(out)) if n > k]


@settings(max_examples=400, deadline=None)
@given(worker_wal(), st.data())
def test_sessions_restarted_where_they_acknowledged_hand_out_everything_once(case, data):
    """Capture killed at any moment resumes at the slot's acknowledged position, where the
    server sends again only the records at or after it (a COMMIT PREPARED whose PREPARE
    is before it comes alone), and numbers on from the partition's tail, watermarks
    included: a session beats first thing, and may be killed again before it has read
    as far as that tail. Together the sessions hand out what one session would, each
    part under the number one session gives it."""
    messages, _expected, _rolled_back, records = case
    one_session = worker()
    whole = [e for p in messages for e in decode(one_session.feed(p))]
    out: list[dict] = [orjson.loads(pipeline_marker("p", 1, numbered=True).value)]
    acknowledged = 0
    for _restart in range(data.draw(st.integers(1, 4))):
        session = worker(numbered_after=tail(out))
        resolved = acknowledged
        resolved, watermark = beat(session, resolved, acknowledged)
        out.append(watermark)
        sent = [(lsn, payloads) for lsn, payloads in records if lsn >= acknowledged]
        for lsn, payloads in sent[:data.draw(st.integers(0, len(sent)))]:
            out += [e for p in payloads for e in decode(session.feed(p))]
            if data.draw(st.booleans()):
                resolved, watermark = beat(session, resolved, acknowledged)
                out.append(watermark)
            # Acknowledged as the worker does: as far as it has read, but never past a part
            # it has not handed out.
            limit = session.ack_limit
            acknowledged = max(acknowledged, lsn + 50 if limit is None else min(lsn + 50, limit))
    last = worker(numbered_after=tail(out))
    out += [e for lsn, payloads in records if lsn >= acknowledged for p in payloads for e in decode(last.feed(p))]
    assert comparable(e for e in out if kind_of(e) not in ("resolved", "pipeline")) == comparable(whole)


def tail(partition):
    """(LSN, number) from the latest message of the partition that says them, as a
    restarted capture worker reads its partition's tail."""
    return [n for e in partition if (n := numbering_of(e)) is not None][-1]


def beat(session, resolved, acknowledged):
    """A watermark as the capture worker makes one: at the end LSN of what the session
    has read since ``acknowledged``, below any commit it holds back, never going back."""
    produced = max(acknowledged, session.completed_end_lsn or -1)
    held = session.held_from
    resolved = max(resolved, produced if held is None else min(produced, held - 1))
    return resolved, orjson.loads(session.resolved(resolved, 0).value)


def comparable(events):
    """Events without the time capture made them."""
    return [{k: v for k, v in e.items() if not (k == "ts_ms" and "op" in e)} for e in events]


def part_numbers(events):
    """The number of the part each event belongs to."""
    numbers, current = [], None
    for e in events:
        current = e["number"] if e.get("status") == "BEGIN" else current
        numbers.append(current)
    return numbers


def test_a_rollback_after_a_sibling_committed_stops_capture():
    stream = worker()
    for part in (1, 2):
        stream.feed(w.begin_prepare(100 * part, 100 * part + 50, 10 + part, f"citus_0_{PID}_9_{part}"))
        stream.feed(w.prepare(100 * part, 100 * part + 50, 10 + part, f"citus_0_{PID}_9_{part}"))
    stream.feed(w.commit_prepared(400, 450, 0, f"citus_0_{PID}_9_1"))
    with pytest.raises(ProtocolError, match="rolled back after another part"):
        stream.feed(w.rollback_prepared(250, 550, 0, f"citus_0_{PID}_9_2"))


def test_a_commit_prepared_without_its_prepare_is_refused():
    with pytest.raises(ProtocolError, match="whose PREPARE was not decoded"):
        worker().feed(w.commit_prepared(400, 450, 0, f"citus_0_{PID}_9_1"))


def test_relations_that_are_not_shards_are_not_the_streams():
    stream = worker()
    stream.feed(w.begin(100, 7))
    stream.feed(w.relation(900, "public", "local_table", COLUMNS))
    stream.feed(w.insert(900, ["1", "x"]))
    assert stream.feed(w.commit(100, 150)) == []


def coordinator(start=None):
    return CitusStream(COORDINATOR, shards=shards, groups={1: 0, 2: 1}, source_name="t", database="db", start=start)


DECISION_COLUMNS = [("groupid", 23, False), ("outer_xid", 5069, False), ("gid", 25, False)]


def decisions(stream, lsn, xid, rows, relid=12345):
    stream.feed(w.begin(lsn, xid))
    stream.feed(w.relation(relid, "", "pg_dist_transaction", DECISION_COLUMNS))  # pgoutput: pg_catalog is ""
    for group, gid in rows:
        stream.feed(w.insert(relid, [str(group), "1234", gid]))
    return decode(stream.feed(w.commit(lsn, lsn + 50)))


def test_the_coordinators_decision_is_the_commit_record():
    stream = coordinator()
    gids = [f"citus_0_{PID}_5_{c}" for c in (3, 4, 7)]
    [record] = decisions(stream, 800, 77, [(2, gids[0]), (2, gids[1]), (1, gids[2])])
    assert record["type"] == "commit" and record["gxid"] == gxid_of_gid(gids[0])
    assert record["segments"] == [0, 1] and record["ddl_count"] == 0 and record["commit_lsn"] == 800
    assert "all_parts_decoded" not in record, "a Citus participant that changed nothing is never decoded"
    # Recovery deleting carried-out decisions is nothing to the stream.
    stream.feed(w.begin(900, 78))
    stream.feed(w.delete(12345, ["2", None, gids[0]], old_kind="O"))
    assert stream.feed(w.commit(900, 950)) == []


def test_a_decision_for_an_unknown_node_group_is_refused():
    with pytest.raises(UnknownNodesError, match="node groups \\[5\\], which the pipeline's start point does not list"):
        decisions(coordinator(), 800, 77, [(5, f"citus_0_{PID}_5_1")])


def test_the_start_point_filters_by_each_nodes_own_snapshot():
    # xid 600 committed before the cut (seen), 601 was running at it, 602 came after.
    start = StartPoint("snapshot", "now", (
        NodeStart(COORDINATOR, "s", 0, 0, None, "600:602:601"), NodeStart(0, "s", 0, 0, None, "600:602:601")))
    assert LocalSnapshot.parse("600:602:601").sees(599) and not LocalSnapshot.parse("600:602:601").sees(601)
    stream = coordinator(start)
    assert decisions(stream, 800, 599, [(1, f"citus_0_{PID}_5_1")]) == []
    assert len(decisions(stream, 900, 601, [(1, f"citus_0_{PID}_6_1")])) == 1
    assert len(decisions(stream, 1000, 602, [(1, f"citus_0_{PID}_7_1")])) == 1
    assert stream.dropped_transactions == 1


def test_a_sync_points_parts_and_record_come_out_as_the_sandboxs():
    from gpcdc_toolkit.citus import syncpoint_gxid
    from gpcdc_toolkit.protocol import _markers as markers

    gxid = syncpoint_gxid(1_795_600_000_000_000)
    assert gxid_of_gid(f"gpcdc_{gxid}") == gxid and gxid_of_gid("gpcdc_5") is None  # a sandbox gid is not one
    assert gxid_of_gid(f"citus_0_{(1 << 22) - 1}_{(1 << 40) - 1}_9") < gxid  # above every gxid a Citus gid packs
    stream = worker()
    stream.feed(w.begin_prepare(100, 150, 9, f"gpcdc_{gxid}"))
    stream.feed(w.message(*markers.encode(markers.GxidMarker(gxid)), lsn=110))
    stream.feed(w.prepare(100, 150, 9, f"gpcdc_{gxid}"))
    begin, end = decode(stream.feed(w.commit_prepared(200, 250, 9, f"gpcdc_{gxid}")))
    assert (begin["gxid"], end["gxid"], end["event_count"], end["one_phase"]) == (gxid, gxid, 0, False)
    coordinator_stream = coordinator()
    coordinator_stream.feed(w.begin(300, 20))
    coordinator_stream.feed(w.message(*markers.encode(markers.CommitRecord(gxid, (0, 1), ((-1, 300), (0, 100), (1, 90))))))
    [record] = decode(coordinator_stream.feed(w.commit(300, 350)))
    assert record["gxid"] == gxid and record["segments"] == [0, 1] and record["syncpoint"] == {"-1": 300, "0": 100,
                                                                                                   "1": 90}
