"""What capture workers cost the machine while they wait for a broker that does not answer.

A sandbox of N segments (16 by default), the embedded broker, a pipeline bootstrapped
and its N + 1 workers streaming (a watermark every 0.5 s, as the 64-segment test runs
them). The workers' CPU (user + system, from /proc) is summed over the same span twice:

- baseline: the broker answers, the slots are quiet (each worker only beats);
- frozen: the broker stopped (SIGSTOP), so every watermark's confirmation is awaited.

The ratio frozen ÷ baseline says how much harder workers work while Kafka is slow: on a
machine they share with the broker, that CPU is taken from the broker. Then the broker
goes on (SIGCONT) and the run ends once every slot is acknowledged again.

    .venv/bin/python bench/bench_waiting_workers.py [--segments 16] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from bench_capture import process_cpu  # the same reading of /proc (bench/ is the script's directory)

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureGroup
from gpcdc_toolkit.capture._status import wait_until_acknowledged
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.workload import WorkloadSpec, run_workload, setup_tables


def cpu_seconds(pids: list[int]) -> float:
    return sum(process_cpu(pid) for pid in pids)


def spent(pids: list[int], seconds: float) -> float:
    """The workers' CPU over ``seconds``, as cores busy."""
    before, began = cpu_seconds(pids), time.monotonic()
    time.sleep(seconds)  # the span measured
    return (cpu_seconds(pids) - before) / (time.monotonic() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpcdc-bench-waiting-", dir="/var/tmp"))
    root.chmod(0o755)
    broker, source = EmbeddedBroker(root), Sandbox("source", root)
    config = load_config({"work_dir": str(root), "source.sandbox": "source", "kafka.topic_prefix": "waiting",
                          "capture.heartbeat_interval": 0.5}, environ={})
    group = CaptureGroup(config)
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    cluster = None
    try:
        broker.up()
        source.up(segments=args.segments)
        cluster = source.cluster()
        setup_tables(cluster, 10)
        bootstrap(cluster, pipeline, "snapshot")
        pids = list(group.start(timeout=300).pids.values())
        run_workload(cluster, WorkloadSpec(threads=2, transactions=50))
        wait_until_acknowledged(cluster, pipeline.slot, timeout=300)
        print(f"{len(pids)} workers, {args.seconds:g} s each way", flush=True)
        baseline = spent(pids, args.seconds)
        print(f"  broker answering: {baseline * 100:6.2f}% of a core in all, "
              f"{baseline * 100 / len(pids):.3f}% each", flush=True)
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            time.sleep(2)  # a watermark and an acknowledgement interval: every worker awaits a confirmation
            frozen = spent(pids, args.seconds)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        print(f"  broker frozen:    {frozen * 100:6.2f}% of a core in all, "
              f"{frozen * 100 / len(pids):.3f}% each", flush=True)
        print(f"  ratio frozen / answering: {frozen / baseline:.2f}", flush=True)
        wait_until_acknowledged(cluster, pipeline.slot, timeout=300)
    finally:
        group.stop()
        if cluster is not None:
            drop_slots(cluster, pipeline.slot, publication=pipeline.publication)
        if source.exists:
            source.down(remove=True)
        broker.down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
