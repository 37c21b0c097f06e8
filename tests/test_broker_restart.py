"""The broker crashes (SIGKILL) under a running pipeline and comes back: capture and
replay carry on by themselves, nothing is lost, nothing is applied twice."""

import subprocess
import threading
import time
import uuid

from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.replay import Applier
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import check_against_truth, compare_tables, read_captured
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, read_ground_truth, reset_tables, run_workload

from .test_cli import gpcdc, wait_until_status_shows_kafka_away
from .test_replay_faults import ENV, applied_count, replay_command, wait_for_first_commit


def said_so_far(log):
    log.seek(0)
    return log.read()[-3000:]


def test_a_broker_killed_under_capture_and_replay_loses_nothing_and_both_resume(source, work_dir):
    broker = EmbeddedBroker(work_dir / f"crash-{uuid.uuid4().hex[:6]}").up()
    target = Sandbox(f"target-{uuid.uuid4().hex[:4]}", work_dir).up(segments=2)
    config = load_config({"work_dir": str(work_dir), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"k{uuid.uuid4().hex[:8]}", "source.sandbox": "source",
                          "target.sandbox": target.name, "capture.heartbeat_interval": 0.3}, environ={})
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    group = CaptureGroup(config)
    status = ["--source-sandbox", "source", "--kafka-bootstrap-servers", config.kafka.bootstrap_servers,
              "--kafka-topic-prefix", config.kafka.topic_prefix, "status"]
    truth = work_dir / f"truth-{config.kafka.topic_prefix}.jsonl"
    replayer = None
    try:
        reset_tables(source)
        run_workload(source, WorkloadSpec(threads=1, transactions=20, hot_keys=3, seed=5))
        start = bootstrap(source, pipeline, "snapshot")
        group.start()
        target_cluster = target.cluster()
        Applier(target_cluster, config.kafka.topic_prefix).close()  # its tables, to count what it applies
        # Its output to a file: a pipe nobody reads while the broker is away would fill up.
        said = (work_dir / f"replay-{config.kafka.topic_prefix}.log").open("w+")
        replayer = subprocess.Popen(replay_command(work_dir, target, config), env=ENV, stdin=subprocess.DEVNULL,
                                    stdout=said, stderr=subprocess.STDOUT, text=True)
        spec = WorkloadSpec(threads=2, duration=6.0, rate=80, hot_keys=3, update_share=0.3, delete_share=0.1,
                            move_share=0.05, abort_share=0.05, seed=6)
        load = threading.Thread(target=run_workload, args=(source, spec), kwargs={"ground_truth": truth})
        load.start()
        wait_for_first_commit(target_cluster, replayer, 0)

        broker.kill()
        wait_until_status_shows_kafka_away(work_dir, status)
        load.join()  # the source went on committing throughout
        assert replayer.poll() is None, said_so_far(said)

        broker.up()  # on its port, with its data
        assert broker.bootstrap_servers == config.kafka.bootstrap_servers
        wait_until_acknowledged(source, pipeline.slot, timeout=120)
        shown = gpcdc(work_dir, *status)
        assert shown.returncode == 0, shown.stderr
        # Everything committed after the start point is in Kafka, whole, once.
        check = check_against_truth(read_captured(config), read_ground_truth(truth), start.snapshot.sees)
        assert check.ok and check.after > 100, (check.after, check.problems[:5])
        deadline = time.monotonic() + 120
        while not all(d.equal for d in compare_tables(source, target_cluster, [ACCOUNTS, EVENTS])):
            assert replayer.poll() is None, said_so_far(said)
            assert time.monotonic() < deadline, (
                [d.line() for d in compare_tables(source, target_cluster, [ACCOUNTS, EVENTS])], said_so_far(said))
            threading.Event().wait(0.2)  # polling the target while the replayer follows
        applied = applied_count(target_cluster)
        replayer.terminate()
        assert replayer.wait(60) == 0, said_so_far(said)
        # Equal tables with hot accounts only ever incremented: no increment was applied
        # twice; and each source transaction is recorded as applied once.
        assert applied == applied_count(target_cluster) >= check.after
    finally:
        if replayer is not None and replayer.poll() is None:
            replayer.kill()
            replayer.wait()
        group.stop()
        drop_slots(source, pipeline.slot, publication=pipeline.publication)
        broker.remove()
        target.down(remove=True)
