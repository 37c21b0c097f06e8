"""A fresh local Spark session's start, with and without the archive of Spark's classes.

Each run is a new process, as a notebook's kernel or a command is: ``spark_session`` as
the toolkit makes it (``local[2]``, no Kafka connector), then the session's first job
(``spark.range(2).count()``), then its first job with Python workers (a ``mapInArrow``,
as the toolkit's reads run). Two ways, alternately, ``--runs`` processes each:

* archive: ``spark.class_archive = true`` (the default), its JVM started from the archive
  (recorded first when there is none, before any run is timed);
* none (the baseline): ``spark.class_archive = false``.

Printed: each run's seconds for the session, its first job, its first ``mapInArrow``
and the three together (from the process's first line, imports included); then each
way's median of the three together and the ratio archive ÷ none.

    .venv/bin/python bench/bench_spark_start.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

from gpcdc_toolkit._runtime import interrupt_on_sigterm

_PROCESS = """
import json, sys, time
start = time.perf_counter()
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.ingest.spark import spark_session

config = load_config({"work_dir": sys.argv[1], "spark.class_archive": sys.argv[2] == "archive"}, environ={})
spark = spark_session(config, "bench-start", kafka_connector=False)
session = time.perf_counter()
spark.range(0, 2, 1, 2).count()
first = time.perf_counter()

def same(batches):
    yield from batches

spark.range(0, 2, 1, 2).mapInArrow(same, "id long").count()
arrow = time.perf_counter()
print(json.dumps({"session": session - start, "first_job": first - session, "first_arrow": arrow - first,
                  "total": arrow - start}))
spark.stop()
"""

WAYS = ("none", "archive")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    interrupt_on_sigterm()
    from gpcdc_toolkit.ingest.spark import class_archive

    archive = class_archive(wait=True)
    if archive is None:
        sys.exit("no archive of Spark's classes could be recorded: see the warning above")
    print(f"archive: {archive} ({archive.stat().st_size / 2**20:.0f} MiB)")
    totals: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as work:
        for run in range(args.runs):
            for way in WAYS:
                done = subprocess.run([sys.executable, "-c", _PROCESS, work, way], capture_output=True, text=True,
                                      stdin=subprocess.DEVNULL, timeout=600)
                if done.returncode != 0:
                    sys.exit(f"run {run + 1} ({way}) failed: {done.stderr.strip().splitlines()[-1:]}")
                times = json.loads(done.stdout.strip().splitlines()[-1])
                totals[way].append(times["total"])
                print(f"run {run + 1} {way:<8} session {times['session']:.2f} s, first job {times['first_job']:.2f} s, "
                      f"first mapInArrow {times['first_arrow']:.2f} s, together {times['total']:.2f} s", flush=True)
    medians = {way: statistics.median(values) for way, values in totals.items()}
    print(f"median together: none {medians['none']:.2f} s, archive {medians['archive']:.2f} s; "
          f"ratio archive/none {medians['archive'] / medians['none']:.2f}")


if __name__ == "__main__":
    main()
