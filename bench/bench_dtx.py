"""Distributed transactions per second on the sandbox, against plain local commits.

Each distributed transaction inserts 10 rows on each of 2 segments (two-phase
commit with markers); the baseline inserts the same 20 rows in one local transaction
on one server of the same sandbox, with the same number of threads. Printed as a
ratio, since this machine's absolute speed varies from run to run.

    ./dev bench            (or: .venv/bin/python bench/bench_dtx.py --seconds 5)
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import tempfile
import threading
import time
from pathlib import Path

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.cluster import Cluster, Session, segment_for
from gpcdc_toolkit.sandbox import Sandbox

ROWS_PER_SEGMENT = 10


def keys_for(segment: int, segments: int, counter: itertools.count) -> list[int]:
    keys: list[int] = []
    while len(keys) < ROWS_PER_SEGMENT:
        k = next(counter)
        if segment_for([k], segments) == segment:
            keys.append(k)
    return keys


_runs = itertools.count()


def run(threads: int, seconds: float, body) -> float:
    """Transactions per second of ``body(first_key)`` run by ``threads`` threads."""
    stop = time.monotonic() + seconds
    counts = [0] * threads
    errors: list[BaseException] = []
    run_id = next(_runs)

    def loop(i: int) -> None:
        try:
            with body((run_id * 64 + i) * 10**9 + 1) as step:
                while time.monotonic() < stop and not errors:
                    step()
                    counts[i] += 1
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.monotonic() - started)


class DistributedInserts:
    def __init__(self, cluster: Cluster, first_key: int) -> None:
        self.session = Session(cluster)
        self.counter = itertools.count(first_key)
        self.segments = cluster.segment_count

    def __enter__(self):
        def step() -> None:
            keys = keys_for(0, self.segments, self.counter) + keys_for(1, self.segments, self.counter)
            with self.session.transaction() as tx:
                tx.insert("bench_rows", [{"id": k, "v": "x" * 40} for k in keys])
        return step

    def __exit__(self, *exc):
        self.session.close()


class LocalInserts:
    def __init__(self, cluster: Cluster, first_key: int) -> None:
        self.conn = cluster.connect_node(cluster.segments[0])
        self.counter = itertools.count(first_key)

    def __enter__(self):
        def step() -> None:
            with self.conn.transaction(), self.conn.cursor() as cur:
                cur.executemany("INSERT INTO bench_local (id, v) VALUES (%s, %s)",
                                [(next(self.counter), "x" * 40) for _ in range(2 * ROWS_PER_SEGMENT)])
        return step

    def __exit__(self, *exc):
        self.conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--threads", default="1,4,16")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    work.chmod(0o755)
    sandbox = Sandbox("bench", work).up(segments=2)
    try:
        cluster = sandbox.cluster()
        with Session(cluster) as session:
            session.ddl("CREATE TABLE bench_rows (id bigint PRIMARY KEY, v text) DISTRIBUTED BY (id)")
        with cluster.connect_node(cluster.segments[0]) as conn:
            conn.execute("CREATE TABLE bench_local (id bigint PRIMARY KEY, v text)")
        print(f"{'threads':>7} {'dtx/s':>8} {'local txn/s':>12} {'ratio':>6}   (2 segments x {ROWS_PER_SEGMENT} rows)")
        for threads in (int(t) for t in args.threads.split(",")):
            dtx = run(threads, args.seconds, lambda k: DistributedInserts(cluster, k))
            local = run(threads, args.seconds, lambda k: LocalInserts(cluster, k))
            print(f"{threads:>7} {dtx:>8.0f} {local:>12.0f} {dtx / local:>6.2f}", flush=True)
    finally:
        sandbox.down(remove=True)
        shutil.rmtree(work)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
