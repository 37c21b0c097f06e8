"""What Spark's readers spend per message on parsing, compiled row reader against the general path.

N row events (Debezium envelopes as capture writes them, about 420 bytes each:
``bench_ingest.row_event``) are parsed in this process as an executor parses
them: ``to_row`` for each, then ``to_arrow`` for each batch of 10,000, the cyclic
collector held off. Alternately, --rounds times: with the compiled reader
(``ingest/_rowevent.c``) and with every message on the general path in Python. Printed:
the median microseconds per message of each, the share ``to_arrow`` takes of it, and
their ratio.

    .venv/bin/python bench/bench_parse.py [--messages 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench_ingest import row_event  # the same messages as the Spark benchmark reads

from gpcdc_toolkit.ingest import _rows


def messages(n: int) -> list[tuple[Any, ...]]:
    """(topic, partition, offset, timestamp, key, value) of n row events, as a consumer gives them."""
    return [("bench.changes", i % 3, i, 1_795_000_000_000 + i, b'{"id":%d}' % i, row_event(i)) for i in range(n)]


def parse(batch: list[tuple[Any, ...]], schema: Any) -> tuple[float, float]:
    """Seconds in ``to_row`` and in ``to_arrow`` over ``batch``, 10,000 messages at a time."""
    rows_s = arrow_s = 0.0
    with _rows.collector_paused():
        for start in range(0, len(batch), 10_000):
            t0 = time.perf_counter()
            rows = [_rows.to_row(*m) for m in batch[start:start + 10_000]]
            t1 = time.perf_counter()
            _rows.to_arrow(rows, schema)
            rows_s, arrow_s = rows_s + t1 - t0, arrow_s + time.perf_counter() - t1
    return rows_s, arrow_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if _rows._row_event is None:
        raise SystemExit("the compiled row reader is not built: run ./dev setup (it needs a C compiler)")
    batch, schema = messages(args.messages), _rows.arrow_schema()
    compiled = _rows._row_event
    timings: dict[str, list[tuple[float, float]]] = {"compiled": [], "general": []}
    for _ in range(args.rounds):
        for path, reader in (("general", None), ("compiled", compiled)):
            _rows._row_event = reader
            timings[path].append(parse(batch, schema))
    _rows._row_event = compiled
    us = {path: statistics.median(r + a for r, a in t) / args.messages * 1e6 for path, t in timings.items()}
    print(f"{args.messages:,} row events parsed, {args.rounds} rounds (median):")
    for path, t in timings.items():
        arrow = statistics.median(a for _, a in t) / args.messages * 1e6
        print(f"  {path:9}: {us[path]:5.2f} µs a message ({arrow:.2f} of them in to_arrow)")
    print(f"  ratio compiled / general: {us['compiled'] / us['general']:.2f}")


if __name__ == "__main__":
    main()
