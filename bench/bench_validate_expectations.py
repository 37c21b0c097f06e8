"""What great-expectations adds to a validation, against the same validation without it.

A source (1+3 segments) and a target (1+2) hold the same --tables tables of --rows
rows in all (id, text, numeric, float, jsonb; each row on the segment its key
names). ``validate()`` compares them as they are (no sync point), by checksums, with
``validate.expectations`` off and on, alternately, --rounds times. With it on, every
table gets its derived suite (row count, key unique and not null), and the first
--suited tables (default: all) a suite of three row-by-row expectations (a regular
expression, a set, not null), as ``expectations/`` gives two of the workload's six. Printed: the
median seconds of each and their ratio, how many expectations were evaluated, each
run with them (the first in the process also imports great-expectations), and the
process's peak RSS after its first validation (without) and after all.

With --command, each validation is the ``gpcdc validate --no-syncpoint`` a user runs,
in a process of its own: what great-expectations' import and the process's end cost
then counts too (the peak RSS is then not printed).

The call is the public one, so the same script measures any commit of the toolkit
(put it first on ``PYTHONPATH``).

    .venv/bin/python bench/bench_validate_expectations.py [--rows 53000] [--tables 6] [--suited 6] [--rounds 3] [--command]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.cluster import Session, segment_for
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import validate

COLUMNS = "(id bigint PRIMARY KEY, name text, amount numeric(20,4), ratio float8, doc jsonb) DISTRIBUTED BY (id)"


def load(sandbox: Sandbox, tables: int, rows: int) -> None:
    """Each table's rows on their segments: ids routed here, rows built in SQL."""
    cluster = sandbox.cluster()
    with Session(cluster) as session:
        for t in range(tables):
            session.ddl(f"CREATE TABLE bench_{t} {COLUMNS}")
    ids: dict[int, list[int]] = {s.content: [] for s in cluster.segments}
    for i in range(1, rows // tables + 1):
        ids[segment_for([i], cluster.segment_count)].append(i)
    for node in cluster.segments:
        with cluster.connect_node(node) as conn, conn.transaction():
            conn.execute("CREATE TEMP TABLE ids (i bigint) ON COMMIT DROP")
            with conn.cursor().copy("COPY ids FROM STDIN") as copy:
                for i in ids[node.content]:
                    copy.write_row((i,))
            for t in range(tables):
                conn.execute(f"INSERT INTO bench_{t} SELECT i, CASE i % 3 WHEN 0 THEN 'n' || i ELSE 'u' || i END, "
                             "i * 1.5, i / 7.0, jsonb_build_object('a', i) FROM ids")


def suites(directory: Path, tables: int) -> None:
    directory.mkdir()
    (directory / "none.json").write_text(json.dumps({"name": "none", "meta": {"gpcdc": {"frame": "events"}},
                                                     "expectations": []}))  # a directory holds at least one
    for t in range(tables):
        (directory / f"bench_{t}.json").write_text(json.dumps({
            "name": f"bench_{t} values", "meta": {"gpcdc": {"frame": "target", "table": f"public.bench_{t}"}},
            "expectations": [
                {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "name", "regex": "^[nu][0-9]+$"}},
                {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "doc", "value_set": ["x"],
                                                                         "mostly": 0.0}},
                {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "amount"}}]}))


def _command(work: Path, tables: list[str], expectations: bool) -> int:
    """``gpcdc validate`` of ``tables`` as a user runs it; the expectations it evaluated."""
    flag = "--validate-expectations" if expectations else "--no-validate-expectations"
    done = subprocess.run([sys.executable, "-m", "gpcdc_toolkit", "--work-dir", str(work), "--source-sandbox", "source",
                           "--target-sandbox", "target", "--validate-expectations-dir", str(work / "suites"), flag,
                           "validate", "--no-syncpoint", "--tables", *tables], capture_output=True, text=True,
                          cwd=work, check=False,  # not the checkout's directory: PYTHONPATH says which toolkit
                          env={k: v for k, v in os.environ.items() if not k.startswith("GPCDC_")})  # as load_config's
    assert done.returncode == 0, done.stdout + done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("great-expectations:")]
    return int(said[0].split()[1]) if said else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=53_000)
    parser.add_argument("--tables", type=int, default=6)
    parser.add_argument("--suited", type=int, default=None, help="tables with a suite of their own (default: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--command", action="store_true", help="run `gpcdc validate` in a process of its own")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    work.chmod(0o755)
    source, target = Sandbox("source", work), Sandbox("target", work)
    try:
        source.up(segments=3)
        target.up(segments=2)
        for sandbox in (source, target):
            load(sandbox, args.tables, args.rows)
        suited = args.tables if args.suited is None else args.suited
        suites(work / "suites", suited)
        config = load_config({"work_dir": str(work), "validate.expectations_dir": str(work / "suites")}, environ={})
        tables = [f"bench_{t}" for t in range(args.tables)]
        timings: dict[bool, list[float]] = {False: [], True: []}
        evaluated = 0
        peak_without = 0  # KiB: this process's peak after the first validation, which runs without
        for _ in range(args.rounds):
            for expectations in (False, True):
                t0 = time.perf_counter()
                if args.command:
                    evaluated = max(evaluated, _command(work, tables, expectations))
                    timings[expectations].append(time.perf_counter() - t0)
                    continue
                run = validate(config.with_settings({"validate.expectations": expectations}), tables=tables,
                               syncpoint=False)
                timings[expectations].append(time.perf_counter() - t0)
                assert run.verified, run.lines()
                evaluated = max(evaluated, len(run.expectations))
                peak_without = peak_without or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        off, on = statistics.median(timings[False]), statistics.median(timings[True])
        print(f"validate {args.tables} tables ({suited} with a suite of their own), {args.rows:,} rows in all, "
              f"{args.rounds} rounds (median):")
        print(f"  without expectations : {off:7.2f} s")
        print(f"  with expectations    : {on:7.2f} s ({evaluated} expectations, all met)")
        print(f"  ratio                : {on / off:7.2f}")
        print(f"  each run with them   : {', '.join(f'{t:.2f}' for t in timings[True])} s"
              + ("" if args.command else " (the first imports great-expectations)"))
        print(f"  each run without     : {', '.join(f'{t:.2f}' for t in timings[False])} s")
        if not args.command:
            print(f"  peak RSS             : {peak_without / 1024:7.0f} MiB after the first run (without), "
                  f"{peak / 1024:.0f} MiB after all")
    finally:
        source.down(remove=True)
        target.down(remove=True)
        shutil.rmtree(work)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
