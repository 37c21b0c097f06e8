"""Capture throughput, latency and memory, against pg_recvlogical in the same run.

1. Throughput: N rows are written on one segment; then pg_recvlogical (pgoutput, to
   /dev/null) and a capture worker (pgoutput -> protocol events -> Kafka, slot
   acknowledged after delivery) each read the same WAL from slots created at the same
   point. Printed: rows/s of each and their ratio.
2. Latency: a workload at a fixed rate while capture runs; per local transaction,
   commit time on the server to the Kafka timestamp of its END event; p50 / p99, for
   each of --latency-runs runs (a new pipeline each).
3. Memory: one large transaction (--large-mb of row data) captured by a worker
   process; its peak resident memory (VmHWM).

    .venv/bin/python bench/bench_capture.py [--rows 1000000] [--large-mb 1024] [--latency-runs 1] [--config FILE]
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import select
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import CaptureGroup, CaptureWorker, WorkerSettings, tune_for_capture, wait_until_acknowledged
from gpcdc_toolkit.cluster import Cluster, Session
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.protocol import Topics, kind_of, parse_lsn
from gpcdc_toolkit.sandbox import Sandbox, find_pg_bin
from gpcdc_toolkit.workload import WorkloadSpec, run_workload


def flush_lsn(cluster: Cluster, content: int) -> int:
    with cluster.connect_node(cluster.nodes[content + 1]) as conn:
        return parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])


def confirmed(cluster: Cluster, content: int, slot: str) -> int:
    with cluster.connect_node(cluster.nodes[content + 1]) as conn:
        return parse_lsn(conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                      (slot,)).fetchone()[0])


def write_rows(cluster: Cluster, rows: int, payload: int, per_txn: int) -> None:
    with Session(cluster) as session:
        for first in range(0, rows, per_txn):
            with session.transaction() as tx:
                tx.execute(0, "INSERT INTO bench_rows SELECT g, repeat('x', %s) FROM generate_series(%s::bigint, %s::bigint) g",
                           (payload, first, min(rows, first + per_txn) - 1))


def throughput(cluster: Cluster, config, rows: int, broker_pid: int) -> None:
    tune_for_capture()  # as a worker's process does: here the worker is a thread of this one
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    start = bootstrap(cluster, pipeline, "snapshot")
    segment = cluster.segments[0]
    with cluster.connect_node(segment) as conn:
        for slot in ("recv", "stages"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    write_rows(cluster, rows, 40, 1000)
    end = flush_lsn(cluster, 0)

    t0 = time.perf_counter()
    subprocess.run([str(find_pg_bin() / "pg_recvlogical"), "-d", cluster.dsn(segment), "--slot", "recv", "--start",
                    "-o", "proto_version=1", "-o", f"publication_names={start.publication}", "-o", "messages=true",
                    "-E", f"{end >> 32:X}/{end & 0xFFFFFFFF:X}", "-f", "/dev/null", "--no-loop"], check=True)
    recv_s = time.perf_counter() - t0

    from gpcdc_toolkit.connect import kafka_client_settings

    settings = WorkerSettings(prefix=config.kafka.topic_prefix, kafka=kafka_client_settings(config))
    stage_s = stages(cluster, start, settings, end)
    worker = CaptureWorker(cluster, segment, start, settings, database="postgres", partitions=cluster.segment_count)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    broker_before, machine_before = process_cpu(broker_pid), machine_cpu()
    t0 = time.perf_counter()
    thread.start()
    try:
        # Polled by the worker's own record of what it acknowledged: a query of the slot
        # every 20 ms (a connection each) took the GIL from the worker for a sixth of its
        # time, which a worker's process does not share with anything.
        while worker.stats.acked_lsn < end:
            assert thread.is_alive(), worker.stats.last_error
            time.sleep(0.02)
        capture_s = time.perf_counter() - t0
        while confirmed(cluster, 0, pipeline.slot) < end:  # and the server has it
            time.sleep(0.02)
        # Where the CPU went meanwhile: every thread named here started with the worker.
        with cluster.connect_node(segment) as conn:
            walsender = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                                     (pipeline.slot,)).fetchone()[0]
        cpu = {"capture's Python thread": thread_cpu(os.getpid(), thread.native_id),
               "librdkafka's threads": sum(thread_cpu(os.getpid(), tid) for tid in threads(os.getpid(), "rdk:")),
               "walsender (decoding the WAL)": process_cpu(walsender),
               "Kafka broker": process_cpu(broker_pid) - broker_before}
        machine, stolen = (after - before for after, before in zip(machine_cpu(), machine_before))
    finally:
        stop.set()  # interrupted too: the worker's thread would keep the process alive
        thread.join()
    print(f"throughput ({rows} rows, 1000 per transaction, one segment):")
    print(f"  pg_recvlogical -> /dev/null : {rows / recv_s:>10,.0f} rows/s")
    print(f"  capture -> Kafka, acked     : {rows / capture_s:>10,.0f} rows/s")
    print(f"  ratio                       : {recv_s / capture_s:>10.2f}", flush=True)
    print("where a captured row's time goes, each stage alone on the same WAL:")
    for stage, seconds in [("pg_recvlogical", recv_s), *stage_s.items(), ("capture, all stages", capture_s)]:
        print(f"  {stage:<40}: {seconds / rows * 1e6:6.2f} us/row", flush=True)
    print(f"CPU while capture ran, a row's share ({os.cpu_count()} cores: {os.cpu_count() * capture_s / rows * 1e6:.2f} "
          "us/row to spend):")
    for what, seconds in [*cpu.items(), ("the whole machine", machine), ("stolen by the hypervisor", stolen)]:
        print(f"  {what:<40}: {seconds / rows * 1e6:6.2f} us/row", flush=True)


_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int, tid: int) -> float:
    """CPU seconds of one thread, user and system."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def threads(pid: int, prefix: str) -> list[int]:
    """The threads of a process whose name begins with ``prefix``."""
    return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()
            if (task / "comm").read_text().startswith(prefix)]


def machine_cpu() -> tuple[float, float]:
    """CPU seconds the machine's cores worked in all, and those the hypervisor gave other
    machines while this one had work (steal)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq) / _TICK, steal / _TICK


def stages(cluster: Cluster, start, settings: WorkerSettings, end: int) -> dict[str, float]:
    """Seconds of each of capture's stages alone, over the WAL up to ``end``: reading
    pgoutput (psycopg2's replication stream, as the worker reads it); turning it into
    encoded protocol events (the assembler, from memory); producing those events
    (the worker's producer settings, acks=all, to a topic of their own, flushed)."""
    import psycopg2
    import psycopg2.extras
    from confluent_kafka import Producer

    from gpcdc_toolkit.capture._worker import ensure_topics, producer_config

    segment = cluster.segments[0]
    conn = psycopg2.connect(cluster.dsn(segment), connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    payloads = []
    t0 = time.perf_counter()
    cur.start_replication(slot_name="stages", decode=False,
                          options={**cluster.decoding_options(), "publication_names": start.publication})
    while True:
        message = cur.read_message()
        if message is None:
            if cur.wal_end >= end and payloads and payloads[-1][0] in (0x43, 0x4B):  # a COMMIT (or COMMIT PREPARED) at the end
                break
            select.select([conn], [], [], 0.1)
            continue
        payloads.append(message.payload)
    read_s = time.perf_counter() - t0
    conn.close()

    assembler = cluster.translator(segment, source_name=settings.prefix, database="postgres", start=start,
                                   max_buffered=settings.capture.max_buffered)
    t0 = time.perf_counter()
    for payload in payloads:
        assembler.feed(payload)  # let go of at once, as the worker does once produced
    decode_s = time.perf_counter() - t0
    assembler = cluster.translator(segment, source_name=settings.prefix, database="postgres", start=start,
                                   max_buffered=settings.capture.max_buffered)
    gc.disable()  # half a million events held at once: not what the worker holds, and not timed
    events = [out for payload in payloads for out in assembler.feed(payload)]
    gc.enable()

    topics = Topics("stages")
    ensure_topics(settings.kafka, topics, cluster.segment_count)
    producer = Producer(producer_config(settings))
    t0 = time.perf_counter()
    for out in events:
        while True:
            try:
                producer.produce(topics.changes, out.value, out.key, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush()
    produce_s = time.perf_counter() - t0
    kinds = collections.Counter(out.kind for out in events)
    print(f"  (the stages' stream: {len(payloads):,} pgoutput messages, {dict(kinds)} events, "
          f"{sum(len(out.value) for out in events) / max(1, len(events)):.0f} bytes an event on average)", flush=True)
    return {"read pgoutput (psycopg2)": read_s, "decode and encode (assembler)": decode_s,
            "produce to Kafka, acks=all, flushed": produce_s}


def latency(cluster: Cluster, config, rate: float, seconds: float) -> float:
    bootstrap(cluster, Pipeline(config.work_dir, config.kafka.topic_prefix), "snapshot")
    group = CaptureGroup(config)
    group.start()
    try:
        result = run_workload(cluster, WorkloadSpec(threads=4, duration=seconds, rate=rate, hot_keys=10))
        wait_until_acknowledged(cluster, group.pipeline.slot)
    finally:
        group.stop()
    from gpcdc_toolkit.connect import kafka_client_settings

    kafka = kafka_client_settings(config)
    delays = []
    import orjson

    from gpcdc_toolkit.ingest import read_to_end

    for message in read_to_end(kafka, Topics(config.kafka.topic_prefix).changes):
        value = orjson.loads(message.value())
        if kind_of(value) == "end":
            delays.append(message.timestamp()[1] - value["commit_ts_ms"])
    delays.sort()
    print(f"latency (workload {result.rate:.0f} dtx/s for {seconds:g} s, {len(delays)} local transactions):")
    p99 = delays[int(len(delays) * 0.99)]
    print(f"  commit -> produced to Kafka : p50 {statistics.median(delays):.0f} ms, "
          f"p99 {p99:.0f} ms, max {delays[-1]:.0f} ms", flush=True)
    return p99


def memory(cluster: Cluster, config, large_mb: int) -> None:
    group = CaptureGroup(config)
    group.start()
    try:
        rows = large_mb * 1000  # 1000-byte payloads
        t0 = time.perf_counter()
        with Session(cluster) as session, session.transaction() as tx:
            for first in range(0, rows, 100_000):
                tx.execute(0, "INSERT INTO bench_rows SELECT g, repeat('y', 1000) FROM generate_series(%s::bigint, %s::bigint) g",
                           (10**12 + first, 10**12 + min(rows, first + 100_000) - 1))
        end = flush_lsn(cluster, 0)
        while confirmed(cluster, 0, group.pipeline.slot) < end:
            time.sleep(0.1)  # polling the slot's acknowledged position
        elapsed = time.perf_counter() - t0
        with open(f"/proc/{group.pid(0)}/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    finally:
        group.stop()
    print(f"memory: one transaction of {rows:,} rows ({large_mb} MB of values) captured in {elapsed:.0f} s;"
          f" worker peak RSS {peak:.0f} MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=200.0, help="workload dtx/s for the latency run")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--latency-runs", type=int, default=1, help="latency runs, one after another")
    parser.add_argument("--large-mb", type=int, default=1024)
    parser.add_argument("--config", help="a configuration file, for its [kafka.client] table (compression, say)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    work.chmod(0o755)
    sandbox = Sandbox("bench", work)
    broker = EmbeddedBroker(work)
    try:
        sandbox.up(segments=1)
        broker.up()
        cluster = sandbox.cluster()
        with Session(cluster) as session:
            session.ddl("CREATE TABLE bench_rows (id bigint PRIMARY KEY, v text) DISTRIBUTED BY (id)")
        flags = {"work_dir": str(work), "kafka.bootstrap_servers": broker.bootstrap_servers, "source.sandbox": "bench"}
        throughput(cluster, load_config({**flags, "kafka.topic_prefix": "tput"}, config_file=args.config, environ={}), args.rows,
                   broker.pid)
        p99s = [latency(cluster, load_config({**flags, "kafka.topic_prefix": f"lat{run}"}, config_file=args.config,
                                             environ={}), args.rate, args.seconds)
                for run in range(args.latency_runs)]
        if len(p99s) > 1:
            print(f"latency p99 run after run: {', '.join(f'{p:.0f}' for p in p99s)} ms; "
                  f"{sum(p > 10 for p in p99s)} of {len(p99s)} runs above 10 ms", flush=True)
        if args.large_mb:
            memory(cluster, load_config({**flags, "kafka.topic_prefix": "tput"}, config_file=args.config, environ={}), args.large_mb)
    finally:
        for prefix in ("tput", *(f"lat{run}" for run in range(args.latency_runs))):
            CaptureGroup(load_config({"work_dir": str(work), "kafka.topic_prefix": prefix}, environ={})).stop()
        broker.down()
        sandbox.down(remove=True)
        if not os.environ.get("GPCDC_BENCH_KEEP"):
            shutil.rmtree(work)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
