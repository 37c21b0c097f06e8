"""Processes in turn on one Spark Connect server: a session handed on against a new one each.

Each process connects, runs one job with Python workers (``mapInArrow`` over 100,000
rows, as the ``gpcdc`` source's reads and the audit's parsing use them), and stops its
session. Two ways, alternately, ``--runs`` processes each, on one server (``local[2]``):

* handed on: ``spark_session`` as the toolkit makes it (a slot's session, reused);
* new (the baseline): a session of its own each time, as PySpark makes it
  (``SparkSession.builder.remote(url).create()``), stopped after.

Printed: each way's median seconds from the session's start to its stop (the
interpreter's start and imports left out; a session handed on is tidied at its stop),
the ratio handed-on ÷ new, and the Python processes each way left on the server (its
daemons and their workers), with their proportional set size, counted after the runs of
that way.

    .venv/bin/python bench/bench_server_sessions.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gpcdc_toolkit._runtime import interrupt_on_sigterm

_PROCESS = """
import json, sys, time
from pyspark.sql import SparkSession
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.ingest.spark import spark_session

work, way, url = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
if way == "handed-on":
    spark = spark_session(load_config({"work_dir": work}, environ={}))
else:
    spark = SparkSession.builder.remote(url).create()

def passed_on(batches):
    yield from batches

rows = spark.range(100_000).mapInArrow(passed_on, "id long").count()
spark.stop()
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rows": rows}))
"""


def python_children(pid: int) -> tuple[int, int]:
    """The server's Python processes (daemons and their workers): how many, and their
    proportional set size in KiB."""
    children: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                children[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in children.items() if parent in frontier} - found
        found |= frontier
    pss = 0
    for child in found:
        try:
            for line in Path(f"/proc/{child}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return len(found), pss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    from gpcdc_toolkit.ingest import SparkServer

    with tempfile.TemporaryDirectory(prefix="gpcdc-bench-sessions-") as work:
        server = SparkServer(work)
        try:
            server.up("local[2]")
            status = server.status()
            assert status.pid is not None and status.url is not None

            def run(way: str) -> float:
                done = subprocess.run([sys.executable, "-c", _PROCESS, work, way, status.url or ""],
                                      capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                assert result["rows"] == 100_000, result
                return float(result["seconds"])

            run("handed-on")  # the server's first job compiles what both ways run
            seconds: dict[str, list[float]] = {"new": [], "handed-on": []}
            left: dict[str, tuple[int, int]] = {}
            for way in ("handed-on", "new"):  # each way's leftovers counted apart
                before = python_children(status.pid)
                for _ in range(args.runs):
                    seconds[way].append(run(way))
                after = python_children(status.pid)
                left[way] = (after[0] - before[0], after[1] - before[1])
            for _ in range(args.runs):  # and the times again, alternately
                for way in ("new", "handed-on"):
                    seconds[way].append(run(way))
        finally:
            server.down()
    median = {way: statistics.median(times) for way, times in seconds.items()}
    for way in ("new", "handed-on"):
        processes, pss = left[way]
        print(f"{way:>9}: median {median[way]:6.2f} s over {len(seconds[way])} processes "
              f"(min {min(seconds[way]):.2f}, max {max(seconds[way]):.2f}); after {args.runs} processes in turn "
              f"the server had {processes:+d} Python processes, {pss / 1024:+.0f} MiB")
    print(f"handed-on / new: {median['handed-on'] / median['new']:.2f}")


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
