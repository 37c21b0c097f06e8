"""Reading the changes topic into a Spark DataFrame, against a plain consumer.

N row events (Debezium envelopes as capture writes them, about 420 bytes each) are
produced into a 3-partition topic of the embedded broker. Then, in the same run:

* baseline: one confluent-kafka consumer drains the topic (``consume(10000)``, no
  parsing);
* Spark (``local[2]``), the toolkit's Python source: ``read_changes(source="gpcdc")``
  reads with confluent-kafka on the executors and parses every message into the typed
  schema, filtered on ``kind = 'row'`` and counted;
* Spark, its own Kafka source in the JVM: ``read_changes(source="kafka")``, the same
  parsing applied to its ``value`` column (``mapInArrow``), filtered and counted.

Each source is read twice in a row over the same events: the first read pays what a
session does once per source (the JVM compiling the plan's code, Python workers
started and importing the parser), the second is what each later read costs, as on a
Spark server that has read before. Printed: rows/s of each read and their ratios to
the baseline.

    .venv/bin/python bench/bench_ingest.py [--events 1000000,5000000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.config import load_config
from gpcdc_toolkit.ingest import end_offsets
from gpcdc_toolkit.ingest.spark import read_changes, spark_session
from gpcdc_toolkit.protocol import Topics


def row_event(i: int) -> bytes:
    """The i-th row event, on segment i % 3: a Debezium envelope of about 420 bytes."""
    segment = i % 3
    return orjson.dumps({
        "before": None, "after": {"id": i, "balance": i * 7, "note": f"n{i}"},
        "source": {"version": 1, "connector": "gpcdc", "name": "bench", "db": "postgres", "schema": "public",
                   "table": "wl_accounts", "segment": segment, "txId": i // 10, "commit_lsn": 10**8 + i,
                   "ts_ms": 1_795_000_000_000 + i, "gxid": i // 10, "seq": i % 10 + 1, "one_phase": False},
        "op": "c", "ts_ms": 1_795_000_000_000 + i,
        "transaction": {"id": f"{segment}:{i // 10}", "total_order": i % 10 + 1, "data_collection_order": 1}})


def produce(servers: str, topic: str, events: int) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 20, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 500000})
    for i in range(events):
        segment = i % 3
        while True:
            try:
                producer.produce(topic, row_event(i), b'{"id":%d}' % i, partition=segment)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)


def drain(servers: str, topic: str, ends: dict[int, int]) -> int:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "bench", "enable.auto.commit": False,
                         "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    remaining = dict(ends)
    count = 0
    while remaining:
        for m in consumer.consume(10000, timeout=1.0):
            if m.error() is None:
                count += 1
                if m.offset() + 1 >= remaining.get(m.partition(), -1):
                    remaining.pop(m.partition(), None)
    consumer.close()
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", default="1000000")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    broker = EmbeddedBroker(work)
    try:
        broker.up()
        servers = broker.bootstrap_servers
        spark = spark_session(load_config({"work_dir": str(work), "spark.master": "local[2]"}, environ={}))
        spark.sparkContext.setLogLevel("ERROR")
        for n in (int(e) for e in args.events.split(",")):
            config = load_config({"work_dir": str(work), "kafka.bootstrap_servers": servers,
                                  "kafka.topic_prefix": f"bench{n}"}, environ={})
            topic = Topics(config.kafka.topic_prefix).changes
            produce(servers, topic, n)
            ends = end_offsets({"bootstrap.servers": servers}, topic)
            t0 = time.perf_counter()
            drained = drain(servers, topic, ends)
            plain_s = time.perf_counter() - t0
            line = f"{n:>9,} events: plain consumer {n / plain_s:>9,.0f} msg/s"
            for source in ("gpcdc", "kafka"):
                for read in ("first", "again"):
                    t0 = time.perf_counter()
                    rows = read_changes(spark, config, ending_offsets=ends, source=source).where("kind = 'row'").count()
                    spark_s = time.perf_counter() - t0
                    assert drained == rows == n, (source, drained, rows, n)
                    line += f"; Spark {source} source, {read}: {n / spark_s:>9,.0f} rows/s (ratio {plain_s / spark_s:.2f})"
            print(line, flush=True)
        spark.stop()
    finally:
        broker.remove()
        shutil.rmtree(work)


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
