"""How the pipeline's costs grow with the number of segments: 4, 16, 64 by default.

For each size, a fresh source sandbox (coordinator + N segments) and target
(coordinator + N/4 segments), on one broker and one Spark server started first:

- sandbox creation;
- bootstrap by each method while 4 writer threads run: its time, and the writers'
  stall at the cut (the peaceful method's lock window, the snapshot method's commit
  pause), with the writers' worst commit latency meanwhile;
- capture: N + 1 workers started, their memory (resident and proportional set, summed);
- a workload of 2,000 distributed transactions (half of them on several segments),
  captured until every slot is acknowledged past it;
- replay of the whole stream into the target: rows/s;
- the audit of the stream, and the validation of the target (checksums and the
  target's expectations) with both sides quiet.

Every step prints a line as it ends; the table at the end gives each cost per size
and its growth per segment added, against the smallest size of the same run.

    .venv/bin/python bench/bench_scale.py [--segments 4 16 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.audit import run_audit
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap, drop_slots
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureGroup
from gpcdc_toolkit.capture._status import wait_until_acknowledged
from gpcdc_toolkit.config import Config, load_config
from gpcdc_toolkit.ingest import SparkServer
from gpcdc_toolkit.ingest.spark import command_session
from gpcdc_toolkit.replay import Replayer
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import validate
from gpcdc_toolkit.workload import WorkloadSpec, run_workload, setup_tables

WRITERS = WorkloadSpec(threads=4, duration=3600.0,  # until stopped
                        hot_keys=10, rows_per_transaction=10)


def timed(results: dict[str, float], key: str, step: Callable[[], Any]) -> Any:
    started = time.monotonic()
    value = step()
    results[key] = time.monotonic() - started
    print(f"  {key:<28} {results[key]:>8.1f} s", flush=True)
    return value


def memory_kb(pid: int) -> tuple[int, int]:
    """A process's resident and proportional set sizes, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])
    return fields["Rss"], fields["Pss"]


def bootstrap_under_writers(config: Config, cluster: Any, method: str) -> tuple[float, float, float]:
    """Bootstrap with ``method`` while writers run: seconds, the stall the start point
    records (ms), and the writers' worst commit latency meanwhile (ms)."""
    stop = threading.Event()
    outcome: dict[str, Any] = {}
    writer = threading.Thread(target=lambda: outcome.setdefault("w", run_workload(cluster, WRITERS, stop=stop)))
    writer.start()
    try:
        started = time.monotonic()
        start = bootstrap(cluster, Pipeline(config.work_dir, config.kafka.topic_prefix), method, timeout=120)
        seconds = time.monotonic() - started
    finally:
        stop.set()
        writer.join()
    if "w" not in outcome:
        raise SystemExit(f"the writers stopped during the {method} bootstrap (see the traceback above)")
    stall = start.lock_window_ms if method == "peaceful" else float(start.extra["cut_ms"])
    return seconds, float(stall or 0.0), max(outcome["w"].latencies) * 1000


def one_size(segments: int, root: Path, broker: EmbeddedBroker) -> dict[str, float]:
    # One work directory for every size, so that each finds the Spark server started there.
    config = load_config({"work_dir": str(root), "kafka.bootstrap_servers": broker.bootstrap_servers,
                          "kafka.topic_prefix": f"scale{segments}", "source.sandbox": f"source{segments}",
                          "target.sandbox": f"target{segments}"}, environ={})
    source, target = Sandbox(f"source{segments}", root), Sandbox(f"target{segments}", root)
    group = CaptureGroup(config)
    results: dict[str, float] = {}
    print(f"{segments} segments:", flush=True)
    try:
        timed(results, "source sandbox up", lambda: source.up(segments=segments))
        target.up(segments=max(1, segments // 4))
        cluster = source.cluster()
        setup_tables(cluster, WRITERS.hot_keys)
        pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
        for method in ("peaceful", "snapshot"):
            seconds, stall, worst = bootstrap_under_writers(config, cluster, method)
            results[f"bootstrap {method}"], results[f"stall {method} ms"] = seconds, stall
            results[f"writers' worst {method} ms"] = worst
            print(f"  bootstrap {method:<18} {seconds:>8.1f} s, stall {stall:.0f} ms, writers' worst commit "
                  f"{worst:.0f} ms", flush=True)
            if method == "peaceful":
                drop_slots(cluster, pipeline.slot, publication=pipeline.publication)
                shutil.rmtree(pipeline.directory)
        pids = timed(results, "capture start", lambda: group.start(timeout=300)).pids
        sizes = [memory_kb(pid) for pid in pids.values()]
        results["capture RSS MB"] = sum(r for r, _ in sizes) / 1024
        results["capture PSS MB"] = sum(p for _, p in sizes) / 1024
        print(f"  capture memory: {len(pids)} workers, RSS {results['capture RSS MB']:.0f} MB, "
              f"PSS {results['capture PSS MB']:.0f} MB", flush=True)
        work_spec = dataclasses.replace(WRITERS, duration=None, transactions=2000, multi_segment_share=0.5)
        done = timed(results, "workload 2000 dtx", lambda: run_workload(cluster, work_spec))
        timed(results, "capture drained", lambda: wait_until_acknowledged(cluster, pipeline.slot, timeout=600))
        with Replayer(config) as replayer:
            progress = timed(results, "replay", lambda: replayer.run(follow=False))
        results["replay rows/s"] = progress.rows / results["replay"]
        print(f"  replay: {progress.transactions} transactions, {progress.rows} rows, "
              f"{results['replay rows/s']:.0f} rows/s ({done.rows} row changes written)", flush=True)
        with command_session(config, "bench-scale") as session:
            run_audit(session, config, write=False)  # Spark compiles the audit's plans once: not timed
            audit = timed(results, "audit", lambda: run_audit(session, config, write=False))
        if audit.fails("error"):
            raise SystemExit(f"the audit of {segments} segments found errors: {audit.summary}")
        checked = timed(results, "validate", lambda: validate(config, syncpoint=False))
        if not checked.verified:
            raise SystemExit(f"the validation of {segments} segments failed: {checked.lines()}")
        print("  " + "\n  ".join(checked.lines()), flush=True)
    finally:
        group.stop()
        for sandbox in (source, target):
            if sandbox.exists:
                sandbox.down(remove=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, nargs="+", default=[4, 16, 64])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpcdc-bench-scale-", dir="/var/tmp"))
    root.chmod(0o755)
    broker, spark = EmbeddedBroker(root), SparkServer(root)
    table: dict[int, dict[str, float]] = {}
    try:
        broker.up()
        spark.up("local[2]")
        for segments in sorted(args.segments):
            table[segments] = one_size(segments, root, broker)
    finally:
        spark.down()
        broker.down()
        shutil.rmtree(root, ignore_errors=True)
    sizes = sorted(table)
    first = sizes[0]
    # A cost that grows in step with the segments reads 1.00x per segment; above 1, faster
    # than linearly. A rate reads as itself against the smallest size.
    print(f"\n{'cost':<28}" + "".join(f"{n:>10}" for n in sizes) + f"   growth per segment vs {first} (rates: vs {first})")
    for key in table[first]:
        row = [table[n][key] for n in sizes]
        per = (lambda n: 1.0) if key.endswith("/s") else (lambda n: n / first)
        growth = "".join(f"  {n}: {(table[n][key] / table[first][key]) / per(n):.2f}x" for n in sizes[1:]
                         if table[first][key])
        print(f"{key:<28}" + "".join(f"{v:>10.1f}" for v in row) + growth)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
