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
import statistics
import threading
import time

from bench_replay import SPEC, Timeline, captured_source

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.archive import write_archive
from gpcdc_toolkit.bootstrap import distributed_tables
from gpcdc_toolkit.capture import wait_until_acknowledged
from gpcdc_toolkit.replay import Replayer
from gpcdc_toolkit.validate import check_against_syncpoint, record_syncpoint, take_syncpoint
from gpcdc_toolkit.workload import WorkloadSpec, run_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    kinds = ["kafka", "archive"] * args.rounds
    names = [f"{kind}{i}" for i, kind in enumerate(kinds)]
    with captured_source(names) as (cluster, pipeline, config_for, targets):
        config = config_for(names[0])
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
        print(f"source workload: {load.committed} dtx, {load.rows} rows in {load.elapsed:.1f} s, "
              f"{len(points)} sync points", flush=True)
        archive = pipeline.work_dir / "archive"
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


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
