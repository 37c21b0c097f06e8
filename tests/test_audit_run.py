"""Audits on a real broker: scheduled runs that carry open transactions, an archive,
and the command line's exit statuses."""

import dataclasses
import json
import os
import subprocess
import sys
import uuid

import orjson
import pytest

from gpcdc_toolkit.archive import read_archive, write_archive
from gpcdc_toolkit.audit import ADVICE, run_audit, warm_up
from gpcdc_toolkit.audit._warm import warm_stream
from gpcdc_toolkit.capture import ensure_topics
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.ingest import SparkServer
from gpcdc_toolkit.protocol import Topics, problem_of

from ._audit_stream import StreamBuilder
from ._spark import nothing_cached

ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPCDC_")}


@pytest.fixture
def topics(broker, work_dir):
    """A fresh pipeline prefix on the broker with its topics, and its configuration."""
    prefix = f"u{uuid.uuid4().hex[:8]}"
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": prefix}, environ={})
    kafka = kafka_client_settings(config)
    ensure_topics(kafka, Topics(prefix), 3)
    return config, kafka, StreamBuilder(prefix)


def found(result):
    return sorted((f["rule"], f["gxid"], f["segments"][0]) for f in result.findings.collect())


def watermarks(b, ts, held=()):
    for node in (-1, 0, 1, 2):
        b.watermark(node, ts // 100, ts, prepared=held if node == 1 else (), prepared_ts=ts)


def test_a_transaction_straddling_scheduled_runs_is_neither_missing_nor_forgotten(spark, topics):
    config, kafka, b = topics
    # Run 1: gxid 1's part on segment 1 has not come, and segment 1 still holds it prepared.
    b.record(1, [0, 1], 10, 1000).record(2, [0, 1], 20, 1010)
    b.part(0, 1, 100, 1001, rows=[("t", 1)]).part(0, 2, 110, 1011, rows=[("t", 2)])
    b.part(1, 2, 100, 1011, rows=[("t", 3)])
    watermarks(b, 5000, held=[1])
    b.produce(kafka)
    assert found(run_audit(spark, config, since_last=True)) == [("late_part", 1, 1)]
    # Run 2: it comes; gxid 3's part on segment 2 never will (segment 2 passed it, holding nothing).
    b.part(1, 1, 120, 5001, rows=[("t", 4)]).record(3, [0, 2], 30, 5002).part(0, 3, 120, 5003, rows=[("t", 5)])
    watermarks(b, 9000)
    b.produce(kafka)
    assert found(run_audit(spark, config, since_last=True)) == [("missing_part", 3, 2)]
    # Run 3: nothing new but watermarks: nothing reported again.
    watermarks(b, 9500)
    b.produce(kafka)
    assert found(run_audit(spark, config, since_last=True)) == []
    # A resend of a transaction an earlier run read is a duplicate, not a commit out of order.
    b.part(0, 2, 110, 1011, rows=[("t", 2)])
    b.produce(kafka)
    assert found(run_audit(spark, config, since_last=True)) == [("duplicate_events", None, 0)]


def test_an_archive_gives_the_same_findings_as_kafka_and_grows_by_what_is_new(spark, topics, tmp_path):
    config, kafka, b = topics
    b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001).part(1, 1, 100, 1001, count=2)
    watermarks(b, 5000)
    b.produce(kafka)
    first = write_archive(config, tmp_path / "archive")
    b.record(2, [0, 2], 20, 6000).part(0, 2, 110, 6001)
    watermarks(b, 9000)
    b.produce(kafka)
    second = write_archive(config, tmp_path / "archive")
    assert (first.events, second.events) == (15, 8)  # the first with the 4 pipeline markers
    assert read_archive(spark, tmp_path / "archive").count() == 23
    from_kafka = found(run_audit(spark, config, write=False))
    assert from_kafka == [("damaged_part", 1, 1), ("missing_part", 2, 2)]
    assert found(run_audit(spark, config, archive=tmp_path / "archive", write=False)) == from_kafka


def gpcdc(config, *args):
    return subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(config.work_dir),
                           "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
                           "--kafka-topic-prefix", config.kafka.topic_prefix, *args],
                          env=ENV, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


@pytest.fixture
def served(topics, tmp_path):
    """``topics`` with a work directory of its own whose Spark Connect server runs: the
    commands share its JVM (``tests/test_spark_server.py`` runs them without one too)."""
    config, kafka, b = topics
    server = SparkServer(tmp_path / "served")
    try:
        server.up("local[2]")
        yield dataclasses.replace(config, work_dir=tmp_path / "served"), kafka, b
    finally:
        server.down()


@pytest.mark.spark_server
def test_the_command_exits_0_when_clean_and_1_on_findings(served, tmp_path):
    config, kafka, b = served
    b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001).part(1, 1, 100, 1001)
    watermarks(b, 5000)
    b.produce(kafka)
    clean = gpcdc(config, "audit")
    assert clean.returncode == 0, clean.stderr
    assert "no findings" in clean.stdout
    b.record(2, [0, 2], 20, 6000).part(0, 2, 110, 6001)  # gxid 2's part on segment 2 still held prepared: late
    for node in (-1, 0, 1, 2):
        b.watermark(node, 65, 6500, prepared=[2] if node == 2 else (), prepared_ts=6500)
    b.produce(kafka)
    assert gpcdc(config, "audit").returncode == 0  # late is info
    failing = gpcdc(config, "audit", "--fail-on", "info")
    assert failing.returncode == 1, failing.stderr
    assert "late_part" in failing.stdout
    out = failing.stdout.strip().splitlines()[-1].rsplit(" ", 1)[-1]
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["summary"] == [{"rule": "late_part", "severity": "info", "count": 1}]
    rows = [json.loads(line) for line in open(os.path.join(out, "findings.json"))]
    assert [(r["rule"], r["gxid"], r["segments"]) for r in rows] == [("late_part", 2, [2])]
    assert os.path.isdir(os.path.join(out, "findings.parquet"))


def test_the_command_exits_2_in_one_line_when_it_cannot_run_before_any_spark_session(topics, tmp_path):
    config, _kafka, _b = topics
    config = dataclasses.replace(config, work_dir=tmp_path / "work")
    nothing = gpcdc(config, "audit", "--archive", str(tmp_path / "none"))
    assert nothing.returncode == 2
    assert nothing.stderr.strip().splitlines() == [
        f"gpcdc: audit could not run: {tmp_path / 'none'} holds no archive runs: "
        "write one with `gpcdc archive --to PATH` first"]
    both = gpcdc(config, "audit", "--since-last", "--to", "2026-01-01T00:00:00")
    assert both.returncode == 2 and "either --since-last or --from/--to" in both.stderr
    elsewhere = gpcdc(dataclasses.replace(config, kafka=dataclasses.replace(config.kafka, topic_prefix="nosuch")),
                      "audit")
    assert elsewhere.returncode == 2
    assert elsewhere.stderr.strip().splitlines()[-1].startswith(
        "gpcdc: audit could not run: cannot read topic 'nosuch.changes'")
    prefix = f"e{uuid.uuid4().hex[:8]}"
    ensure_topics({"bootstrap.servers": config.kafka.bootstrap_servers}, Topics(prefix), 3)
    empty = gpcdc(dataclasses.replace(config, kafka=dataclasses.replace(config.kafka, topic_prefix=prefix)), "audit")
    assert empty.returncode == 2
    assert empty.stderr.strip().splitlines()[-1] == (
        f"gpcdc: audit could not run: topics '{prefix}.changes' and '{prefix}.dtx' were never written to, so there "
        "is nothing to audit: give the kafka.topic_prefix of a pipeline that was bootstrapped")
    backwards = gpcdc(config, "audit", "--from", "2026-01-02T00:00:00", "--to", "2026-01-01T00:00:00")
    assert backwards.returncode == 2 and "give a --to later than --from" in backwards.stderr
    # No session was started: a local one writes its JVM's output to the command's log.
    assert not (config.work_dir / "logs" / "gpcdc-audit.log").exists()


def test_the_stream_invariants_join_the_findings_as_failed_expectations(spark, topics):
    config, kafka, b = topics
    b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001, rows=[("t", 1), ("t", 2)]).part(1, 1, 100, 1001)
    watermarks(b, 5000)
    b.partitions[(b.changes, 0)][2][1]["op"] = "x"  # the first row event: an operation the protocol lacks
    _key, value, ts = b.partitions[(b.changes, 1)][2]
    b.partitions[(b.changes, 1)][2] = (None, value, ts)  # the only row event of segment 1's part: no key
    b.produce(kafka)
    result = run_audit(spark, config, write=False)
    rules = {f["rule"]: f for f in result.findings.collect()}
    assert set(rules) == {"expect_column_values_to_be_in_set(op)", "expect_column_values_to_be_in_set(keys)"}
    # Every check that ran is listed with its count, those that found nothing too.
    checks = {(check, source): n for check, source, n in result.checks}
    assert len(checks) == len(result.checks) and {c for c, source in checks if source == "rules"} == set(ADVICE)
    assert {source for _c, source in checks} >= {"rules", "stream_events", "stream_tables", "marked_stream"}
    assert checks[("expect_column_values_to_be_in_set(op)", "stream_events")] == 1
    assert checks[("expect_column_values_to_be_in_set(keys)", "stream_tables")] == 1
    assert sum(checks.values()) == 2
    assert "1 of 3 values unexpected, e.g. ['x']" in rules["expect_column_values_to_be_in_set(op)"]["evidence"]
    assert "['mixed']" in rules["expect_column_values_to_be_in_set(keys)"]["evidence"]


def test_only_a_one_phase_part_may_carry_no_gxid(spark, topics):
    """Citus commits a single-shard write in one phase with no gxid: the stream's
    invariants accept that, and still want one on every part that waits for a record."""
    config, kafka, b = topics
    b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001).part(1, 1, 100, 1001).part(2, None, 110, 1002, one_phase=True)
    watermarks(b, 5000)
    _key, end, _ts = b.partitions[(b.changes, 1)][-2]  # segment 1's END, before its watermark
    assert end["status"] == "END"
    end["gxid"] = None
    b.produce(kafka)
    rules = {f["rule"]: f for f in run_audit(spark, config, write=False).findings.collect()}
    # Of the record and the two ENDs that wait for it (not the one-phase END), one has no gxid.
    assert "1 of 3 values unexpected" in rules["expect_column_values_to_not_be_null(gxid)"]["evidence"]


def test_an_audit_leaves_nothing_in_the_sessions_cache(spark, topics):
    config, kafka, b = topics
    b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001).part(1, 1, 100, 1001, count=2)
    watermarks(b, 5000)
    b.produce(kafka)
    spark.catalog.clearCache()
    for since_last in (False, True):
        assert found(run_audit(spark, config, since_last=since_last, write=False)) == [("damaged_part", 1, 1)]
        assert nothing_cached(spark)


def test_the_result_charts_findings_delay_and_completeness(spark, topics):
    config, kafka, b = topics
    b.record(1, [0, 1], 10, 1000).part(0, 1, 100, 1001).part(1, 1, 100, 1001, count=2)
    b.record(2, [0, 2], 20, 1010).part(0, 2, 110, 1011)
    watermarks(b, 5000)
    b.produce(kafka)
    figures = run_audit(spark, config, write=False).figures()
    assert set(figures) == {"findings_over_time", "watermark_delay", "completeness"}
    completeness = {bar.name: list(bar.y) for bar in figures["completeness"].data}
    assert completeness == {"whole": [2, 0, 0], "damaged": [0, 1, 0], "missing": [0, 0, 1], "late": [0, 0, 0]}
    assert {trace.name for trace in figures["watermark_delay"].data} == {"coordinator", "segment 0", "segment 1",
                                                                        "segment 2"}
    assert sorted(trace.name for trace in figures["findings_over_time"].data) == ["damaged_part", "missing_part"]


def test_the_warm_up_audits_a_stream_of_its_own_and_leaves_nothing_behind(spark, work_dir):
    """The server's warm-up (`gpcdc spark up --warm`, the demo): an audit as the notebook
    runs one, of a stream with a part sent twice, a part still held prepared, and a DDL."""
    config = load_config({"work_dir": str(work_dir), "kafka.topic_prefix": "mine"}, environ={})
    messages = warm_stream()
    assert all(problem_of(orjson.loads(m.value)) is None for m in messages)
    spark.catalog.clearCache()
    result = warm_up(spark, config)
    assert result.summary == [("duplicate_events", "info", 1), ("late_part", "info", 1)]
    assert result.events == len(messages)
    assert result.output is not None and not result.output.exists()  # its work directory is removed
    assert not (work_dir / "audit" / "mine").exists() and nothing_cached(spark)
