"""Where a cold audit's time goes in the JVM: its JIT compilers and Spark's code generation.

One audit of ``bench_audit.py``'s archive (``--events``, generated there first) in a
fresh local session (``local[2]``, the toolkit's settings), its JVM started with
``--java-options`` (the toolkit's class archive first, unless ``--class-archive off``)
by the Java of ``JAVA_HOME``. Printed: the audit's seconds, the JIT compilers' CPU
time during it (``CompilationMXBean``: both tiers, on threads of their own that share
the cores with the audit's tasks), the garbage collectors' time, and Spark's code
generation (classes compiled, Janino's milliseconds). Run it once per way, alternately,
to compare JVM options or Javas.

    .venv/bin/python bench/bench_audit_jit.py [--events 1000000] [--java-options "-XX:TieredStopAtLevel=1"]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from gpcdc_toolkit._runtime import interrupt_on_sigterm

SKEW_MS, SILENCE_MS = 1000, 30_000


def _counters(spark: Any) -> dict[str, float]:
    jvm = spark.sparkContext._jvm
    codegen = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    management = jvm.java.lang.management.ManagementFactory
    return {"jit_s": management.getCompilationMXBean().getTotalCompilationTime() / 1000,
            "gc_s": sum(b.getCollectionTime() for b in management.getGarbageCollectorMXBeans()) / 1000,
            "classes": codegen.getCount(), "janino_s": codegen.getSnapshot().getMean() * codegen.getCount() / 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--data", type=Path, default=Path.home() / ".cache" / "gpcdc" / "bench-audit")
    parser.add_argument("--java-options", default="")
    parser.add_argument("--class-archive", choices=("on", "off"), default="on")
    args = parser.parse_args()
    interrupt_on_sigterm()
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_audit import generate

    path = args.data / f"events-{args.events}"
    if not (path / "run-000001").is_dir():
        generate(path, args.events)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from gpcdc_toolkit.archive import read_archive
    from gpcdc_toolkit.audit import Thresholds, audit_events
    from gpcdc_toolkit.ingest._settings import SESSION_SETTINGS
    from gpcdc_toolkit.ingest.spark import class_archive, class_archive_options

    archive = class_archive_options() if args.class_archive == "on" and class_archive(wait=True) else ""
    spark = (SparkSession.builder.master("local[2]").appName("bench-audit-jit").config(map=SESSION_SETTINGS)
             .config("spark.driver.memory", "6g")
             .config("spark.driver.defaultJavaOptions", f"{archive} {args.java_options}".strip()).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        java = spark.sparkContext._jvm.java.lang.System.getProperty("java.version")
        before = _counters(spark)
        start = time.perf_counter()
        findings, _ = audit_events(read_archive(spark, path), Thresholds(SKEW_MS, SILENCE_MS))
        counts = {r["rule"]: r["count"] for r in findings.groupBy("rule").count().collect()}
        seconds = time.perf_counter() - start
        after = _counters(spark)
    finally:
        spark.stop()
    spent = {k: after[k] - before[k] for k in after}
    print(f"java {java}, options {args.java_options or '(none)'}: audit {seconds:.2f} s; JIT {spent['jit_s']:.1f} s of "
          f"CPU, GC {spent['gc_s']:.2f} s, {spent['classes']:.0f} classes generated in {spent['janino_s']:.2f} s; "
          f"findings {counts}")


if __name__ == "__main__":
    main()
