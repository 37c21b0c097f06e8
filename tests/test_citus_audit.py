"""The audit of a stream captured from real Citus (parts numbered per worker, one-phase
parts without a gxid, several connections' parts of a transaction on one worker): clean
while writers ran, and each injected fault gives exactly its findings, as on the
sandbox's stream."""

import threading
import uuid

import psycopg
import pytest

from gpcdc_toolkit.audit._faults import FAULTS, quiet_thresholds
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.sandbox import Sandbox

from .test_audit_faults import SKEW_MS, check, check_a_mix, check_one_fault, read_messages, settled
from .test_citus_source import Writers

pytestmark = pytest.mark.citus

WORKERS = 2


@pytest.fixture(scope="module")
def clean(broker, work_dir):
    """A settled stream of Citus writers (multi-shard and single-shard inserts, updates
    and deletes, some changing nothing on a worker), as captured."""
    sandbox = Sandbox("citus-audit", work_dir).up(segments=WORKERS, flavour="citus")
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"ca{uuid.uuid4().hex[:8]}", "source.sandbox": sandbox.name},
                         environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    group = CaptureGroup(config.with_settings({"capture.heartbeat_interval": 0.2}))
    cluster = sandbox.cluster()
    try:
        with psycopg.connect(sandbox.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE audited (id int PRIMARY KEY, v int NOT NULL, note text)")
            conn.execute("SELECT create_distributed_table('audited', 'id')")
        bootstrap(cluster, pipeline, "snapshot")
        group.start()
        with Writers(sandbox.dsn, "audited", threads=3) as writers:
            writers.wait_for_commits(300)
        wait_until_acknowledged(cluster, pipeline.slot)
        wait = threading.Event()
        for _ in range(300):  # until the watermarks are past the last commit: a condition on the data, 30 s at most
            messages = read_messages(config)
            if settled(messages, nodes=WORKERS + 1):
                break
            wait.wait(0.1)
        assert settled(messages, nodes=WORKERS + 1), "the watermarks did not pass the last commit within 30 s"
    finally:
        group.stop()
        drop_slots(cluster, pipeline.slot, publication=pipeline.publication)
        sandbox.down(remove=True)
    return messages, quiet_thresholds(messages, SKEW_MS)


def test_a_clean_citus_stream_has_no_findings(spark, clean):
    messages, thresholds = clean
    check(spark, messages, [], thresholds)


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "ddl_out_of_place"])  # Citus DDL is not captured
def test_each_fault_gives_exactly_its_findings(spark, clean, fault):
    check_one_fault(spark, clean, fault, WORKERS)


@pytest.mark.parametrize("seed", range(6))
def test_random_mixes_of_faults_give_exactly_their_findings(spark, clean, seed):
    check_a_mix(spark, clean, seed, WORKERS)
