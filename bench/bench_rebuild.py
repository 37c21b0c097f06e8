"""A target rebuilt from the Parquet archive against the same stream replayed from Kafka,
in the same run.

1. Source (1+3 segments) with capture running: the workload for --seconds, with a sync
   point taken (and recorded) every few seconds; the topics then archived
   (`write_archive`), its rate in messages per second printed.
2. The same stream, up to the last sync point, replayed into fresh targets (1+2
   segments), alternately from Kafka and from the archive, --rounds times each. Rate
   from the first to the last applied transaction; ratio = rebuild rate from the
   archive / replay rate from Kafka (median of the rounds). Each target is then proven
   equal to the source as of that sync point by its record (`gpcdc validate
   --against-syncpoint`).

    .venv/bin/python bench/bench_rebuild.py [--seconds 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench_replay import SPEC, Timeline

from gpcdc_toolkit.archive import write_archive
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, distributed_tables
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.replay import Replayer
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import check_against_syncpoint, record_syncpoint, take_syncpoint
from gpcdc_toolkit.workload import WorkloadSpec, reset_tables, run_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    work.chmod(0o755)
    source = Sandbox("source", work)
    kinds = ["kafka", "archive"] * args.rounds
    targets = [Sandbox(f"{kind}{i}", work) for i, kind in enumerate(kinds)]
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

        config = config_for(targets[0].name)
        pipeline = Pipeline(work, "bench")
        reset_tables(cluster)
        run_workload(cluster, WorkloadSpec(threads=1, transactions=10, hot_keys=SPEC["hot_keys"]))
        bootstrap(cluster, pipeline, "snapshot")
        group = CaptureGroup(config)
        group.start()

        points: list[int] = []
        stop = threading.Event()

        def cut() -> None:
            while not stop.wait(max(1.0, args.seconds / 5)):
                tables = distributed_tables(cluster)
                with take_syncpoint(cluster, pipeline="bench", tables=tables) as point:
                    record_syncpoint(point, tables, pipeline.syncpoints_dir)
                    points.append(point.gxid)

        cutter = threading.Thread(target=cut)
        cutter.start()
        try:
            load = run_workload(cluster, WorkloadSpec(duration=args.seconds, seed=1, **SPEC))  # type: ignore[arg-type]
        finally:
            stop.set()
            cutter.join()
        wait_until_acknowledged(cluster, pipeline.slot, timeout=300)
        group.stop()
        print(f"source workload: {load.committed} dtx, {load.rows} rows in {load.elapsed:.1f} s, "
              f"{len(points)} sync points", flush=True)
        archive = work / "archive"
        began = time.perf_counter()
        run = write_archive(config, archive)
        seconds = time.perf_counter() - began
        print(f"archive: {run.events} messages in {seconds:.1f} s ({run.events / seconds:,.0f} messages/s)", flush=True)

        rates: dict[str, list[float]] = {"kafka": [], "archive": []}
        for kind, target in zip(kinds, targets):
            timeline = Timeline()
            with Replayer(config_for(target.name), archive=archive if kind == "archive" else None) as replayer:
                replayer.run(progress=timeline, progress_interval=0.05, until_syncpoint=points[-1])
            tps = timeline.applied / timeline.seconds
            rates[kind].append(tps)
            check = check_against_syncpoint(config_for(target.name), points[-1], archive=archive)
            print(f"  from {kind:>7}: {timeline.applied} dtx, {timeline.rows} rows in {timeline.seconds:.1f} s: "
                  f"{tps:,.0f} dtx/s, {timeline.rows / timeline.seconds:,.0f} rows/s; target "
                  f"{'equals' if check.verified else 'DIFFERS FROM'} the source as of sync point {points[-1]}",
                  flush=True)
        ratio = statistics.median(rates["archive"]) / statistics.median(rates["kafka"])
        print(f"rebuild rate from the archive / replay rate from Kafka: {ratio:.2f} "
              f"(medians of {args.rounds} rounds each)", flush=True)
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
