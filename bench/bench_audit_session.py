"""The driver's heap across repeated audits in one Spark session.

A notebook or a scheduler audits again and again in one session. Whatever an audit
leaves persisted adds up in the driver's heap (in local mode it holds the executors'
blocks too) until a broadcast no longer fits. This runs ``run_audit`` on one synthetic
archive (as ``bench_audit.py`` writes it) ``--runs`` times in one session with the
toolkit's default Spark settings (``local[2]``, driver memory 1g), and prints after
each run the heap in use after a full collection and the number of DataFrames left in
the session's cache; the baseline is the heap after the first run, in the same session.

    .venv/bin/python bench/bench_audit_session.py [--events 200000] [--runs 12]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpcdc_toolkit._runtime import interrupt_on_sigterm

sys.path.insert(0, str(Path(__file__).parent))
from bench_audit import generate  # noqa: E402  (a sibling script, not a package)


def heap_mib(spark: Any) -> float:
    """The JVM's heap in use after a full collection (Python's first, so that the
    objects it releases on the JVM's side are collectable)."""
    gc.collect()
    jvm = spark.sparkContext._jvm
    jvm.java.lang.System.gc()
    runtime = jvm.java.lang.Runtime.getRuntime()
    return float(runtime.totalMemory() - runtime.freeMemory()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=12)
    args = parser.parse_args()

    from gpcdc_toolkit.audit import run_audit
    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.ingest.spark import spark_session

    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "archive"
        generate(archive, args.events)
        config = load_config({"work_dir": str(Path(tmp) / "work"), "spark.master": "local[2]"}, environ={})
        spark = spark_session(config, "bench-audit-session", kafka_connector=False)
        spark.sparkContext.setLogLevel("ERROR")
        cache = spark._jsparkSession.sharedState().cacheManager()
        try:
            baseline = None
            for run in range(1, args.runs + 1):
                began = time.perf_counter()
                result = run_audit(spark, config, archive=archive, write=False)
                seconds = time.perf_counter() - began
                events, summary = result.events, result.summary
                del result
                heap = heap_mib(spark)
                baseline = baseline or heap
                print(f"run {run:>2}: {events:,} events in {seconds:.1f} s, findings {summary}; heap {heap:6.0f} MiB "
                      f"({heap / baseline:.2f}x the first run's); session cache "
                      f"{'empty' if cache.isEmpty() else 'NOT empty'}", flush=True)
        finally:
            spark.stop()


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
