"""The event protocol without servers: pgoutput decoding, assembly, start points."""

from unittest import mock

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit.protocol import (
    UNCHANGED_TOAST,
    Dispatcher,
    DistributedSnapshot,
    NodeStart,
    PgoutputError,
    ProtocolError,
    StartPoint,
    TransactionAssembler,
    _assembler,
    format_lsn,
    parse,
    parse_lsn,
)
from gpcdc_toolkit.protocol import _pgoutput as pg
from gpcdc_toolkit.protocol._events import PROTOCOL_VERSION

from . import _pgwire as w

COLUMNS = [("id", 20, True), ("name", 25, False), ("ok", 16, False), ("score", 701, False), ("amount", 1700, False)]


def test_decode_each_message_kind():
    assert parse(w.begin(100, 7)) == pg.Begin(100, 1_700_000_000_000_000, 7)
    assert parse(w.commit(100, 120)) == pg.Commit(100, 120, 1_700_000_000_000_000)
    rel = parse(w.relation(16384, "public", "t", COLUMNS))
    assert rel.qualified_name == "public.t" and [c.is_key for c in rel.columns] == [True, False, False, False, False]
    assert parse(w.insert(16384, ["1", "a\tb", None, "<toast>", "1.50"])).new == ("1", "a\tb", None, UNCHANGED_TOAST, "1.50")
    up = parse(w.update(16384, ["2", "x", "t", "1", "2"], old=["1", None, None, None, None]))
    assert up.old_is_key and up.old[0] == "1" and up.new[0] == "2"
    assert parse(w.update(16384, ["2", "x", "t", "1", "2"])).old is None
    assert parse(w.delete(16384, ["1", None, None, None, None])).old_is_key
    m = parse(w.message("gpcdc.gxid", "42", lsn=5))
    assert m == pg.Message(True, 5, "gpcdc.gxid", b"42")
    assert parse(w.truncate([1, 2], cascade=True)) == pg.Truncate((1, 2), True, False)


@pytest.mark.parametrize("payload,message", [
    (b"", "empty"),
    (b"Z123", "unknown pgoutput message type 'Z'"),
    (b"B\x00\x01", "truncated or malformed pgoutput 'B'"),
    (b"I\x00\x00\x00\x01X", "INSERT without a new tuple"),
    (w.insert(1, ["1", "12345678"])[:-5], "a column value of 8 bytes, but 3 left in the message"),
])
def test_malformed_payloads_are_named(payload, message):
    with pytest.raises(PgoutputError, match=message):
        parse(payload)


def test_values_convert_to_json_types():
    assert pg.convert(20, "12") == 12 and pg.convert(16, "f") is False and pg.convert(701, "1.5") == 1.5
    assert pg.convert(701, "NaN") == "NaN" and pg.convert(1700, "1.50") == "1.50" and pg.convert(25, None) is None


_TEXTS = {16: st.sampled_from(["t", "f"]), 20: st.integers(-2**63, 2**63 - 1).map(str),
          23: st.integers(-2**31, 2**31 - 1).map(str), 701: st.sampled_from(["1.5", "-0", "NaN", "Infinity", "1e300"]),
          25: st.text(), 1700: st.sampled_from(["1.50", "NaN", "-0.000"])}


@given(st.lists(st.sampled_from(sorted(_TEXTS)), min_size=1, max_size=6).flatmap(
    lambda oids: st.tuples(st.just(oids), st.tuples(*(st.one_of(st.none(), _TEXTS[o]) for o in oids)))))
def test_a_row_image_converts_each_value_as_its_type_says(case):
    oids, values = case
    names = [f"c{i}" for i in range(len(oids))]
    assembler = TransactionAssembler(0, source_name="s", database="d")
    feed(assembler, w.begin(100, 7), w.relation(16384, "public", "t", [(n, o, i == 0) for i, (n, o) in
                                                                      enumerate(zip(names, oids))]))
    [_begin, (_row, key, row), _end] = feed(assembler, w.insert(16384, list(values)), w.commit(100, 120))
    assert row["after"] == {n: pg.convert(o, v) for n, o, v in zip(names, oids, values)}
    assert orjson.loads(key) == {names[0]: row["after"][names[0]]}


def feed(assembler, *payloads):
    out = []
    for p in payloads:
        out += assembler.feed(p)
    return [(o.kind, o.key, orjson.loads(o.value)) for o in out]


def one_phase_txn(xid=7, gxid=42, lsn=1000, rows=2):
    return [w.begin(lsn, xid), w.message("gpcdc.gxid", str(gxid))] + [
        w.insert(1, [str(i), f"n{i}", "t", "0.5", "3.10"]) for i in range(rows)
    ] + [w.message("gpcdc.one_phase", str(gxid)), w.commit(lsn, lsn + 40)]


def test_a_segment_transaction_becomes_begin_rows_end():
    a = TransactionAssembler(2, source_name="gpcdc", database="db", clock=lambda: 1.5)
    events = feed(a, w.relation(1, "public", "t", COLUMNS), *one_phase_txn())
    kinds = [k for k, _, _ in events]
    assert kinds == ["begin", "row", "row", "end"]
    _, key, row = events[1]
    assert key == b'{"id":0}'
    assert row["op"] == "c" and row["before"] is None
    assert row["after"] == {"id": 0, "name": "n0", "ok": True, "score": 0.5, "amount": "3.10"}
    assert row["source"]["segment"] == 2 and row["source"]["table"] == "t"
    assert (row["source"]["gxid"], row["source"]["one_phase"], row["source"]["seq"]) == (42, True, 1)
    assert row["source"]["commit_lsn"] == 1000 and row["ts_ms"] == 1500
    assert row["transaction"] == {"id": "2:7", "total_order": 1, "data_collection_order": 1}
    end = events[-1][2]
    assert end["status"] == "END" and end["event_count"] == 2 and end["one_phase"] is True
    assert end["data_collections"] == [{"data_collection": "public.t", "event_count": 2}]
    assert end["end_lsn"] == 1040 and a.completed_end_lsn == 1040


_NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=12)  # pgoutput's strings end at NUL
_VALUES = st.one_of(st.none(), st.text(st.characters(codec="utf-8"), max_size=20),
                    st.sampled_from(['"', "\\", "\u2028", '{"op":"c"}', "unchanged", "<toast>x", "null"]))


@given(source=_NAMES, db=_NAMES, schema=_NAMES, table=_NAMES,
       columns=st.lists(_NAMES, min_size=1, max_size=4, unique=True),
       changes=st.lists(st.tuples(st.sampled_from(["c", "u", "d", "u without its old row"]), st.lists(_VALUES, min_size=4, max_size=4),
                                  st.lists(_VALUES, min_size=4, max_size=4)), min_size=1, max_size=8),
       gxid=st.one_of(st.none(), st.integers(1, 2**32 - 1)), one_phase=st.booleans(),
       max_buffered=st.integers(1, 10), segment=st.integers(0, 300), compiled=st.booleans())
def test_every_row_event_is_the_envelope_encoded_byte_for_byte(source, db, schema, table, columns, changes, gxid,
                                                                 one_phase, max_buffered, segment, compiled):
    """Row events are put together from parts encoded apart (the row images, by the
    compiled encoder or the general path, the table's names, the transaction's
    fields): whatever the names and values hold, the result is the envelope's JSON,
    keys in the documented order, as one encoding of the whole event gives it."""
    names, oids = columns, [20, 25, 16, 25][:len(columns)]
    a = TransactionAssembler(segment, source_name=source, database=db, max_buffered=max_buffered, clock=lambda: 7.25)
    first = [w.message("gpcdc.gxid", str(gxid))] if gxid is not None else []
    last = [w.message("gpcdc.one_phase", str(gxid))] if gxid is not None and one_phase else []

    def row(values, i):  # a key column never null; the typed columns hold their types' text
        out = [str(i), *values[1:len(names)]]
        if len(names) > 2:
            out[2] = "t" if values[2] is None else "f"
        return out

    payloads = [w.insert(1, row(new, i)) if op == "c" else w.delete(1, row(old, i + 1000), old_kind="O") if op == "d"
                else w.update(1, row(new, i), old=row(old, i + 1000), old_kind="O") if op == "u"
                else w.update(1, row(new, i))
                for i, (op, new, old) in enumerate(changes)]
    with mock.patch.object(_assembler, "_encode_tuple", _assembler._encode_tuple if compiled else None):
        events = a.feed(w.relation(1, schema, table, list(zip(names, oids, [True] + [False] * 3))))
    assert (a._tables[1].layout is not None) == compiled
    for payload in [w.begin(5000, 77), *first, *payloads, *last, w.commit(5000, 5040)]:
        events += a.feed(payload)
    rows = [e for e in events if e.kind == "row"]
    streamed = len(changes) >= max_buffered
    flag = None if streamed else (True if gxid is not None and one_phase else (False if gxid is not None else None))
    counts: dict[str, int] = {}
    for seq, (event, (op, new, old)) in enumerate(zip(rows, changes), start=1):
        image = {}
        for values, i in ((new, seq - 1), (old, seq + 999)):
            image[values is new] = {n: pg.convert(o, v) for n, o, v in zip(names, oids, row(values, i))}
        order = counts[f"{schema}.{table}"] = counts.get(f"{schema}.{table}", 0) + 1
        expected = {
            "before": None if op in ("c", "u without its old row") else image[False],
            "after": None if op == "d" else image[True],
            "source": {"version": PROTOCOL_VERSION, "connector": "gpcdc", "name": source, "db": db, "schema": schema,
                       "table": table, "segment": segment, "txId": 77, "commit_lsn": 5000,
                       "ts_ms": 1_700_000_000_000, "gxid": gxid, "seq": seq, "one_phase": flag},
            "op": op[0], "ts_ms": 7250,
            "transaction": {"id": f"{segment}:77", "total_order": seq, "data_collection_order": order},
        }
        assert event.value == orjson.dumps(expected)
        assert event.key == orjson.dumps({names[0]: seq - 1 if op != "d" else seq + 999})


# What a consumer written for Debezium's PostgreSQL envelope reads (bench/bench_debezium.py
# compares the two on a real connector): field -> the JSON types it may hold.
DEBEZIUM_READS = {"before": (dict, type(None)), "after": (dict, type(None)), "op": (str,), "ts_ms": (int,),
                  "source": (dict,), "transaction": (dict,)}
DEBEZIUM_SOURCE = {"db": (str,), "schema": (str,), "table": (str,), "ts_ms": (int,), "txId": (int,)}
DEBEZIUM_TRANSACTION = {"id": (str,), "total_order": (int,), "data_collection_order": (int,)}


def test_a_consumer_of_debeziums_envelope_finds_its_fields_in_every_row_event():
    a = TransactionAssembler(2, source_name="gpcdc", database="db")
    events = feed(a, w.relation(1, "public", "t", COLUMNS), *one_phase_txn(),
                  w.begin(500, 9), w.message("gpcdc.gxid", "43"),
                  w.update(1, ["5", "x", "f", "1", "1"], old=["4", None, None, None, None]),
                  w.delete(1, ["6", None, None, None, None]), w.commit(500, 520))
    rows = [e for k, _, e in events if k == "row"]
    assert {r["op"] for r in rows} == {"c", "u", "d"}
    for row in rows:
        for fields, where in ((DEBEZIUM_READS, row), (DEBEZIUM_SOURCE, row["source"]),
                              (DEBEZIUM_TRANSACTION, row["transaction"])):
            for field, types in fields.items():
                assert isinstance(where[field], types), (field, where)
        assert (row["before"] is None) == (row["op"] == "c") and (row["after"] is None) == (row["op"] == "d")


def test_two_phase_part_and_updates_and_deletes():
    a = TransactionAssembler(0, source_name="gpcdc", database="db")
    events = feed(a, w.relation(1, "public", "t", COLUMNS), w.begin(500, 9), w.message("gpcdc.gxid", "43"),
                  w.update(1, ["5", "x", "f", "1", "1"], old=["4", None, None, None, None]),
                  w.delete(1, ["6", None, None, None, None]), w.commit(500, 520))
    rows = [e for k, _, e in events if k == "row"]
    assert [r["op"] for r in rows] == ["u", "d"]
    assert rows[0]["before"]["id"] == 4 and rows[0]["after"]["id"] == 5 and events[1][1] == b'{"id":5}'
    assert rows[1]["after"] is None and rows[1]["before"]["id"] == 6
    assert all(r["source"]["one_phase"] is False for r in rows)
    assert events[-1][2]["one_phase"] is False


def test_legacy_parts_have_no_gxid_and_an_unknown_one_phase_flag():
    a = TransactionAssembler(0, source_name="gpcdc", database="db")
    events = feed(a, w.relation(1, "public", "t", COLUMNS), w.begin(500, 9),
                  w.insert(1, ["1", "a", "t", "1", "1"]), w.commit(500, 520))
    assert events[-1][2]["gxid"] is None and events[-1][2]["one_phase"] is None
    assert events[1][2]["source"]["one_phase"] is None


def test_large_transactions_stream_with_bounded_buffer():
    a = TransactionAssembler(1, source_name="gpcdc", database="db", max_buffered=10)
    a.feed(w.relation(1, "public", "t", COLUMNS))
    held_back_max = 0
    out_total = []
    for payload in one_phase_txn(rows=35):
        out = a.feed(payload)
        out_total += out
        txn = a._txn
        if txn is not None and txn.pending is not None:
            held_back_max = max(held_back_max, len(txn.pending))
    assert held_back_max < 10
    kinds = [o.kind for o in out_total]
    assert kinds[0] == "begin" and kinds[-1] == "end" and kinds.count("row") == 35
    rows = [orjson.loads(o.value) for o in out_total if o.kind == "row"]
    assert all(r["source"]["one_phase"] is None for r in rows), "streamed rows cannot know the flag yet"
    assert orjson.loads(out_total[-1].value)["one_phase"] is True
    assert [r["source"]["seq"] for r in rows] == list(range(1, 36))


def test_coordinator_records():
    a = TransactionAssembler(-1, source_name="gpcdc", database="db")
    events = feed(a, w.begin(900, 3), w.message("gpcdc.ddl", '{"gxid":50,"statement":"CREATE TABLE x"}'),
                  w.message("gpcdc.commit", '{"gxid":50,"segments":[0,1]}'), w.commit(900, 950),
                  w.begin(960, 4), w.message("gpcdc.commit", '{"gxid":51}'), w.commit(960, 990))
    assert [(k, e["gxid"]) for k, _, e in events] == [("ddl", 50), ("commit", 50), ("commit", 51)]
    assert events[1][2]["segments"] == [0, 1] and events[2][2]["segments"] is None
    assert events[1][2]["all_parts_decoded"] is True, "each participant wrote its gxid marker in its part"
    assert events[0][2]["statement"] == "CREATE TABLE x" and events[0][2]["commit_lsn"] == 900
    resolved = orjson.loads(a.resolved(990, 1_795_000_000_000).value)
    assert resolved["resolved"] == 990 and resolved["segment"] == -1 and resolved["type"] == "resolved"
    assert resolved["resolved_ts_ms"] == 1_795_000_000_000


def test_protocol_violations():
    a = TransactionAssembler(0, source_name="gpcdc", database="db")
    with pytest.raises(ProtocolError, match="before its RELATION"):
        feed(a, w.begin(1, 1), w.insert(99, ["1"]))
    b = TransactionAssembler(0, source_name="gpcdc", database="db")
    with pytest.raises(ProtocolError, match="not a gxid"):
        feed(b, w.begin(1, 1), w.message("gpcdc.gxid", "x1"))
    c = TransactionAssembler(0, source_name="gpcdc", database="db")
    with pytest.raises(ProtocolError, match="commits at 5, but its BEGIN announced 1"):
        feed(c, w.begin(1, 1), w.commit(5, 6))
    e = TransactionAssembler(0, source_name="gpcdc", database="db")
    with pytest.raises(ProtocolError, match="TRUNCATE of relation 5 before its RELATION"):
        feed(e, w.begin(1, 1), w.truncate([5]))
    d = TransactionAssembler(0, source_name="gpcdc", database="db")
    with pytest.raises(ProtocolError, match="watermark inside"):
        feed(d, w.begin(1, 1))
        d.resolved(1)


def test_foreign_and_non_transactional_messages_are_ignored():
    a = TransactionAssembler(0, source_name="gpcdc", database="db")
    events = feed(a, w.begin(1, 1), w.message("other", "x"), w.message("gpcdc.gxid", "5", transactional=False),
                  w.commit(1, 2))
    assert events == []


def start_point(method="snapshot"):
    return StartPoint(method=method, created_at="t", snapshot=DistributedSnapshot(100, frozenset({90, 95})),
                      nodes=(NodeStart(-1, "s", 10, 10, None), NodeStart(0, "s", 10, 500, "snap")))


def test_distributed_snapshot_visibility():
    snap = start_point().snapshot
    assert snap.sees(89) and not snap.sees(90) and not snap.sees(100) and not snap.sees(150)


def test_snapshot_filter_drops_what_the_snapshot_sees():
    start = start_point()
    assert not start.captures(0, 400, gxid=89)
    assert start.captures(0, 400, gxid=95)  # running at the cut: committed after it
    assert start.captures(0, 400, gxid=100)
    assert not start.captures(0, 500, gxid=None) and start.captures(0, 501, gxid=None)  # by the node's cut LSN
    assert start_point("peaceful").captures(0, 1, gxid=1)


def test_assembler_applies_the_filter():
    a = TransactionAssembler(0, source_name="gpcdc", database="db", start=start_point())
    a.feed(w.relation(1, "public", "t", COLUMNS))
    before = feed(a, *one_phase_txn(xid=1, gxid=89, lsn=300))
    after = feed(a, *one_phase_txn(xid=2, gxid=95, lsn=400))
    assert before == [] and [k for k, _, _ in after] == ["begin", "row", "row", "end"]
    assert a.dropped_transactions == 1 and a.completed_end_lsn == 440


def test_start_point_round_trips_through_json():
    start = start_point()
    assert StartPoint.from_json(orjson.loads(orjson.dumps(start.to_json()))) == start


def test_a_joined_segment_is_captured_from_its_cut_and_stays_captured_when_repaired_later():
    import dataclasses

    from gpcdc_toolkit.protocol import Repair

    cut = DistributedSnapshot(120, frozenset({115}))
    joined = Repair(1, NodeStart(1, "s", 700, 710, None), cut, 900, "t", joined=True)
    assert Repair.from_json(orjson.loads(orjson.dumps(joined.to_json()))) == joined
    start = dataclasses.replace(start_point(), repairs=(joined,))
    assert [n.content for n in start.captured_nodes] == [-1, 0, 1]
    assert start.node(1).slot == "s" and start.node(1).consistent_lsn == 700
    assert not start.captures(1, 800, gxid=110) and start.captures(1, 800, gxid=115)  # by the joined cut
    assert start.captures(0, 800, gxid=110)  # another node: by the bootstrap's cut
    again = dataclasses.replace(joined, number=2, node=NodeStart(1, "s", 800, 810, None))
    assert [n.content for n in dataclasses.replace(start, repairs=(again,)).captured_nodes] == [-1, 0, 1]
    recorded_before = {k: v for k, v in joined.to_json().items() if k != "joined"}  # by a version without the field
    assert Repair.from_json(recorded_before).joined is False


def test_lsn_text():
    assert parse_lsn("16/B374D848") == 0x16B374D848 and format_lsn(0x16B374D848) == "16/B374D848"
    with pytest.raises(ValueError):
        parse_lsn("nope")


def test_dispatchers():
    assert Dispatcher("segment", 3).partitions_for("row", 2) == [2]
    assert Dispatcher("segment", 3).partitions_for("resolved", 1) == [1]
    assert Dispatcher("key", 4).partitions_for("row", 1) is None
    assert Dispatcher("key", 4).partitions_for("end", 1) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="unknown dispatcher"):
        Dispatcher("random", 3)


def test_an_unchanged_toasted_value_is_listed_apart_and_a_key_left_out_is_taken_from_the_old_row():
    a = TransactionAssembler(0, source_name="gpcdc", database="db")
    begin = [w.relation(1, "public", "t", COLUMNS), w.begin(500, 9), w.message("gpcdc.gxid", "43")]
    events = feed(a, *begin, w.update(1, ["5", "<toast>", "t", "1", "__gpcdc_unchanged_toast__"]), w.commit(500, 520))
    row = events[1][2]
    assert row["unchanged"] == ["name"] and "name" not in row["after"]
    assert row["after"]["amount"] == "__gpcdc_unchanged_toast__", "data equal to the old placeholder is data"
    # The key itself TOASTed and unchanged: from the old row when logged (REPLICA IDENTITY FULL) ...
    events = feed(a, w.begin(600, 10), w.message("gpcdc.gxid", "44"),
                  w.update(1, ["<toast>", "x", "t", "1", "1"], old=["7", "y", "t", "1", "1"], old_kind="O"),
                  w.commit(600, 620))
    row = events[1][2]
    assert row["after"]["id"] == 7 and "unchanged" not in row and events[1][1] == b'{"id":7}'
    # ... else the row cannot be named, and capture stops saying how to fix it.
    with pytest.raises(ProtocolError, match="leaves out its key column 'id'.*REPLICA IDENTITY FULL"):
        feed(a, w.begin(700, 11), w.message("gpcdc.gxid", "45"), w.update(1, ["<toast>", "x", "t", "1", "1"]))


def test_a_node_answered_by_another_server_is_named_so():
    from gpcdc_toolkit.protocol import NodeStart

    recorded = NodeStart(0, "s", 10, 10, None, system_identifier="7301", timeline=1)
    assert recorded.replaced_by("7301", 1) is None
    assert recorded.replaced_by("7301", 2).startswith("is on timeline 2, not 1: its mirror or standby was promoted")
    assert recorded.replaced_by("9999", 1).startswith("is another server (system identifier 9999, not 7301)")
    assert NodeStart(0, "s", 10, 10, None).replaced_by("9999", 3) is None  # an older start point recorded neither


def test_a_decision_naming_segments_the_start_point_lacks_stops_the_coordinators_capture():
    from gpcdc_toolkit.errors import ClusterChangedError
    from gpcdc_toolkit.protocol import UnknownNodesError

    a = TransactionAssembler(-1, source_name="gpcdc", database="db", start=start_point())
    feed(a, w.begin(900, 3), w.message("gpcdc.commit", '{"gxid":150,"segments":[0]}'), w.commit(900, 950))
    with pytest.raises(UnknownNodesError, match=r"gxid 151 has parts on segments \[1, 2\], which the pipeline's start "
                                                r"point does not list \(it captures segments \[0\]\)") as raised:
        feed(a, w.begin(960, 4), w.message("gpcdc.commit", '{"gxid":151,"segments":[0,1,2]}'), w.commit(960, 990))
    assert isinstance(raised.value, ClusterChangedError) and raised.value.exit_code == 5


def test_the_changes_that_stop_a_nodes_capture_are_said_with_the_fix():
    from gpcdc_toolkit.capture._changes import REBOOTSTRAP, added_nodes, node_change
    from gpcdc_toolkit.protocol import NodeStart

    start = NodeStart(1, "gpcdc_p", 10, 10, None, system_identifier="7301", timeline=1)
    same = {"system_identifier": "7301", "timeline": 1}
    assert node_change("segment 1", start, **same, slot_found=True, wal_status="reserved") is None
    assert node_change("segment 1", start, **same, slot_found=True, wal_status="unreserved") is None
    dropped = node_change("segment 1", start, **same, slot_found=False, wal_status=None)
    assert str(dropped) == ("slot gpcdc_p is missing on segment 1: it was dropped, so the changes since its "
                            "acknowledged position can no longer be decoded: capture it again with `gpcdc bootstrap "
                            f"repair --segment 1`, or {REBOOTSTRAP}")
    coordinator = NodeStart(-1, "gpcdc_p", 10, 10, None, system_identifier="7301", timeline=1)
    assert str(node_change("coordinator", coordinator, **same, slot_found=False, wal_status=None)).endswith(
        f"decoded: {REBOOTSTRAP}"), "the coordinator's records are not repaired: the pipeline is bootstrapped again"
    assert "was invalidated" in str(node_change("segment 1", start, **same, slot_found=True, wal_status="lost"))
    promoted = node_change("segment 1", start, system_identifier="7301", timeline=2, slot_found=False, wal_status=None)
    assert str(promoted).startswith("segment 1 is on timeline 2, not 1"), "the server's change is the cause to name"
    assert promoted.exit_code == 5
    assert added_nodes([-1, 0, 1], [NodeStart(c, "s", 1, 1, None) for c in (-1, 0, 1)]) is None
    assert "lists segments [2, 3]" in str(added_nodes([-1, 0, 1, 2, 3], [NodeStart(c, "s", 1, 1, None) for c in (-1, 0, 1)]))
