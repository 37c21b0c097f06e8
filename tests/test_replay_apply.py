"""One replay pass from captured topics into a target sandbox with another segment count."""

import uuid

from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.replay import APPLIED, Applier, Reassembler, apply_all, feed_from_kafka
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, reset_tables, run_workload

from .test_cli import gpcdc


def table_rows(cluster, table):
    return sorted(row for rows in cluster.rows_by_segment(table).values() for row in rows)


def test_replay_reproduces_the_source_on_two_segments_exactly_once(source, broker, work_dir):
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"r{uuid.uuid4().hex[:8]}", "source.sandbox": "source"}, environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    group = CaptureGroup(config, heartbeat_interval=0.3)
    target = Sandbox(f"target-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    try:
        bootstrap(source, pipeline, "snapshot")
        group.start()
        reset_tables(source)  # the DROP and CREATE TABLE go through the stream as DDL
        run_workload(source, WorkloadSpec(threads=3, transactions=300, hot_keys=4, update_share=0.3,
                                          delete_share=0.1, move_share=0.05))
        wait_until_acknowledged(source, pipeline.slot)
        target_cluster = target.cluster()
        applier = Applier(target_cluster)
        reassembler = Reassembler(source.segment_count)
        feed_from_kafka(reassembler, config)
        stats = apply_all(applier, reassembler.ready())
        assert reassembler.pending == 0 and reassembler.missing() == []
        assert stats.ddl >= 2 and stats.transactions > 250
        for table in (ACCOUNTS, EVENTS):
            assert table_rows(target_cluster, table) == table_rows(source, table), f"{table} differs"
        # A second pass over the same topics applies nothing again.
        again = Reassembler(source.segment_count)
        feed_from_kafka(again, config)
        wholes = again.ready()
        assert not any(applier.apply(w) for w in wholes)
        assert sum(len(r) for r in target_cluster.rows_by_segment(APPLIED).values()) == len(wholes)
        applier.close()
        done = gpcdc(work_dir, "--source-sandbox", "source", "--target-sandbox", target.name,
                     "--kafka-bootstrap-servers", broker.bootstrap_servers,
                     "--kafka-topic-prefix", config.kafka.topic_prefix, "replay", "--once")
        assert done.returncode == 0, done.stderr
        assert f"applied 0 distributed transactions (0 DDL, 0 rows), skipped {len(wholes)}" in done.stdout
    finally:
        group.stop()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)
        target.down(remove=True)
