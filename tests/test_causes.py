"""Why a row differs: the classification, free of I/O (``validate/_causes.py``), then
on real servers: a pipeline replayed into a target, the target written by hand and
the source written after the replay stopped; every differing row in rows.parquet,
each with its cause, none unexplained."""

import json
import uuid

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
    assert changed["source_segment"] == changed["target_segment"] is not None
    summary = json.loads((run.output / "summary.json").read_text())
    assert summary["causes"] == {"not_replayed": 3, "outside_pipeline": 3}
    assert any(line.startswith("differing rows by cause: 3 not_replayed, 3 outside_pipeline") for line in run.lines())
