"""Why a row differs: the classification, free of I/O (``validate/_causes.py``), then
on real servers: a pipeline replayed into a target, the target written by hand and
the source written after the replay stopped; every differing row in rows.parquet,
each with its cause, none unexplained."""

import dataclasses
import html
import json
import uuid

import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit.validate._causes import Evidence, Gap, KeyEvent, cause_of, value_text
from gpcdc_toolkit.validate._diff import DifferingRow

T = "public.t"
COLUMNS = ("id", "v")


def event(gxid, v, *, applied=True, segment=0, offset=1):
    return KeyEvent(gxid, segment, offset, 1_000, None if v is None else {"id": "1", "v": v}, applied)


def test_each_cause_is_told_by_its_evidence():
    changed = DifferingRow("changed", ("1",), ("v",), ("1", "new"), ("1", "old"), 0, 0)
    # The key's last transaction is in the stream but not applied: the target is behind.
    behind = Evidence(events={(T, ("1",)): [event(5, "old"), event(6, "new", applied=False)]})
    assert cause_of(T, COLUMNS, changed, behind)[0] == "not_replayed"
    assert "1 source transactions of this key are not applied yet, the first (gxid 6" in cause_of(
        T, COLUMNS, changed, behind)[1]
    # Everything applied, and it leaves the row as the source has it: written on the target.
    applied = Evidence(events={(T, ("1",)): [event(5, "old"), event(6, "new")]})
    assert cause_of(T, COLUMNS, changed, applied)[0] == "outside_pipeline"
    # No event since the snapshot, which had the source's row: the same.
    untouched = Evidence(snapshot={(T, ("1",)): {"id": "1", "v": "new"}})
    assert cause_of(T, COLUMNS, changed, untouched) == (
        "outside_pipeline", "no source event wrote it since the initial snapshot, which the target loaded and leaves "
        "it as the source has it: the target was written outside the pipeline")
    # The stream leaves it otherwise, and lacks a part of its segment.
    stale = Evidence(events={(T, ("1",)): [event(5, "old")]},
                     gaps=[Gap("lost_in_stream", 1, "gxid 9's part on segment 1"),
                           Gap("lost_in_stream", 0, "gxid 7's part on segment 0")])
    assert cause_of(T, COLUMNS, changed, stale) == (
        "lost_in_stream", "the stream leaves it otherwise than the source has it, and lacks gxid 7's part on segment 0")
    poisoned = Evidence(events=stale.events, gaps=[Gap("set_aside", 0, "the message at offset 3")])
    assert cause_of(T, COLUMNS, changed, poisoned)[0] == "set_aside"
    # ... and lacks nothing of its segment: the toolkit cannot account for it.
    assert cause_of(T, COLUMNS, changed, Evidence(events=stale.events, gaps=stale.gaps[:1]))[0] == "unexplained"
    # A skipped DDL of the table comes first.
    skipped = Evidence(events=behind.events, skipped_ddl={T: ["ALTER TABLE t ADD COLUMN w int"]})
    assert cause_of(T, COLUMNS, changed, skipped)[0] == "skipped_ddl"


def test_rows_missing_and_extra_compare_the_implied_row_with_the_sources():
    missing = DifferingRow("missing", ("1",), source=("1", "a"), source_segment=0)
    extra = DifferingRow("extra", ("1",), target=("1", "a"), target_segment=1)
    deleted = Evidence(events={(T, ("1",)): [event(5, "a"), event(6, None)]})
    assert cause_of(T, COLUMNS, extra, deleted)[0] == "outside_pipeline"  # deleted by the stream, on the target again
    assert cause_of(T, COLUMNS, missing, deleted)[0] == "unexplained"  # the source has a row the stream deleted
    assert cause_of(T, COLUMNS, extra, Evidence())[0] == "outside_pipeline"  # no event, no snapshot row: inserted by hand
    assert cause_of(T, COLUMNS, missing, Evidence(snapshot={(T, ("1",)): {"id": "1", "v": "a"}}))[0] == \
        "outside_pipeline"


@given(st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.booleans()), min_size=1, max_size=8),
       st.sampled_from(["a", "b", None]))
def test_a_key_with_a_transaction_not_applied_is_behind_whatever_else_holds(history, source_value):
    events = [event(g, v, applied=applied) for g, (v, applied) in enumerate(history, start=1)]
    row = DifferingRow("changed" if source_value else "extra", ("1",), ("v",),
                       None if source_value is None else ("1", source_value), ("1", "zzz"), 0, 0)
    cause, detail = cause_of(T, COLUMNS, row, Evidence(events={(T, ("1",)): events}))
    if not all(applied for _, applied in history):
        assert cause == "not_replayed" and f"{sum(not a for _, a in history)} source transactions" in detail
    else:
        assert cause == ("outside_pipeline" if history[-1][0] == source_value else "unexplained")


def test_stream_values_read_as_postgresql_prints_them():
    assert [value_text(v) for v in (None, True, False, 42, "x", 1.5)] == [None, "t", "f", "42", "x", "1.5"]


@pytest.mark.parametrize("replay_target", ["greenplum"], indirect=True)
def test_every_differing_row_is_written_with_its_cause_and_none_is_unexplained(source, replay_target):
    from gpcdc_toolkit.bootstrap import bootstrap
    from gpcdc_toolkit.capture import wait_until_acknowledged
    from gpcdc_toolkit.cluster import Session
    from gpcdc_toolkit.replay import Replayer
    from gpcdc_toolkit.validate import validate

    target, config, pipeline, group = replay_target
    table = f'"Why {uuid.uuid4().hex[:4]}"'
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert(table, [{"id": i, "v": "snap"} for i in range(20)])
    bootstrap(source, pipeline, "snapshot")
    group.start()
    with Session(source) as session, session.transaction() as tx:
        tx.update(table, {"id": 1}, {"v": "streamed"})
        tx.insert(table, [{"id": 100, "v": "streamed"}])
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config) as replayer:
        replayer.run()
    # By hand on the target: a row changed, one deleted, one added.
    with Session(target.cluster()) as session, session.transaction() as tx:
        tx.update(table, {"id": 1}, {"v": "by hand"})
        tx.delete(table, {"id": 2})
        tx.insert(table, [{"id": 500, "v": "by hand"}])
    # On the source after the replay stopped: captured, not applied.
    with Session(source) as session, session.transaction() as tx:
        tx.update(table, {"id": 3}, {"v": "later"})
        tx.delete(table, {"id": 4})
        tx.insert(table, [{"id": 200, "v": "later"}])
    wait_until_acknowledged(source, pipeline.slot)

    run = validate(config.with_settings({"validate.expectations": False}), tables=[table], syncpoint=False,
                   source=source, target=target.cluster())
    assert not run.equal
    rows = pq.read_table(run.output / "rows.parquet").to_pylist()
    got = {(r["kind"], json.loads(r["key"])["id"], r["cause"]) for r in rows}
    assert got == {("changed", "1", "outside_pipeline"), ("missing", "2", "outside_pipeline"),
                   ("extra", "500", "outside_pipeline"), ("changed", "3", "not_replayed"),
                   ("extra", "4", "not_replayed"), ("missing", "200", "not_replayed")}
    assert len(rows) == 6
    changed = next(r for r in rows if json.loads(r["key"]) == {"id": "1"})
    assert changed["changed_columns"] == ["v"] and json.loads(changed["source"]) == {"id": "1", "v": "streamed"}
    assert json.loads(changed["target"]) == {"id": "1", "v": "by hand"} and changed["key_text"] == "id=1"
    from gpcdc_toolkit.cluster import segment_for

    # Where each side holds the row: its own routing over its own segments.
    assert changed["source_segment"] == segment_for([1], source.segment_count)
    assert changed["target_segment"] == segment_for([1], target.cluster().segment_count)
    summary = json.loads((run.output / "summary.json").read_text())
    assert summary["causes"] == {"not_replayed": 3, "outside_pipeline": 3}
    # The source events of each key, as data: key 3 updated after the replay stopped, key 1 before.
    events = {json.loads(r["key"])["id"]: json.loads(r["events"]) for r in rows}
    assert [e["applied"] for e in events["3"]] == [False] and events["500"] == []
    assert [e["applied"] for e in events["1"]] == [True] and events["1"][0]["segment"] == changed["source_segment"]
    # ... and, for the transaction browser, as findings of the transactions that wrote them.
    from gpcdc_toolkit.report import TransactionBrowser
    from gpcdc_toolkit.validate import latest_differences

    named = latest_differences(config)
    assert set(named["rule"]) == {"difference: not_replayed", "difference: outside_pipeline"}
    assert set(named.loc[named["rule"] == "difference: not_replayed", "gxid"]) == {events["3"][0]["gxid"]}
    assert set(named.loc[named["severity"] == "warning", "gxid"]) == {events["3"][0]["gxid"]}  # not applied
    nothing = {c: pd.Series(dtype=object) for c in ("kind", "table_schema", "table_name", "partition", "offset", "gxid")}
    browser = TransactionBrowser(pd.DataFrame(nothing), pd.DataFrame(nothing)).with_findings(named)
    assert browser.rules == ["difference: not_replayed", "difference: outside_pipeline"]
    assert any(line.startswith("differing rows by cause: 3 not_replayed, 3 outside_pipeline") for line in run.lines())
    # The investigate notebook, as a job, from this failed run to each cause and what to do.
    from gpcdc_toolkit.report import run_notebook
    from gpcdc_toolkit.validate._causes import REMEDIES

    done = run_notebook(config.with_settings({"report.dir": str(config.work_dir / f"reports-{table[5:9]}")}),
                        "investigate", {})
    assert (done.status, done.error) == ("ok", None)  # every row explained: exit 0
    assert dict(done.headline.figures) == {"differing rows": 6, "causes": 2, "unexplained": 0,
                                           "source transactions behind them": 2}, done.headline.figures
    page = done.report.read_text()
    assert all(html.escape(REMEDIES[c], quote=False) in page for c in ("not_replayed", "outside_pipeline"))
    assert str(run.output) in page and "DELETE FROM" in page  # the run it started from, and its fix


def copy_topics(kafka, prefix, copy, rewrite):
    """The pipeline's topics copied under another prefix, message for message and
    partition for partition, each value as ``rewrite(decoded value, raw value)`` gives
    it (None: left out)."""
    import orjson
    from confluent_kafka import Producer

    from gpcdc_toolkit.capture import ensure_topics
    from gpcdc_toolkit.ingest import read_to_end
    from gpcdc_toolkit.protocol import Topics

    source, target = Topics(prefix), Topics(copy)
    partitions = {m.partition() for m in read_to_end(kafka, source.changes)}
    ensure_topics(kafka, target, max(partitions) + 1)
    producer = Producer({**kafka, "enable.idempotence": True})
    for topic, to in ((source.changes, target.changes), (source.dtx, target.dtx)):
        for message in read_to_end(kafka, topic):
            value = rewrite(orjson.loads(message.value()), message.value())
            if value is not None:
                producer.produce(to, value, key=message.key(), partition=message.partition())
    assert producer.flush(30) == 0


@pytest.mark.parametrize("replay_target", ["greenplum"], indirect=True)
@pytest.mark.parametrize("damage", ["lost", "poison"])
def test_rows_a_damaged_part_wrote_are_named_so_and_those_held_behind_it_not_replayed(
        source, replay_target, work_dir, damage):
    """A copy of the topics where one two-phase transaction's part on segment 0 is left
    out (its BEGIN, rows and END), or its row replaced by bytes that are not JSON (a
    poison message, which the replayer sets aside), replayed into the target: the
    replay stops before that transaction. Its row on segment 0 is lost in the stream
    (the commit record names the part that never came) or set aside (quarantine.jsonl
    names the message); its part on the other segment, and every later transaction,
    are in the stream and not applied."""
    import shutil

    from gpcdc_toolkit.bootstrap import bootstrap
    from gpcdc_toolkit.capture import wait_until_acknowledged
    from gpcdc_toolkit.cluster import Session, segment_for
    from gpcdc_toolkit.connect import kafka_client_settings
    from gpcdc_toolkit.errors import GpcdcError
    from gpcdc_toolkit.replay import Replayer
    from gpcdc_toolkit.validate import validate

    target, config, pipeline, group = replay_target
    table = f'"Lost {uuid.uuid4().hex[:4]}"'
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
    bootstrap(source, pipeline, "snapshot")
    group.start()
    on = {s: [i for i in range(1000) if segment_for([i], source.segment_count) == s][:3] for s in (0, 1)}
    with Session(source) as session:
        with session.transaction() as tx:
            tx.insert(table, [{"id": i, "v": "first"} for i in on[0][:1] + on[1][:1]])
        with session.transaction() as damaged:  # its part on segment 0 is damaged in the copy
            damaged.insert(table, [{"id": i, "v": "damaged"} for i in on[0][1:2] + on[1][1:2]])
        with session.transaction() as tx:
            tx.insert(table, [{"id": i, "v": "after"} for i in on[0][2:] + on[1][2:]])
    wait_until_acknowledged(source, pipeline.slot)
    group.stop()

    def rewrite(value, raw):
        where = value.get("source") or value
        if where.get("segment") != 0 or where.get("gxid") != damaged.gxid:
            return raw
        if damage == "lost":
            return None
        return b"\xff{not json" if "after" in value else raw  # the row event only

    copy = f"c{uuid.uuid4().hex[:8]}"
    copy_topics(kafka_client_settings(config), config.kafka.topic_prefix, copy, rewrite)
    shutil.copytree(pipeline.directory, pipeline.directory.parent / copy)
    copied = config.with_settings({"kafka.topic_prefix": copy, "validate.expectations": False})
    with Replayer(copied) as replayer:
        try:
            replayer.run()
        except GpcdcError:
            pass  # the part proven missing or damaged, or still waited for: it stops before that transaction
    run = validate(copied, tables=[table], syncpoint=False, source=source, target=target.cluster())
    causes = {json.loads(r["key"])["id"]: r["cause"] for r in pq.read_table(run.output / "rows.parquet").to_pylist()}
    named = {"lost": "lost_in_stream", "poison": "set_aside"}[damage]
    assert causes == {str(on[0][1]): named, str(on[1][1]): "not_replayed",
                      **{str(i): "not_replayed" for i in on[0][2:] + on[1][2:]}}
    detail = next(r["cause_detail"] for r in run.differing_rows() if r["cause"] == named)
    assert (f"lacks gxid {damaged.gxid}'s part on segment 0, which its commit record names" if damage == "lost" else
            "partition 0, set aside as malformed") in detail


@pytest.mark.parametrize("replay_target", ["greenplum"], indirect=True)
def test_rows_of_a_table_whose_ddl_the_replay_skipped_are_named_so(source, replay_target):
    """A column added on the source and, by hand, on the target with another default;
    the replay told to skip that DDL (`--skip-ddl`): the rows differ in that column, and
    each is named skipped_ddl with the statement."""
    from gpcdc_toolkit.bootstrap import bootstrap
    from gpcdc_toolkit.capture import wait_until_acknowledged
    from gpcdc_toolkit.cluster import Session
    from gpcdc_toolkit.replay import Replayer
    from gpcdc_toolkit.validate import validate

    target, config, pipeline, group = replay_target
    table = f"skipped_{uuid.uuid4().hex[:4]}"
    with Session(source) as session:
        session.ddl(f"CREATE TABLE {table} (id int PRIMARY KEY, v text) DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert(table, [{"id": i, "v": "x"} for i in range(6)])
    bootstrap(source, pipeline, "snapshot")
    group.start()
    with Replayer(config) as replayer:  # the initial load
        replayer.run()
    with Session(source) as session:
        added = session.ddl(f"ALTER TABLE {table} ADD COLUMN w int DEFAULT 7")
    with Session(target.cluster()) as session:
        session.ddl(f"ALTER TABLE {table} ADD COLUMN w int DEFAULT 0")
    wait_until_acknowledged(source, pipeline.slot)
    with Replayer(config, settings=dataclasses.replace(config.replay, skip_ddl=frozenset({added}))) as replayer:
        replayer.run()
    run = validate(config.with_settings({"validate.expectations": False}), tables=[table], syncpoint=False,
                   source=source, target=target.cluster())
    rows = run.differing_rows()
    assert sorted(json.loads(r["key"])["id"] for r in rows) == [str(i) for i in range(6)]
    assert {(r["kind"], tuple(r["changed_columns"]), r["cause"]) for r in rows} == {("changed", ("w",), "skipped_ddl")}
    assert "ADD COLUMN w int DEFAULT 7" in rows[0]["cause_detail"]


@given(st.lists(st.integers(0, 60), unique=True, max_size=6), st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60)),
       unique_by=lambda t: t, max_size=6), st.sampled_from([0, 1, None]))
def test_a_truncate_is_a_write_that_leaves_a_key_no_row_in_its_segments_order(own, truncates, home):
    from gpcdc_toolkit.validate._evidence import _fold_truncates

    key = (T, ("1",))
    # The key lives on segment 1; messages have offsets of their own (even: the key's, odd: truncates').
    events = [(10 + o, 1, 2 * o, 1_000 + o, {"id": "1", "v": str(o)}) for o in sorted(own)]
    parts = [(100 + i, s, 2 * o + 1, 2_000 + o) for i, (s, o) in enumerate(truncates)]
    found = {key: list(events)} if events else {}
    _fold_truncates(found, key, parts, home)
    merged = found.get(key, [])
    segment = home if home is not None else (1 if events else None)
    assert [e for e in merged if e[4] is not None] == events  # the key's own events, in their order
    folded = [e for e in merged if e[4] is None]
    if segment is not None:
        assert sorted(e[:4] for e in folded) == sorted(p for p in parts if p[1] == segment)
        for i, event in enumerate(merged):  # on the key's segment, in offset order
            later = [e for e in merged[i + 1:] if e[1] == segment]
            assert event[1] != segment or all(e[2] > event[2] for e in later)
    else:  # a key the stream never wrote: each truncate once
        assert sorted(e[0] for e in folded) == sorted({p[0] for p in parts})
    if folded and segment is not None and merged[-1][4] is None:
        assert cause_of(T, COLUMNS, DifferingRow("extra", ("1",), target=("1", "x"), target_segment=0),
                        Evidence(events={key: [KeyEvent(g, s, o, ts, img, True) for g, s, o, ts, img in merged]}))[0] \
            == "outside_pipeline"  # the stream's last word is "no row", as the source: the target's row is extra


def test_a_gap_in_a_numbered_streams_part_numbers_names_the_parts_lost_one_phase_ones_too():
    from gpcdc_toolkit.validate._evidence import PartNumbers

    numbers = PartNumbers()
    stream = [("pipeline", {"segment": 0, "parts": 0}), ("end", {"segment": 0, "number": 1}),
              ("end", {"segment": 0, "number": 2}), ("end", {"segment": 0, "number": 2}),  # a resend
              ("end", {"segment": 0, "number": 5}),  # 3 and 4 lost: one-phase or not, no record needed
              ("resolved", {"segment": 0, "parts": 5}), ("resolved", {"segment": 1, "parts": 7}),
              ("end", {"segment": 1, "number": 8}), ("resolved", {"segment": 1, "parts": 9}),  # 9 lost before it
              ("lost", {"segment": 1}), ("end", {"segment": 1, "number": 30}),  # counted afresh after a mark
              ("end", {"segment": 2, "number": None}), ("end", {"segment": 2})]  # not numbered: nothing to tell
    for offset, (kind, value) in enumerate(stream):
        numbers.feed(kind, value, offset)
    assert [(g.cause, g.segment, g.what.split(" (")[0]) for g in numbers.gaps] == [
        ("lost_in_stream", 0, "parts 3 to 4 of segment 0"), ("lost_in_stream", 1, "part 9 of segment 1")]
    assert "before offset 4" in numbers.gaps[0].what
    row = DifferingRow("missing", ("1",), source=("1", "a"), source_segment=0)
    assert cause_of(T, COLUMNS, row, Evidence(gaps=numbers.gaps)) == (
        "lost_in_stream", "the stream leaves it otherwise than the source has it, and lacks parts 3 to 4 of segment 0 "
                          "(a gap in its part numbers before offset 4: one-phase parts are named by no commit record)")
