"""Live metrics, scraped by a real Prometheus: each capture worker and the replayer serve
theirs while a workload runs, and their figures equal what the pipeline did; the alert
rules shipped in monitoring/ fire when a worker or the replayer is killed."""

import re
import subprocess
from collections import Counter
from pathlib import Path

from gpcdc_toolkit._runtime import free_port
from gpcdc_toolkit.bootstrap import bootstrap
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.replay import APPLIED
from gpcdc_toolkit.validate import read_captured, table_rows
from gpcdc_toolkit.workload import ACCOUNTS, WorkloadSpec, reset_tables, run_workload

from ._prometheus import PrometheusServer, free_ports
from .test_replay_faults import ENV, replay_command

RULES = Path(__file__).parent.parent / "monitoring" / "alerts.yml"


def test_prometheus_scrapes_what_the_pipeline_did_and_the_shipped_alerts_fire(source, work_dir, replay_target,
                                                                             tmp_path):
    target, config, pipeline, _group = replay_target
    nodes = [n.content for n in source.nodes]
    base = free_ports(len(nodes))
    replay_port = free_port(avoid=range(base, base + len(nodes)))
    config = config.with_settings({"capture.metrics_port": base, "replay.metrics_port": replay_port})
    group = CaptureGroup(config)  # the fixture's, with ports: it stops the same workers afterwards
    instance = {node: f"127.0.0.1:{base + 1 + node}" for node in nodes}
    # The rules as shipped, but firing at once rather than after their minutes of patience.
    rules = tmp_path / "alerts.yml"
    rules.write_text(re.sub(r"(?m)^(\s+)for: \S+$", r"\1for: 0s", RULES.read_text()))
    reset_tables(source)
    bootstrap(source, pipeline, "snapshot")
    group.start()
    command = replay_command(work_dir, target, config, "--replay-metrics-port", str(replay_port))
    replayer = subprocess.Popen(command, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    try:
        with PrometheusServer(tmp_path, {"gpcdc-capture": list(instance.values()),
                                         "gpcdc-replay": [f"127.0.0.1:{replay_port}"]}, [rules]) as prometheus:
            run_workload(source, WorkloadSpec(threads=2, transactions=80, hot_keys=3, update_share=0.3, seed=4))
            wait_until_acknowledged(source, pipeline.slot)
            captured = read_captured(config)
            assert captured.duplicates == 0
            in_kafka = {str(s): float(n) for s, n in Counter(r["source"]["segment"] for r in captured.rows).items()}

            def scraped_rows():
                got = {dict(k)["node"]: v for k, v in prometheus.query('gpcdc_capture_events_total{kind="row"}').items()}
                return got == in_kafka

            prometheus.wait_for(f"row events scraped per node equal to Kafka's {in_kafka}", scraped_rows)
            prometheus.wait_for("the replayer to apply every transaction",
                                lambda: table_rows(target.cluster(), ACCOUNTS) == table_rows(source, ACCOUNTS))
            applied = len(table_rows(target.cluster(), APPLIED))

            prometheus.wait_for(f"{applied} transactions applied, scraped", lambda: list(
                prometheus.query("gpcdc_replay_applied_transactions_total").values()) == [applied])
            # Every node's target scraped (Prometheus scrapes each on its own clock; the
            # coordinator's has no row events to have waited for above).
            lag = prometheus.wait_for("a lag reading from every node", lambda: (
                readings if len(readings := prometheus.query("gpcdc_capture_lag_bytes")) == len(nodes) else None))
            assert all(v >= 0 for v in lag.values())
            assert prometheus.firing() == set()  # nothing to say about a healthy pipeline
            # A worker killed: it stops answering, and the shipped rule says so.
            group.kill(1)
            prometheus.wait_for("GpcdcCaptureWorkerDown for segment 1's worker",
                                lambda: ("GpcdcCaptureWorkerDown", instance[1]) in prometheus.firing())
            replayer.kill()
            replayer.wait()
            prometheus.wait_for("GpcdcReplayerDown", lambda: ("GpcdcReplayerDown", f"127.0.0.1:{replay_port}")
                                in prometheus.firing())
            assert {name for name, _ in prometheus.firing()} == {"GpcdcCaptureWorkerDown", "GpcdcReplayerDown"}
    finally:
        if replayer.poll() is None:
            replayer.kill()
            replayer.wait()
