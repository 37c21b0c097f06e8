"""Small audits again and again in one Spark session, with the toolkit's session settings
against Spark's defaults for two of them, in the same run.

A notebook, a scheduler and the test suite audit small streams many times in one
session (or on the Spark server). Each child process starts a local session
(``local[2]``) with the toolkit's settings (``gpcdc_toolkit/ingest/_settings.py``), or
with Spark's defaults for the generated-code cache (100 classes) and PySpark's
recording of each call's line for error messages (on), then audits the warm-up stream
(29 distributed transactions over two segments, ``audit/_warm.py``) ``--runs`` times:
``audit_events`` and the findings collected. The two kinds of child run alternately,
``--pairs`` times each. Printed per child: the JVM's heap in use after its last audit
(after a full collection) and its metaspace, where cached classes live; each audit's
seconds, the classes Spark compiled for it, and the JVM's CPU seconds by thread (JIT
compilers, garbage collector, task threads, the rest). Then the median of the audits
after each session's first, and its ratio to the baseline (Spark's defaults).

    .venv/bin/python bench/bench_audit_repeat.py [--runs 6] [--pairs 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpcdc_toolkit._runtime import interrupt_on_sigterm

sys.path.insert(0, str(Path(__file__).parent))
from bench_audit_session import heap_mib  # noqa: E402  (a sibling script, not a package)

SPARK_DEFAULTS = {"spark.sql.codegen.cache.maxEntries": "100", "spark.python.sql.dataFrameDebugging.enabled": "true"}


def _thread_seconds(pid: int) -> dict[str, float]:
    """The JVM's CPU seconds so far, by kind of thread."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            name = open(f"{task}/comm").read().strip()
            fields = open(f"{task}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        kind = ("jit" if "Compiler" in name else "gc" if "GC" in name or "G1" in name
                else "tasks" if "Executor task" in name else "rest")
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _memory_mib(spark: Any) -> dict[str, float]:
    """The JVM's heap in use after a full collection, and its metaspace (where the
    generated classes live, outside the heap)."""
    out = {"heap": heap_mib(spark)}
    for pool in spark.sparkContext._jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans():
        if pool.getName() == "Metaspace":
            out["metaspace"] = pool.getUsage().getUsed() / 2**20
    return out


def child(settings: dict[str, str], runs: int) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from gpcdc_toolkit.audit import Thresholds, audit_events, events_frame
    from gpcdc_toolkit.audit._warm import warm_stream

    spark = SparkSession.builder.master("local[2]").appName("bench-audit-repeat").config(map=settings).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark.sparkContext._jvm
    pid = int(jvm.java.lang.ProcessHandle.current().pid())
    compiled = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    thresholds = Thresholds(clock_skew_ms=1000, silence_ms=60_000)
    out = []
    try:
        for _ in range(runs):
            classes, cpu, began = compiled.getCount(), _thread_seconds(pid), time.perf_counter()
            findings, _ = audit_events(events_frame(spark, warm_stream()), thresholds)
            findings.collect()
            seconds = time.perf_counter() - began
            after = _thread_seconds(pid)
            out.append({"seconds": seconds, "classes": compiled.getCount() - classes,
                        "cpu": {k: after.get(k, 0.0) - cpu.get(k, 0.0) for k in after}})
        memory = _memory_mib(spark)
    finally:
        spark.stop()
    return {"audits": out, "memory": memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child), args.runs)))
        return

    from gpcdc_toolkit.ingest._settings import SESSION_SETTINGS

    kinds = {"Spark's defaults": {**SESSION_SETTINGS, **SPARK_DEFAULTS}, "toolkit": dict(SESSION_SETTINGS)}
    steady: dict[str, list[float]] = {kind: [] for kind in kinds}
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    for pair in range(args.pairs):
        for kind, settings in kinds.items():
            with tempfile.TemporaryDirectory() as tmp:
                done = subprocess.run([sys.executable, __file__, "--runs", str(args.runs), "--child", json.dumps(settings)],
                                      env=env, cwd=tmp, capture_output=True, text=True, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            audits, memory = result["audits"], result["memory"]
            steady[kind] += [a["seconds"] for a in audits[1:]]
            print(f"pair {pair + 1}, {kind}: after the last audit, heap in use {memory['heap']:.0f} MiB, "
                  f"metaspace {memory.get('metaspace', 0.0):.0f} MiB")
            for i, a in enumerate(audits, 1):
                cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(a["cpu"].items()))
                print(f"  audit {i}: {a['seconds']:5.1f} s, {a['classes']:3d} classes compiled; JVM CPU s: {cpu}")
    base, ours = (statistics.median(steady[kind]) for kind in kinds)
    print(f"median of audits after each session's first: Spark's defaults {base:.1f} s, toolkit {ours:.1f} s "
          f"({ours / base:.2f}x)")


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
