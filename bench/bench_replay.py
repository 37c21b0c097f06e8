"""Replay throughput against the source workload's own commit rate, in the same run.

1. Source (1+3 segments) with capture running: the workload at its highest rate for
   --seconds (hot keys, updates, deletes, one- and two-phase transactions). Its commit
   rate, in distributed transactions and rows per second, is the baseline.
2. Catch-up: the captured stream replayed into a fresh target (1+2 segments), once
   per --batch size. Replay rate from its first to its last applied transaction;
   ratio = replay rate / source rate (>= 1: it keeps up; >= 2: it catches up after an
   outage as long as the outage).
3. Follow: the workload again while a replayer follows; the largest lag seen and how
   long the replayer needs after the workload stops.

    .venv/bin/python bench/bench_replay.py [--seconds 20] [--batch 1,50,500]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from gpcdc_toolkit.bootstrap import Pipeline, bootstrap
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.replay import Progress, Replayer, ReplaySettings
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, reset_tables, run_workload

SPEC = dict(threads=4, hot_keys=20, update_share=0.3, delete_share=0.05, move_share=0.02)


def table_rows(cluster, table):  # type: ignore[no-untyped-def]
    return sorted(r for rows in cluster.rows_by_segment(table).values() for r in rows)


class Timeline:
    """Progress callback: when the first and the last transaction were applied."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.applied = 0
        self.rows = 0
        self.max_lag_ms = 0

    def __call__(self, progress: Progress) -> None:
        now = time.perf_counter()
        if progress.transactions and self.first is None:
            self.first = now
        if progress.transactions > self.applied:
            self.last, self.applied, self.rows = now, progress.transactions, progress.rows
        self.max_lag_ms = max(self.max_lag_ms, progress.lag_ms)

    @property
    def seconds(self) -> float:
        return self.last - self.first if self.first is not None else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch", default="1,50,500", help="batch sizes to replay with, comma-separated")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    work.chmod(0o755)
    source = Sandbox("source", work)
    targets = [Sandbox(f"t{b}", work) for b in batches] + [Sandbox("follow", work)]
    broker = EmbeddedBroker(work)
    group = None
    try:
        cluster = source.up(segments=3).cluster()
        broker.up()
        for target in targets:
            target.up(segments=2)
        def config_for(target: str):  # type: ignore[no-untyped-def]
            return load_config({"work_dir": str(work), "kafka.bootstrap_servers": broker.bootstrap_servers,
                                "kafka.topic_prefix": "bench", "source.sandbox": "source", "target.sandbox": target},
                               environ={})

        config = config_for("follow")
        pipeline = Pipeline(work, "bench")
        reset_tables(cluster)
        run_workload(cluster, WorkloadSpec(threads=1, transactions=10, hot_keys=SPEC["hot_keys"]))
        bootstrap(cluster, pipeline, "snapshot")
        group = CaptureGroup(config)
        group.start()

        source_run = run_workload(cluster, WorkloadSpec(duration=args.seconds, seed=1, **SPEC))  # type: ignore[arg-type]
        wait_until_acknowledged(cluster, pipeline.slot, timeout=300)
        src_tps, src_rps = source_run.committed / source_run.elapsed, source_run.rows / source_run.elapsed
        print(f"source workload: {source_run.committed} dtx ({source_run.one_phase} one-phase), {source_run.rows} rows "
              f"in {source_run.elapsed:.1f} s: {src_tps:,.0f} dtx/s, {src_rps:,.0f} rows/s", flush=True)

        print("catch-up replay into 1+2 segments (ratio = replay rate / source rate):")
        for batch, target in zip(batches, targets):
            timeline = Timeline()
            with Replayer(config_for(target.name), settings=ReplaySettings(batch_transactions=batch)) as replayer:
                replayer.run(progress=timeline, progress_interval=0.05)
            tps, rps = timeline.applied / timeline.seconds, timeline.rows / timeline.seconds
            same = all(table_rows(target.cluster(), t) == table_rows(cluster, t) for t in (ACCOUNTS, EVENTS))
            print(f"  batch {batch:>4}: {timeline.applied} dtx in {timeline.seconds:.1f} s: {tps:,.0f} dtx/s "
                  f"(ratio {tps / src_tps:.2f}), {rps:,.0f} rows/s (ratio {rps / src_rps:.2f}); "
                  f"target {'equals' if same else 'DIFFERS FROM'} the source", flush=True)

        with Replayer(config) as replayer:
            replayer.run()  # catch up on what is there, then follow new work
            timeline = Timeline()
            stop = threading.Event()
            follower = threading.Thread(target=replayer.run, kwargs=dict(
                follow=True, progress=timeline, should_stop=stop.is_set, progress_interval=0.1))
            follower.start()
            load = run_workload(cluster, WorkloadSpec(duration=args.seconds, seed=2, **SPEC))  # type: ignore[arg-type]
            ended = time.perf_counter()
            wait_until_acknowledged(cluster, pipeline.slot, timeout=300)
            deadline = time.monotonic() + 600
            while timeline.applied < load.committed and time.monotonic() < deadline:
                time.sleep(0.05)  # polling the follower's progress
            drained = time.perf_counter() - ended
            stop.set()
            follower.join()
        print(f"follow: workload {load.committed / load.elapsed:,.0f} dtx/s for {load.elapsed:.0f} s; largest lag "
              f"{timeline.max_lag_ms / 1000:.1f} s; everything applied {drained:.1f} s after the workload ended", flush=True)
    finally:
        if group is not None:
            group.stop()
        broker.down()
        for sandbox in (source, *targets):
            sandbox.down(remove=True)
        if not os.environ.get("GPCDC_BENCH_KEEP"):
            shutil.rmtree(work)


if __name__ == "__main__":
    main()
