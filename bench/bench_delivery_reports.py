"""What a delivery report per event would cost capture's producer, against none for rows.

A capture worker asks Kafka for a delivery report only for the events that close
something (``capture/_confirmations.py``); its rows go without. This produces the same
messages (400-byte values, one partition, the worker's delivery settings) to the
embedded broker three ways, alternately, and prints µs a message (wall and CPU, the
client's threads included) and each way's ratio to the first:

1. no report asked for (the rows of a capture worker now);
2. a callback for failures only (``delivery.report.only.error``: the worker before);
3. a Python callback for every message (what proving each row by its own report costs).

    .venv/bin/python bench/bench_delivery_reports.py [--messages 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.broker import EmbeddedBroker
from gpcdc_toolkit.capture import WorkerSettings, ensure_topics, producer_config
from gpcdc_toolkit.config import CaptureSettings
from gpcdc_toolkit.protocol import Topics

WAYS = ("no report", "failures only", "a callback each")


def produce(bootstrap: str, topic: str, way: str, messages: int) -> tuple[float, float]:
    settings = WorkerSettings(prefix="bench", kafka={"bootstrap.servers": bootstrap}, capture=CaptureSettings())
    config = producer_config(settings)
    counted = [0]

    def report(err: Any, msg: Any) -> None:
        counted[0] += 1

    if way == "failures only":
        config.update({"delivery.report.only.error": True, "on_delivery": report})
    producer = Producer(config)
    per_message = {"on_delivery": report} if way == "a callback each" else {}
    value = b"x" * 400
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(messages):
        while True:
            try:
                producer.produce(topic, value, b"%d" % i, partition=0, **per_message)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if way == "a callback each":
        assert counted[0] == messages, (counted[0], messages)
    return wall / messages * 1e6, cpu / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    broker = EmbeddedBroker(work)
    try:
        broker.up()
        kafka = {"bootstrap.servers": broker.bootstrap_servers}
        results: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
        for round_ in range(args.rounds):
            for way in WAYS:
                topics = Topics(f"reports{round_}{WAYS.index(way)}")
                ensure_topics(kafka, topics, 1)
                results[way].append(produce(broker.bootstrap_servers, topics.changes, way, args.messages))
        base_wall = min(w for w, _ in results[WAYS[0]])
        base_cpu = min(c for _, c in results[WAYS[0]])
        print(f"{args.messages:,} messages of 400 bytes, {args.rounds} rounds, ways alternated; best of each:")
        for way in WAYS:
            wall, cpu = min(w for w, _ in results[way]), min(c for _, c in results[way])
            runs = ", ".join(f"{w:.2f}" for w, _ in results[way])
            print(f"  {way:17}: {wall:.2f} µs wall ({runs}), {cpu:.2f} µs CPU; "
                  f"x{wall / base_wall:.2f} wall, x{cpu / base_cpu:.2f} CPU of '{WAYS[0]}'", flush=True)
    finally:
        broker.down()
        shutil.rmtree(work)


if __name__ == "__main__":
    interrupt_on_sigterm()
    main()
