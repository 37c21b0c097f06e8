"""Capture of a Citus worker, against pg_recvlogical in the same run.

A Citus cluster (coordinator + 2 workers) takes N rows as multi-shard INSERTs through
its coordinator (1000 rows per transaction: two-phase, several connections per
worker, so each worker holds several prepared parts per transaction). Then, on worker
0, pg_recvlogical (pgoutput protocol 3, two-phase, to /dev/null) and a capture worker
(two-phase pgoutput -> parts merged per transaction, shards named back to tables ->
protocol events -> Kafka, slot acknowledged after delivery) each read the same WAL
from slots created at the same point. Printed: rows/s of each and their ratio.

    .venv/bin/python bench/bench_citus_capture.py [--rows 200000]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench_capture import stages  # the same stages, timed the same way (bench/ is the script's directory)

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureWorker, WorkerSettings
from gpcdc_toolkit.cluster import Cluster
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.protocol import parse_lsn
from gpcdc_toolkit.sandbox import Sandbox, find_pg_bin


def position(cluster: Cluster, query: str, *params: object) -> int:
    with cluster.connect_node(cluster.segments[0]) as conn:
        return parse_lsn(conn.execute(query, params).fetchone()[0])  # type: ignore[index]


def warm_up(kafka: dict[str, str]) -> None:
    """One idempotent message through a fresh broker, so that its start-up (the
    producer id it hands out once ready) is not timed as capture's."""
    from confluent_kafka import Producer

    producer = Producer({**kafka, "enable.idempotence": True})
    producer.produce("bench-warm-up", b"x")
    assert producer.flush(60) == 0


def throughput(cluster: Cluster, config, rows: int) -> None:
    with cluster.coordinator_connection() as conn:
        conn.execute("CREATE TABLE bench_rows (id bigint PRIMARY KEY, payload text)")
        conn.execute("SELECT create_distributed_table('bench_rows', 'id')")
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    start = bootstrap(cluster, pipeline, "snapshot")
    worker = cluster.segments[0]
    with cluster.connect_node(worker) as conn:
        for slot in ("recv", "stages"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", (slot,))
    t0 = time.perf_counter()
    with cluster.coordinator_connection() as conn:
        for first in range(0, rows, 1000):
            conn.execute("INSERT INTO bench_rows SELECT g, repeat('x', 40) FROM generate_series(%s::bigint, %s::bigint) g",
                         (first, min(rows, first + 1000) - 1))
    write_s = time.perf_counter() - t0
    end = position(cluster, "SELECT pg_current_wal_flush_lsn()::text")
    with cluster.connect_node(worker) as conn:  # (Citus hides shards from a worker's pg_class, not from queries)
        on_worker = sum(int(conn.execute(f"SELECT count(*) FROM {shard}").fetchone()[0])  # type: ignore[index]
                        for content, shard in cluster._shard_names(cluster.table("bench_rows")) if content == 0)

    t0 = time.perf_counter()
    subprocess.run([str(find_pg_bin() / "pg_recvlogical"), "-d", cluster.dsn(worker), "--slot", "recv", "--start",
                    "-o", "proto_version=3", "-o", "two_phase=on", "-o", f"publication_names={start.publication}",
                    "-E", f"{end >> 32:X}/{end & 0xFFFFFFFF:X}", "-f", "/dev/null", "--no-loop"], check=True)
    recv_s = time.perf_counter() - t0

    settings = WorkerSettings(prefix=config.kafka.topic_prefix, kafka=kafka_client_settings(config))
    warm_up(settings.kafka)
    stage_s = stages(cluster, start, settings, end)
    capture = CaptureWorker(cluster, worker, start, settings, database="postgres", partitions=cluster.segment_count)
    stop = threading.Event()
    thread = threading.Thread(target=capture.run, args=(stop,))
    t0 = time.perf_counter()
    thread.start()
    try:
        # Waited on by the worker's own record of what it acknowledged (as bench_capture.py
        # does): a connection every 20 ms would take the GIL from the worker's thread.
        while capture.stats.acked_lsn < end:
            assert thread.is_alive(), capture.stats.last_error
            time.sleep(0.02)
        capture_s = time.perf_counter() - t0
        slot = "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s"
        while position(cluster, slot, pipeline.slot) < end:  # and the server has it
            time.sleep(0.02)
    finally:
        stop.set()  # interrupted too: the worker's thread would keep the process alive
        thread.join()
    print(f"citus capture ({rows} rows written through the coordinator in {write_s:.1f} s, 1000 per transaction; "
          f"worker 0 holds {on_worker}):")
    print(f"  pg_recvlogical, two-phase -> /dev/null : {on_worker / recv_s:>10,.0f} rows/s")
    print(f"  capture -> Kafka, acked               : {on_worker / capture_s:>10,.0f} rows/s")
    print(f"  ratio                                 : {recv_s / capture_s:>10.2f}", flush=True)
    print("where a captured row's time goes, each stage alone on the same WAL:")
    for stage, seconds in [("pg_recvlogical", recv_s), *stage_s.items(), ("capture, all stages", capture_s)]:
        print(f"  {stage:<40}: {seconds / on_worker * 1e6:6.2f} us/row", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    work.chmod(0o755)
    sandbox = Sandbox("citus-bench", work)
    broker = EmbeddedBroker(work)
    try:
        sandbox.up(segments=2, flavour="citus")
        broker.up()
        config = load_config({"work_dir": str(work), "kafka.bootstrap_servers": broker.bootstrap_servers,
                              "kafka.topic_prefix": "bench", "source.sandbox": "citus-bench"}, environ={})
        throughput(sandbox.cluster(), config, args.rows)
    finally:
        broker.down()
        sandbox.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
