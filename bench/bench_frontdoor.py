"""Replay into targets reached through a front door, against a plain batched INSERT of the
same rows into the same server, in the same run.

1. Source (1+3 segments) with capture running: --rows rows inserted in transactions of
   1,000 (one table, bigint key, a bigint and a 40-byte text), then captured.
2. Per target (a plain PostgreSQL server; a Citus coordinator with 2 workers when Citus
   is installed): a fresh target, the stream replayed into it (`Replayer`, the initial
   load empty); replay rate = rows applied after the first batch / the seconds they took.
3. Baseline: the same rows inserted into a fresh table of the same server, through the
   same door, 1,000 per transaction with psycopg's pipelined executemany.

Ratio = replay rows/s / batched INSERT rows/s (goal >= 0.5).

    .venv/bin/python bench/bench_frontdoor.py [--rows 200000] [--targets postgres,citus]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureGroup, wait_until_acknowledged
from gpcdc_toolkit.cluster import Session
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.errors import SandboxError
from gpcdc_toolkit.replay import Progress, Replayer
from gpcdc_toolkit.sandbox import Sandbox, citus_installed

TABLE = "bench_door"
CREATE = f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, a bigint, b text) DISTRIBUTED BY (id)"
PER_TRANSACTION = 1000


def rows(count: int) -> list[dict[str, object]]:
    return [{"id": i, "a": i * 7, "b": f"{i:040d}"} for i in range(count)]


class Applied:
    """Progress callback: the rows applied after the first batch, and over how long."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.first_rows = 0
        self.last = 0.0
        self.rows = 0

    def __call__(self, progress: Progress) -> None:
        if progress.rows > self.rows:
            now = time.perf_counter()
            if self.first is None:
                self.first, self.first_rows = now, progress.rows
            self.last, self.rows = now, progress.rows

    @property
    def rate(self) -> float:
        return (self.rows - self.first_rows) / max(self.last - (self.first or self.last), 1e-9)


def batched_insert(target: Sandbox, count: int) -> float:
    """Rows/s of the same rows inserted at the target's door, 1,000 per transaction."""
    cluster = target.cluster()
    name = f"{TABLE}_baseline"
    with cluster.session() as session:
        session.ddl(CREATE.replace(TABLE, name))
    data = rows(count)
    with cluster.coordinator_connection() as conn:
        began = time.perf_counter()
        for start in range(0, count, PER_TRANSACTION):
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {name} (id, a, b) VALUES (%s, %s, %s)",
                                [(r["id"], r["a"], r["b"]) for r in data[start:start + PER_TRANSACTION]])
        seconds = time.perf_counter() - began
    return count / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--targets", default="postgres,citus")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-door-"))
    work.chmod(0o755)
    boxes: list[Sandbox] = []
    broker = EmbeddedBroker(work)
    group = None
    try:
        source = Sandbox("source", work).up(segments=3)
        boxes.append(source)
        broker.up()
        config = load_config({"work_dir": str(work), "kafka.bootstrap_servers": broker.bootstrap_servers,
                              "source.sandbox": "source", "kafka.topic_prefix": "door"}, environ={})
        cluster = source.cluster()
        with Session(cluster) as session:
            session.ddl(CREATE)
        pipeline = Pipeline(work, "door")
        bootstrap(cluster, pipeline, "snapshot")
        group = CaptureGroup(config)
        group.start()
        data = rows(args.rows)
        with Session(cluster) as session:
            for start in range(0, args.rows, PER_TRANSACTION):
                with session.transaction() as tx:
                    tx.insert(TABLE, data[start:start + PER_TRANSACTION])
        wait_until_acknowledged(cluster, pipeline.slot, timeout=600)
        print(f"front-door replay, {args.rows:,} rows in transactions of {PER_TRANSACTION}:")
        for flavour in args.targets.split(","):
            if flavour == "citus":
                try:
                    citus_installed()
                except SandboxError as e:
                    print(f"  citus: not measured ({e})")
                    continue
            target = Sandbox(f"t-{flavour}-{uuid.uuid4().hex[:4]}", work).up(segments=2, flavour=flavour)
            boxes.append(target)
            applied = Applied()
            with Replayer(config.with_settings({"target.sandbox": target.name})) as replayer:
                replayer.run(progress=applied, progress_interval=0.0)
            assert applied.rows == args.rows and applied.first is not None, (applied.rows, args.rows)
            replay_rate = applied.rate
            baseline = batched_insert(target, args.rows)
            print(f"  {flavour:<9} replay {replay_rate:>9,.0f} rows/s   batched INSERT {baseline:>9,.0f} rows/s   "
                  f"ratio {replay_rate / baseline:.2f}")
    finally:
        if group is not None:
            group.stop()
        broker.down()
        for box in boxes:
            box.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
