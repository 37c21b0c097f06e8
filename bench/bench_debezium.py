"""Capture side by side with Debezium's PostgreSQL connector, in the same run, on the
same segment's WAL and into the same broker.

Debezium 3.6 (``debezium-connector-postgres``) runs in Kafka Connect standalone from
the broker's own Kafka release (``connect-runtime``), resolved from Maven Central;
pgoutput, its own slot and publication, JSON without schemas, transaction metadata
on, the sandbox's logical messages (its transaction markers) skipped; its defaults, or
with --tuned the settings of TUNED, for throughput and latency. The toolkit's capture
worker reads its own slot, made at the same point.

1. Throughput: --rows rows are written on one segment (1000 per transaction) while
   neither reads; then both read them, at once. Each one's rate is its row events over
   the span of their Kafka timestamps (first to last), so that neither's start-up
   counts.
2. Latency: a workload at --rate transactions/s for --seconds with both following;
   per row event, commit time (the event's ``source.ts_ms``) to its Kafka timestamp;
   p50 and p99 of each.
3. The envelope, field by field: the same insert, update and delete as each emits it.

    .venv/bin/python bench/bench_debezium.py [--rows 300000] [--rate 150] [--seconds 10] [--tuned]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from gpcdc_toolkit._maven import resolve
from gpcdc_toolkit._runtime import free_port, interrupt_on_sigterm, stop_pid
from gpcdc_toolkit.bootstrap import Pipeline, bootstrap
from gpcdc_toolkit.broker import KAFKA_VERSION, EmbeddedBroker
from gpcdc_toolkit.capture import CaptureWorker, WorkerSettings, tune_for_capture
from gpcdc_toolkit.cluster import Cluster, Session
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.ingest import end_offsets, read_to_end
from gpcdc_toolkit.protocol import Topics
from gpcdc_toolkit.sandbox import Sandbox

DEBEZIUM = "3.6.1.Final"
TABLE = "bench_rows"


def debezium_jars() -> list[Path]:
    return resolve(f"debezium-{DEBEZIUM}-connect-{KAFKA_VERSION}", [
        f"org.apache.kafka:connect-runtime:{KAFKA_VERSION}", f"org.apache.kafka:connect-json:{KAFKA_VERSION}",
        f"io.debezium:debezium-connector-postgres:{DEBEZIUM}",
        # Its log, as the broker's: log4j2 behind slf4j.
        "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3", "org.apache.logging.log4j:log4j-core:2.24.3"])


# Debezium's settings for throughput and latency (its defaults wait up to 500 ms between
# polls and batch 2,048 events), and its producer batching as capture's (linger 5 ms).
TUNED = ["poll.interval.ms=5", "max.batch.size=10000", "max.queue.size=40000", "producer.override.linger.ms=5",
         "producer.override.batch.size=1048576"]


def start_connect(work: Path, cluster: Cluster, bootstrap_servers: str, tuned: bool) -> subprocess.Popen[bytes]:
    """Kafka Connect standalone running Debezium on segment 0."""
    segment = cluster.segments[0]
    worker = work / "connect-worker.properties"
    worker.write_text("\n".join([
        f"bootstrap.servers={bootstrap_servers}",
        "key.converter=org.apache.kafka.connect.json.JsonConverter",
        "value.converter=org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable=false", "value.converter.schemas.enable=false",
        f"offset.storage.file.filename={work / 'connect.offsets'}", "offset.flush.interval.ms=500",
        f"listeners=http://127.0.0.1:{free_port()}", "connector.client.config.override.policy=All", ""]))
    connector = work / "debezium.properties"
    connector.write_text("\n".join([
        "name=dbz", "connector.class=io.debezium.connector.postgresql.PostgresConnector", "tasks.max=1",
        f"database.hostname={segment.host}", f"database.port={segment.port}", "database.user=gpcdc",
        "database.password=unused", "database.dbname=postgres", "topic.prefix=dbz", "plugin.name=pgoutput",
        "slot.name=dbz", "publication.name=dbz_pub", "publication.autocreate.mode=disabled",
        f"table.include.list=public.{TABLE}", "snapshot.mode=no_data", "provide.transaction.metadata=true",
        "tombstones.on.delete=false",
        # The sandbox marks every transaction with logical messages (its gxid markers): not rows.
        "message.prefix.exclude.list=.*", *(TUNED if tuned else []), ""]))
    (work / "connect-log4j2.properties").write_text(
        "rootLogger.level = info\nrootLogger.appenderRef.console.ref = console\nappender.console.type = Console\n"
        "appender.console.name = console\nappender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d %p %c{1}: %m%n\n")
    classpath = ":".join(str(jar) for jar in debezium_jars())
    log = (work / "connect.log").open("ab")
    return subprocess.Popen(["java", "-Xmx512m", f"-Dlog4j2.configurationFile={work / 'connect-log4j2.properties'}",
                             "-cp", classpath, "org.apache.kafka.connect.cli.ConnectStandalone", str(worker),
                             str(connector)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def start_capture(cluster: Cluster, config: Any, start: Any) -> tuple[threading.Event, threading.Thread]:
    settings = WorkerSettings(prefix=config.kafka.topic_prefix, kafka=kafka_client_settings(config))
    worker = CaptureWorker(cluster, cluster.segments[0], start, settings, database="postgres",
                           partitions=cluster.segment_count)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    return stop, thread


def rows_in(kafka: dict[str, str], topic: str, partitions: list[int] | None = None) -> int:
    return sum(end_offsets(kafka, topic, partitions).values())


def row_events(kafka: dict[str, str], topic: str, ours: bool) -> list[tuple[int, dict[str, Any]]]:
    """(Kafka timestamp, event) of every row event of the topic."""
    out = []
    for message in read_to_end(kafka, topic):
        value = orjson.loads(message.value()) if message.value() else None
        if isinstance(value, dict) and value.get("op") in ("c", "u", "d") and (not ours or "source" in value):
            out.append((message.timestamp()[1], value))
    return out


def rate(events: list[tuple[int, dict[str, Any]]]) -> float:
    stamps = sorted(ts for ts, _ in events)
    return len(stamps) / max(1e-3, (stamps[-1] - stamps[0]) / 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rate", type=float, default=150.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tuned", action="store_true", help="Debezium with the settings of TUNED, not its defaults")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    work.chmod(0o755)
    sandbox, broker = Sandbox("dbz", work), EmbeddedBroker(work)
    connect, capture = None, None
    try:
        sandbox.up(segments=1)
        broker.up()
        cluster = sandbox.cluster()
        with Session(cluster) as session:
            session.ddl(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, v text) DISTRIBUTED BY (id)")
        config = load_config({"work_dir": str(work), "kafka.bootstrap_servers": broker.bootstrap_servers,
                              "kafka.topic_prefix": "ours", "source.sandbox": "dbz"}, environ={})
        kafka = kafka_client_settings(config)
        start = bootstrap(cluster, Pipeline(config.work_dir, config.kafka.topic_prefix), "snapshot")
        with cluster.connect_node(cluster.segments[0]) as conn:
            conn.execute(f"CREATE PUBLICATION dbz_pub FOR TABLE {TABLE}")
            conn.execute("SELECT pg_create_logical_replication_slot('dbz', 'pgoutput')")
        debezium_jars()  # resolved before anything is timed
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        # The broker creates no topic by itself: Debezium's, as capture's, made beforehand.
        admin = AdminClient(kafka)
        for future in admin.create_topics(
                [NewTopic(f"dbz.public.{TABLE}", 1, 1), NewTopic("dbz.transaction", 1, 1)]).values():
            future.result(15)

        # 1. Throughput: the same WAL, waiting for both.
        with Session(cluster) as session:
            for first in range(0, args.rows, 1000):
                with session.transaction() as tx:
                    tx.execute(0, f"INSERT INTO {TABLE} SELECT g, repeat('x', 40) FROM "
                               "generate_series(%s::bigint, %s::bigint) g", (first, min(args.rows, first + 1000) - 1))
        tune_for_capture()  # as a worker's process does: here the worker is a thread of this one
        connect = start_connect(work, cluster, broker.bootstrap_servers, args.tuned)
        capture = start_capture(cluster, config, start)
        theirs_topic, ours_topic = f"dbz.public.{TABLE}", Topics("ours").changes
        running = connect

        def wait_for(condition: Any, what: str, timeout: float = 300.0) -> None:
            deadline = time.monotonic() + timeout
            while not condition():
                if running.poll() is not None:
                    raise RuntimeError(f"Kafka Connect exited ({running.returncode}): see {work / 'connect.log'}")
                if time.monotonic() > deadline:
                    raise TimeoutError(what)
                time.sleep(0.2)  # polling the topics' ends

        wait_for(lambda: rows_in(kafka, theirs_topic) >= args.rows if theirs_topic in _topics(kafka) else False,
                 "Debezium's rows")
        wait_for(lambda: len(row_events(kafka, ours_topic, True)) >= args.rows, "capture's rows")
        ours_rate = rate(row_events(kafka, ours_topic, True)[:args.rows])
        theirs_rate = rate(row_events(kafka, theirs_topic, False)[:args.rows])
        print(f"throughput ({args.rows:,} rows, 1000 per transaction, one segment; rows over the span of their "
              "Kafka timestamps):")
        print(f"  Debezium {DEBEZIUM} (Kafka Connect {KAFKA_VERSION}, {'tuned' if args.tuned else 'defaults'}) : "
              f"{theirs_rate:>10,.0f} rows/s")
        print(f"  gpcdc capture                           : {ours_rate:>10,.0f} rows/s")
        print(f"  ratio, ours / theirs                    : {ours_rate / theirs_rate:>10.2f}", flush=True)

        # 2. Latency: both following a steady stream of small transactions.
        with Session(cluster) as session:
            session.ddl(f"TRUNCATE {TABLE}")
        before = {"ours": len(row_events(kafka, ours_topic, True)), "theirs": rows_in(kafka, theirs_topic)}
        deadline = time.monotonic() + args.seconds
        n = 0
        with Session(cluster) as session:
            while time.monotonic() < deadline:
                with session.transaction() as tx:
                    tx.execute(0, f"INSERT INTO {TABLE} VALUES (%s, 'y')", (10**9 + n,))
                n += 1
                time.sleep(max(0.0, n / args.rate - (args.seconds - (deadline - time.monotonic()))))
        wait_for(lambda: rows_in(kafka, theirs_topic) >= before["theirs"] + n, "Debezium's latency rows")
        wait_for(lambda: len(row_events(kafka, ours_topic, True)) >= before["ours"] + n, "capture's latency rows")
        print(f"latency ({n} transactions of one row at {n / args.seconds:.0f}/s; commit to Kafka timestamp):")
        for name, topic, ours, skip in (("Debezium", theirs_topic, False, before["theirs"]),
                                        ("gpcdc capture", ours_topic, True, before["ours"])):
            delays = sorted(ts - event["source"]["ts_ms"] for ts, event in row_events(kafka, topic, ours)[skip:])
            print(f"  {name:<14}: p50 {statistics.median(delays):.0f} ms, p99 {delays[int(len(delays) * 0.99)]:.0f} ms,"
                  f" max {delays[-1]:.0f} ms", flush=True)

        # 3. The envelope of the same changes.
        with Session(cluster) as session:
            with session.transaction() as tx:
                tx.execute(0, f"INSERT INTO {TABLE} VALUES (-1, 'first')")
            with session.transaction() as tx:
                tx.execute(0, f"UPDATE {TABLE} SET v = 'second' WHERE id = -1")
            with session.transaction() as tx:
                tx.execute(0, f"DELETE FROM {TABLE} WHERE id = -1")

        def envelopes(topic: str, ours: bool) -> list[dict[str, Any]]:
            return [e for _, e in row_events(kafka, topic, ours)
                    if (e.get("after") or e.get("before") or {}).get("id") == -1]

        wait_for(lambda: len(envelopes(theirs_topic, False)) >= 3 and len(envelopes(ours_topic, True)) >= 3,
                 "the envelope's three changes")
        print("the envelope, field by field (insert, update, delete of id -1):")
        for theirs, ours in zip(envelopes(theirs_topic, False), envelopes(ours_topic, True)):
            print(f"  op {theirs['op']}:")
            for field in sorted(set(theirs) | set(ours)):
                a, b = theirs.get(field, "(absent)"), ours.get(field, "(absent)")
                if isinstance(a, dict) and isinstance(b, dict):
                    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
                    same = sorted(k for k in set(a) & set(b) if a[k] == b[k])
                    differ = {k: (a[k], b[k]) for k in sorted(set(a) & set(b)) if a[k] != b[k]}
                    print(f"    {field}: same values {same}; differ {differ}; only Debezium {only_a}; only gpcdc {only_b}")
                else:
                    print(f"    {field}: Debezium {json.dumps(a)[:80]} | gpcdc {json.dumps(b)[:80]}")
    finally:
        if capture is not None:
            capture[0].set()
            capture[1].join()
        if connect is not None:
            stop_pid(connect.pid)
        broker.down()
        sandbox.down(remove=True)
        if not os.environ.get("GPCDC_BENCH_KEEP"):
            shutil.rmtree(work)


def _topics(kafka: dict[str, str]) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient(kafka).list_topics(timeout=10).topics)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
