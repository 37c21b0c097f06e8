"""The toolkit's Spark reads (its own and Spark's Kafka source) against a real broker and a
local Spark session."""

import uuid

import orjson
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from gpcdc_toolkit import ConfigError
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.ingest import end_offsets
from gpcdc_toolkit.ingest.spark import (
    IncrementalRead,
    read_changes,
    read_transactions,
    read_watermarks,
    stream_changes,
)
from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.validate import read_captured
from gpcdc_toolkit.workload import WorkloadSpec, reset_tables, run_workload

BASE_MS = 1_700_000_000_000


def row_event(i, segment):
    return {"before": None, "after": {"id": i, "v": f"v{i}"},
            "source": {"segment": segment, "gxid": 1000 + i, "txId": i, "commit_lsn": 10_000 + i,
                       "ts_ms": BASE_MS + i, "schema": "public", "table": "t", "seq": 1, "one_phase": True},
            "op": "c", "ts_ms": BASE_MS + i, "transaction": {"id": f"{segment}:{i}", "total_order": 1}}


@pytest.fixture
def topics(broker, work_dir):
    """A fresh changes topic of 3 partitions; produce(n) appends n row events, i-th to partition i % 3,
    with Kafka timestamps BASE_MS + i."""
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"s{uuid.uuid4().hex[:8]}"}, environ={})
    names = Topics(config.kafka.topic_prefix)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    for future in admin.create_topics([NewTopic(names.changes, 3, 1), NewTopic(names.dtx, 1, 1)]).values():
        future.result(10)
    # Idempotent: a batch retried while the new topic elects its leader keeps its place,
    # so offsets follow the order of production, as the tests below expect.
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, "enable.idempotence": True})
    produced = [0]

    def produce(n, corrupt=()):
        for i in range(produced[0], produced[0] + n):
            value = b"{broken" if i in corrupt else orjson.dumps(row_event(i, i % 3))
            producer.produce(names.changes, value, orjson.dumps({"id": i}), partition=i % 3, timestamp=BASE_MS + i)
        produced[0] += n
        assert producer.flush(10) == 0

    return config, produce


def test_batch_counts_and_contents_per_partition(spark, topics):
    config, produce = topics
    produce(3000)
    df = read_changes(spark, config)
    counts = {r["partition"]: r["count"] for r in df.groupBy("partition").count().collect()}
    assert counts == {0: 1000, 1: 1000, 2: 1000}
    rows = df.where("offset = 5 AND partition = 2").collect()
    assert len(rows) == 1
    r = rows[0]
    assert (r.kind, r.segment, r.gxid, r.after["id"], r.after["v"], r.key) == ("row", 2, 1017, "17", "v17", '{"id":17}')
    ids = sorted(int(r.after["id"]) for r in df.select("after").collect())
    assert ids == list(range(3000))


def test_large_ranges_split_into_several_spark_partitions(spark, topics):
    config, produce = topics
    produce(900)
    df = (spark.read.format("gpcdc").option("kafka.bootstrap.servers", config.kafka.bootstrap_servers)
          .option("topic", Topics(config.kafka.topic_prefix).changes).option("maxRecordsPerPartition", "100").load())
    assert df.rdd.getNumPartitions() == 9
    assert df.count() == 900 and df.select("offset", "partition").distinct().count() == 900


@pytest.mark.parametrize("source", ["gpcdc", "kafka"])
def test_the_helpers_split_long_ranges_into_tasks_with_either_source(spark, topics, monkeypatch, source):
    """A topic of 3 partitions read by more tasks than 3 where the ranges are long (both
    sources split every SPLIT offsets), each message once."""
    from gpcdc_toolkit.ingest import _spark, _spark_source

    config, produce = topics
    produce(900)
    monkeypatch.setattr(_spark, "SPLIT", 100)
    monkeypatch.setattr(_spark_source, "SPLIT", 100)
    df = read_changes(spark, config, source=source)
    assert df.rdd.getNumPartitions() == 9
    assert df.count() == 900 and df.select("offset", "partition").distinct().count() == 900


def test_windows_by_offset_and_by_time(spark, topics):
    config, produce = topics
    produce(300)
    by_offset = read_changes(spark, config, starting_offsets={0: 10, 1: -2, 2: -1}, ending_offsets={0: 20, 1: 5, 2: -1})
    got = {(r.partition, r.offset) for r in by_offset.select("partition", "offset").collect()}
    assert got == {(0, o) for o in range(10, 20)} | {(1, o) for o in range(5)}
    by_time = read_changes(spark, config, starting_timestamp=BASE_MS + 30, ending_timestamp=BASE_MS + 60)
    ids = sorted(int(r.after["id"]) for r in by_time.select("after").collect())
    assert ids == list(range(30, 60))


@pytest.mark.parametrize("source", ["gpcdc", "kafka"])
def test_a_batch_dataframe_reads_the_window_it_was_made_with(spark, topics, source):
    """Its ends are Kafka's when the DataFrame is made: each action on it reads the same
    messages, whatever was produced since."""
    config, produce = topics
    produce(30)
    df = read_changes(spark, config, source=source)
    produce(30)
    assert df.count() == 30
    assert sorted(int(r.after["id"]) for r in df.select("after").collect()) == list(range(30))


def test_corrupt_messages_surface_and_the_rest_loads(spark, topics):
    config, produce = topics
    produce(30, corrupt={4, 13})
    df = read_changes(spark, config)
    bad = df.where("_corrupt_record IS NOT NULL").select("partition", "offset", "_corrupt_record").collect()
    assert sorted((r.partition, r.offset, r._corrupt_record) for r in bad) == [(1, 1, "{broken"), (1, 4, "{broken")]
    assert df.where("kind = 'row'").count() == 28


def test_incremental_reads_resume_since_the_last_run(spark, topics):
    config, produce = topics
    produce(60)
    run = IncrementalRead(spark, config, f"resume-{uuid.uuid4().hex[:6]}")
    assert run.changes().count() == 60
    run.commit()
    produce(15)
    again = IncrementalRead(spark, config, run.position_file.stem)
    df = again.changes()
    assert sorted(int(r.after["id"]) for r in df.select("after").collect()) == list(range(60, 75))
    # Not committed: the next run reads the same again.
    assert IncrementalRead(spark, config, run.position_file.stem).changes().count() == 15


def test_streaming_available_now_processes_everything_once_across_runs(spark, topics, tmp_path):
    config, produce = topics
    produce(90)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run(limit=None):
        query = (stream_changes(spark, config, max_offsets_per_trigger=limit).writeStream.format("parquet")
                 .option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        assert query.awaitTermination(120), "the query did not finish within 120 s"
        assert query.exception() is None
        return query

    first = run(limit=40)
    assert len([p for p in first.recentProgress if p["numInputRows"] > 0]) >= 3  # 90 rows, 40 per trigger
    produce(30)
    run()
    ids = [int(r.after["id"]) for r in spark.read.parquet(out).select("after").collect()]
    assert sorted(ids) == list(range(120)), "each message exactly once across the two runs"


def run_explore_notebook(config, tmp_path, row_events):
    from gpcdc_toolkit.report import run_notebook

    done = run_notebook(config.with_settings({"report.dir": str(tmp_path / "reports")}), "explore")
    assert done.status == "ok", done.error
    assert done.headline.figures["row events"] == row_events
    text = done.report.read_text()
    assert "Row events per second, by segment" in text and "One distributed transaction, whole" in text


def test_capture_output_reads_as_captured(spark, source, broker, work_dir, tmp_path):
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"c{uuid.uuid4().hex[:8]}", "source.sandbox": "source"}, environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=1))
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.3}))
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()
        run_workload(source, WorkloadSpec(threads=2, transactions=200, hot_keys=3))
        wait_until_acknowledged(source, pipeline.slot)
        captured = read_captured(config)
        changes = read_changes(spark, config)
        rows = changes.where("kind = 'row'").dropDuplicates(["segment", "commit_lsn", "seq"])
        assert rows.count() == len(captured.rows)
        ends = changes.where("kind = 'end'").select("segment", "gxid").distinct().collect()
        assert {(r.segment, r.gxid) for r in ends} == {(s, g) for g, segs in captured.parts.items() for s in segs}
        records = read_transactions(spark, config).where("kind = 'commit'").collect()
        assert {r.gxid: tuple(r.segments) for r in records} == captured.records
        # Spark's own Kafka source reads the real stream (every kind of message) the same
        # way; up to the same offsets, as capture goes on writing watermarks.
        ends = end_offsets(kafka_client_settings(config), Topics(config.kafka.topic_prefix).changes)
        assert_same_frames(read_changes(spark, config, ending_offsets=ends),
                           read_changes(spark, config, ending_offsets=ends, source="kafka"))
        marks = read_watermarks(spark, config)
        assert {r.segment for r in marks.select("segment").distinct().collect()} == {-1, 0, 1, 2}
        run_explore_notebook(config, tmp_path, len(captured.rows))
    finally:
        group.stop()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)


def normalized(df):
    """A DataFrame's rows, sorted, with maps as sorted item tuples (comparable)."""
    def plain(value):
        if isinstance(value, dict):
            return tuple(sorted(value.items()))
        if isinstance(value, list):
            return tuple(value)
        return value

    return sorted((tuple(plain(v) for v in row) for row in df.collect()), key=lambda r: (r[0], r[1], r[2]))


def assert_same_frames(python_df, jvm_df):
    assert python_df.schema == jvm_df.schema
    rows = normalized(python_df)
    assert rows and rows == normalized(jvm_df)


@pytest.mark.parametrize("window", [
    {},
    {"starting_offsets": {0: 10, 1: -2, 2: -1}, "ending_offsets": {0: 20, 1: 5, 2: -1}},
    {"starting_offsets": {1: 3}, "ending_offsets": {0: 7}},  # partitions left out take the defaults
    {"starting_timestamp": BASE_MS + 30, "ending_timestamp": BASE_MS + 60},
    {"starting_timestamp": BASE_MS + 250, "ending_timestamp": BASE_MS + 10_000},  # past the last message
], ids=["whole", "offsets", "some-partitions", "time", "time-past-the-end"])
def test_spark_kafka_source_gives_the_same_dataframe_as_the_gpcdc_source(spark, topics, window):
    config, produce = topics
    produce(300, corrupt={4, 13, 50})
    assert_same_frames(read_changes(spark, config, **window), read_changes(spark, config, source="kafka", **window))


def test_both_sources_stream_the_same_rows_once_across_runs(spark, topics, tmp_path):
    config, produce = topics
    produce(90, corrupt={7})

    def run(source):
        out, checkpoint = str(tmp_path / source / "out"), str(tmp_path / source / "checkpoint")
        query = (stream_changes(spark, config, max_offsets_per_trigger=40, source=source).writeStream
                 .format("parquet").option("path", out).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(120), "the query did not finish within 120 s"
        assert query.exception() is None
        return spark.read.parquet(out)

    run("gpcdc"), run("kafka")
    produce(30)
    assert_same_frames(run("gpcdc"), run("kafka"))
    assert run("kafka").count() == 120, "each message exactly once across the two runs"


@pytest.mark.parametrize("source", ["gpcdc", "kafka"])
def test_offsets_lost_to_retention_are_refused_not_skipped(spark, topics, source):
    from confluent_kafka import TopicPartition

    config, produce = topics
    produce(60)
    admin = AdminClient({"bootstrap.servers": config.kafka.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(Topics(config.kafka.topic_prefix).changes, 0, 5)]).values():
        future.result(10)
    with pytest.raises(Exception, match="asks for offset 2 of .* partition 0, but Kafka holds it from offset 5 on"):
        read_changes(spark, config, starting_offsets={0: 2}, source=source).count()
    assert read_changes(spark, config, starting_offsets={0: 5}, source=source).count() == 55


def test_an_unknown_source_is_named(spark, topics):
    config, _ = topics
    with pytest.raises(ConfigError, match="unknown source 'jdbc'.*use one of gpcdc, kafka"):
        read_changes(spark, config, source="jdbc")


def test_missing_options_are_named(spark):
    with pytest.raises(Exception, match="needs option kafka.bootstrap.servers"):
        spark.read.format("gpcdc").option("topic", "x").load().count()


def test_a_range_is_read_asking_kafka_for_no_more_than_it_still_holds(topics, monkeypatch):
    """consume() returns once it has as many messages as asked: a reader asking for a
    full batch at a range's end would wait out its timeout for every range it reads."""
    import confluent_kafka

    from gpcdc_toolkit.ingest._spark_source import KafkaRange, read_range

    config, produce = topics
    produce(30)  # 10 a partition
    asked = []

    class Recording(confluent_kafka.Consumer):
        def consume(self, num_messages=1, timeout=-1):
            messages = super().consume(num_messages, timeout)
            asked.append((num_messages, [m.offset() for m in messages if m.error() is None]))
            return messages

    monkeypatch.setattr(confluent_kafka, "Consumer", Recording)
    topic = Topics(config.kafka.topic_prefix).changes
    batches = list(read_range(kafka_client_settings(config), KafkaRange(topic, 1, 2, 9), batch=4))
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(2, 9))
    # Each call asks for a batch or what the range has left, whichever is less.
    position = 2
    for wanted, offsets in asked:
        assert wanted == min(4, 9 - position), asked
        position = max([position, *(o + 1 for o in offsets if position <= o < 9)])
    assert position == 9
