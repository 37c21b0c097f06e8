"""Validation cost against count(*) and against pulling every row, and the writers'
stall at sync points, all measured in the same run.

1. A source (1+3 segments) and a target (1+2; or with ``--target postgres``, a plain
   PostgreSQL server, compared through its front door) hold the same table of N rows
   (id, text, numeric, float, int[], jsonb), each row on the segment its key names. Per N:
   - baseline: count(*) on every segment of both clusters, all at once;
   - checksum validation of the equal tables, without and with the placement check
     (each target segment asked for its rows that its routing sends elsewhere); ratio
     to the baseline; each the median of three runs;
   - the same with 100 rows changed on the target (bisection and row diff);
   - pulling every row of both sides and comparing them in Python (the demo's way);
     ratio of checksum validation to it; and the Spark mode (local[2], session already
     started) on the same table, against the same pull. Both only up to 2M rows (the
     pull holds every row of both sides in memory).
2. Sync points while writers commit distributed transactions (4 threads, 1 to 3 keys
   each): the commit-lock hold of --syncpoints sync points (p50, p99, max), and the
   writers' commit latency p99 with sync points every 50 ms against without, in the
   same run.

    .venv/bin/python bench/bench_validate.py [--rows 1000000,10000000] [--syncpoints 200] [--target postgres]

The sandboxes and their tables are kept under --data and reused by later runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.cluster import Cluster, Session, segment_for
from gpcdc_toolkit.sandbox import Sandbox
from gpcdc_toolkit.validate import compare_checksums, take_syncpoint
from gpcdc_toolkit.validate._diff import diff_rows

COLUMNS = "(id bigint PRIMARY KEY, name text, amount numeric(20,4), ratio float8, tags int[], doc jsonb)"
ROWS_OF_IDS = ("SELECT i, 'name ' || i, i * 1.5, i / 7.0, ARRAY[i % 10, 3], jsonb_build_object('a', i) "
               "FROM ids")


def table_name(rows: int) -> str:
    return f"bench_{rows}"


def load(cluster: Cluster, rows: int) -> None:
    """The table of ``rows`` rows, each on its segment: ids routed here, rows built in SQL."""
    name = table_name(rows)
    with cluster.coordinator_connection() as conn:
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()[0]:  # type: ignore[index]
            return
    with cluster.session() as session:  # a plain target's through its front door
        session.ddl(f"CREATE TABLE {name} {COLUMNS} DISTRIBUTED BY (id)")
    per_segment: dict[int, list[int]] = {s.content: [] for s in cluster.segments}
    for i in range(1, rows + 1):
        per_segment[segment_for([i], cluster.segment_count)].append(i)
    for node in cluster.segments:
        with cluster.connect_node(node) as conn, conn.transaction():
            conn.execute("CREATE TEMP TABLE ids (i bigint) ON COMMIT DROP")
            with conn.cursor().copy("COPY ids FROM STDIN") as copy:
                for i in per_segment[node.content]:
                    copy.write_row((i,))
            conn.execute(f"INSERT INTO {name} {ROWS_OF_IDS}")
        with cluster.connect_node(node) as conn:
            conn.execute(f"VACUUM ANALYZE {name}")


def count_all(source: Cluster, target: Cluster, name: str) -> float:
    """count(*) on every segment of both clusters at once; the median of three runs' seconds."""
    nodes = [(c, n) for c in (source, target) for n in c.segments]

    def count(pair: tuple[Cluster, object]) -> int:
        cluster, node = pair
        with cluster.connect_node(node) as conn:  # type: ignore[arg-type]
            return int(conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0])  # type: ignore[index]

    times = []
    for _ in range(3):
        started = time.perf_counter()
        with ThreadPoolExecutor(len(nodes)) as pool:
            list(pool.map(count, nodes))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def pull_and_compare(source: Cluster, target: Cluster, name: str) -> float:
    """Every row of both sides, as text, compared as multisets in Python; seconds."""
    started = time.perf_counter()
    rows = []
    for cluster in (source, target):
        texts: list[tuple[str]] = []
        for node in cluster.segments:
            with cluster.connect_node(node) as conn:
                texts += conn.execute(f"SELECT {name}::text FROM {name}").fetchall()
        rows.append(texts)
    diff = diff_rows(name, rows[0], rows[1])
    assert diff.equal, diff.line()
    return time.perf_counter() - started


def timed_checksum(source: Cluster, target: Cluster, name: str, placement: bool) -> tuple[float, object]:
    """The median of three validations' seconds, and the last one's result."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        result = compare_checksums(source, target, name, placement=placement)
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def change_rows(target: Cluster, name: str, rows: int, n: int, undo: bool = False) -> None:
    for i in random.Random(7).sample(range(1, rows + 1), n):
        node = target.segments[segment_for([i], target.segment_count)]
        with target.connect_node(node) as conn:
            conn.execute(f"UPDATE {name} SET name = name || %s WHERE id = %s" if not undo else
                         f"UPDATE {name} SET name = left(name, -1) WHERE id = %s",
                         ("!", i) if not undo else (i,))


def timed_spark(spark: object, source: Cluster, target: Cluster, name: str) -> float:
    from gpcdc_toolkit.validate import Snapshots
    from gpcdc_toolkit.validate._spark import compare_spark

    started = time.perf_counter()
    with Snapshots(source) as s, Snapshots(target) as t:
        result = compare_spark(spark, s, t, source.table(name), target.table(name))
    assert result.equal, result.diff.line()
    return time.perf_counter() - started


def validation(source: Cluster, target: Cluster, rows: int, spark: object) -> None:
    name = table_name(rows)
    baseline = count_all(source, target, name)
    fast, result = timed_checksum(source, target, name, placement=False)
    assert result.equal, result.diff.line()  # type: ignore[attr-defined]
    placed, result = timed_checksum(source, target, name, placement=True)
    assert result.equal, result.diff.line()  # type: ignore[attr-defined]
    change_rows(target, name, rows, 100)
    try:
        differing, result = timed_checksum(source, target, name, placement=False)
        assert result.diff.changed == 100, result.diff.line()  # type: ignore[attr-defined]
    finally:
        change_rows(target, name, rows, 100, undo=True)
    pulled = pull_and_compare(source, target, name) if rows <= 2_000_000 else None
    by_spark = timed_spark(spark, source, target, name) if rows <= 2_000_000 else None
    print(f"{rows:>10} rows: count(*) {baseline:6.2f} s; checksum {fast:6.2f} s ({fast / baseline:5.1f}x count), "
          f"with placement {placed:6.2f} s ({placed / baseline:5.1f}x), 100 rows changed {differing:6.2f} s "
          f"({differing / baseline:5.1f}x, {result.rounds} rounds, {result.settled} chunks settled by key, "  # type: ignore[attr-defined]
          f"{result.fetched} rows fetched)"  # type: ignore[attr-defined]
          + (f"; full pull {pulled:6.2f} s (checksum {fast / pulled:.3f}x of it)" if pulled else "")
          + (f"; spark mode {by_spark:6.2f} s ({by_spark / pulled:.2f}x the pull)" if by_spark and pulled else ""),
          flush=True)


# -- sync points -------------------------------------------------------------------------

def writers(source: Cluster, stop: threading.Event, latencies: list[float], threads: int = 4) -> list[threading.Thread]:
    with Session(source) as session:
        session.ddl("DROP TABLE IF EXISTS bench_hot")
        session.ddl("CREATE TABLE bench_hot (id int PRIMARY KEY, n bigint) DISTRIBUTED BY (id)")
        with session.transaction() as tx:
            tx.insert("bench_hot", [{"id": i, "n": 0} for i in range(64)])

    def write(seed: int) -> None:
        rng = random.Random(seed)
        with Session(source) as session:
            while not stop.is_set():
                tx = session.transaction()
                for key in sorted(rng.sample(range(64), rng.choice((1, 2, 3)))):
                    tx.update("bench_hot", {"id": key}, {"n": rng.randint(0, 10**9)})
                started = time.perf_counter()
                tx.commit()
                latencies.append(time.perf_counter() - started)

    out = [threading.Thread(target=write, args=(s,)) for s in range(threads)]
    for t in out:
        t.start()
    return out


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1] if len(values) > 1 else values[0]


def syncpoints(source: Cluster, count: int) -> None:
    stop = threading.Event()
    latencies: list[float] = []
    threads = writers(source, stop, latencies)
    try:
        time.sleep(5)  # the quiet period: commit latency without sync points
        quiet = list(latencies)
        latencies.clear()
        stalls = []
        for _ in range(count):
            with take_syncpoint(source) as point:
                stalls.append(point.stall_ms)
            time.sleep(0.05)
        busy = list(latencies)
    finally:
        stop.set()
        for t in threads:
            t.join()
    quiet_p99, busy_p99 = p(quiet, 0.99) * 1000, p(busy, 0.99) * 1000
    print(f"sync points: {count} while {len(quiet) + len(busy)} distributed transactions committed; commit lock held "
          f"p50 {statistics.median(stalls):.1f} ms, p99 {p(stalls, 0.99):.1f} ms, max {max(stalls):.1f} ms; writers' "
          f"commit p99 {busy_p99:.1f} ms with sync points every 50 ms against {quiet_p99:.1f} ms without "
          f"({busy_p99 / quiet_p99:.2f}x)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1000000,10000000")
    parser.add_argument("--syncpoints", type=int, default=200)
    parser.add_argument("--target", choices=("greenplum", "postgres"), default="greenplum")
    # The servers run as another OS user: a directory every user can enter.
    parser.add_argument("--data", type=Path, default=Path("/var/tmp/gpcdc-bench-validate"))
    args = parser.parse_args()
    source_box = Sandbox("source", args.data)
    target_box = Sandbox("target" if args.target == "greenplum" else f"target-{args.target}", args.data)
    source_box.up(segments=3)
    target_box.up(segments=2, flavour=args.target)
    from gpcdc_toolkit.config import load_config
    from gpcdc_toolkit.ingest.spark import spark_session

    spark = spark_session(load_config({"work_dir": str(args.data), "spark.master": "local[2]"}, environ={}),
                          "bench-validate", kafka_connector=False, jvm_log=args.data / "spark.log")
    try:
        source, target = source_box.cluster(), target_box.cluster()
        for rows in (int(n) for n in args.rows.split(",")):
            load(source, rows)
            load(target, rows)
            validation(source, target, rows, spark)
        if args.syncpoints:
            syncpoints(source, args.syncpoints)
    finally:
        spark.stop()
        source_box.down()
        target_box.down()


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
