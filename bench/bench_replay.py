"""Replay throughput against the source workload's own commit rate, in the same run.

1. Source (1+3 segments) with capture running: the workload at its highest rate for
   --seconds (hot keys, updates, deletes, one- and two-phase transactions). Its commit
   rate, in distributed transactions and rows per second, is the baseline.
2. Catch-up: the captured stream replayed into a fresh target (1+2 segments), once
   per --batch size. Replay rate from the replayer's start to its last applied
   transaction (its start and first reads included);
   ratio = replay rate / source rate (>= 1: it keeps up; >= 2: it catches up after an
   outage as long as the outage).
3. Follow: the workload again while a replayer follows; the largest lag seen and how
   long the replayer needs after the workload stops.

4. With --large-mb N: the replayer's peak memory on one source transaction of N MB
   (rows of about 1 kB), against its peak on a transaction of 1 MB in the same run;
   `gpcdc replay --once` runs as a child process, and its peak RSS is the kernel's.

    .venv/bin/python bench/bench_replay.py [--seconds 20] [--batch 1,50,500] [--large-mb 1024]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.config import Config, load_config
from gpcdc_toolkit.replay import Progress, Replayer, ReplaySettings
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import table_rows
from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, reset_tables, run_workload

SPEC = dict(threads=4, hot_keys=20, update_share=0.3, delete_share=0.05, move_share=0.02)


class Timeline:
    """Progress callback: the time from its making (right before the replayer runs) to
    the last transaction applied. Not from the first one applied: one step of the
    replayer applies everything that became ready in it, which can be the whole stream
    when the coordinator's topic comes in a single read."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.last = self.began
        self.applied = 0
        self.rows = 0
        self.max_lag_ms = 0

    def __call__(self, progress: Progress) -> None:
        if progress.transactions > self.applied:
            self.last, self.applied, self.rows = time.perf_counter(), progress.transactions, progress.rows
        self.max_lag_ms = max(self.max_lag_ms, progress.lag_ms)

    @property
    def seconds(self) -> float:
        return self.last - self.began


def replay_peak_rss(work: Path, config_flags: list[str]) -> tuple[int, float]:
    """Run `gpcdc replay --once` as a child; (its peak RSS in bytes, seconds)."""
    began = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(work), *config_flags,
                              "replay", "--once"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _pid, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"replay exited with status {status}")
    return usage.ru_maxrss * 1024, time.perf_counter() - began


def large_transaction(mb: int) -> None:
    """Peak replayer memory on one transaction of ``mb`` MB against one of 1 MB."""
    from gpcdc_toolkit.cluster import Session

    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    work.chmod(0o755)
    source, broker = Sandbox("source", work), EmbeddedBroker(work)
    targets = {size: Sandbox(f"large{size}", work) for size in (1, mb)}
    groups: list[CaptureGroup] = []
    try:
        cluster = source.up(segments=3).cluster()
        broker.up()
        rng = random.Random(7)
        filler = "".join(rng.choice(string.ascii_letters) for _ in range(4096))
        with Session(cluster) as session:
            session.ddl("CREATE TABLE big (id bigint PRIMARY KEY, payload text) DISTRIBUTED BY (id)")
        for size, target in targets.items():
            target.up(segments=2)
            prefix = f"large{size}"
            flags = ["--source-sandbox", "source", "--target-sandbox", target.name,
                     "--kafka-bootstrap-servers", broker.bootstrap_servers, "--kafka-topic-prefix", prefix]
            config = load_config({"work_dir": str(work), "kafka.bootstrap_servers": broker.bootstrap_servers,
                                  "kafka.topic_prefix": prefix, "source.sandbox": "source"}, environ={})
            pipeline = Pipeline(work, prefix)
            bootstrap(cluster, pipeline, "snapshot")
            group = CaptureGroup(config)
            groups.append(group)
            group.start()
            rows = size * 1000  # about 1 kB each
            began = time.perf_counter()
            with Session(cluster) as session, session.transaction() as tx:
                first = size * 10_000_000
                for start in range(0, rows, 10_000):
                    tx.insert("big", [{"id": first + i, "payload": filler[i % 3000:i % 3000 + 1000]}
                                      for i in range(start, min(rows, start + 10_000))])
            wait_until_acknowledged(cluster, pipeline.slot, timeout=1800)
            group.stop()
            captured = time.perf_counter() - began
            peak, seconds = replay_peak_rss(work, flags)
            same = table_rows(target.cluster(), "big") == table_rows(cluster, "big")  # initial load + stream
            print(f"one transaction of {size} MB ({rows} rows): written and captured in {captured:.1f} s; replayed in "
                  f"{seconds:.1f} s ({rows / seconds:,.0f} rows/s), replayer peak RSS {peak / 2**20:,.0f} MiB; "
                  f"target {'equals' if same else 'DIFFERS FROM'} the source", flush=True)
            if size == 1:
                baseline = peak
        print(f"peak RSS ratio, {mb} MB transaction / 1 MB transaction: {peak / baseline:.2f} "
              f"({peak / 2**20:,.0f} MiB; goal at most 256 MiB)", flush=True)
    finally:
        for group in groups:
            group.stop()
        broker.down()
        for sandbox in (source, *targets.values()):
            sandbox.down(remove=True)
        if not os.environ.get("GPCDC_BENCH_KEEP"):
            shutil.rmtree(work)


@contextlib.contextmanager
def captured_source(target_names: list[str]) -> Iterator[tuple[Any, Pipeline, Callable[[str], Config], list[Sandbox]]]:
    """In a work directory of its own: the source (1+3 segments) with the workload's
    tables and a few transactions, its pipeline "bench" bootstrapped and captured by a
    running capture group, the embedded broker, and targets (1+2 segments) named
    ``target_names``. Yields (source cluster, pipeline, the configuration for a target
    by name, the targets); everything stopped and removed after."""
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    work.chmod(0o755)
    source = Sandbox("source", work)
    targets = [Sandbox(name, work) for name in target_names]
    broker = EmbeddedBroker(work)
    group = None
    try:
        cluster = source.up(segments=3).cluster()
        broker.up()
        for target in targets:
            target.up(segments=2)

        def config_for(target: str) -> Config:
            return load_config({"work_dir": str(work), "kafka.bootstrap_servers": broker.bootstrap_servers,
                                "kafka.topic_prefix": "bench", "source.sandbox": "source", "target.sandbox": target},
                               environ={})

        pipeline = Pipeline(work, "bench")
        reset_tables(cluster)
        run_workload(cluster, WorkloadSpec(threads=1, transactions=10, hot_keys=SPEC["hot_keys"]))
        bootstrap(cluster, pipeline, "snapshot")
        group = CaptureGroup(config_for(targets[0].name if targets else "target"))
        group.start()
        yield cluster, pipeline, config_for, targets
    finally:
        if group is not None:
            group.stop()
        broker.down()
        for sandbox in (source, *targets):
            sandbox.down(remove=True)
        if not os.environ.get("GPCDC_BENCH_KEEP"):
            shutil.rmtree(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch", default="1,50,500", help="batch sizes to replay with, comma-separated")
    parser.add_argument("--large-mb", type=int, default=0,
                        help="only measure the replayer's peak memory on one transaction of this many MB")
    args = parser.parse_args()
    if args.large_mb:
        large_transaction(args.large_mb)
        return
    batches = [int(b) for b in args.batch.split(",")]
    with captured_source([f"t{b}" for b in batches] + ["follow"]) as (cluster, pipeline, config_for, targets):
        config = config_for("follow")
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


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
