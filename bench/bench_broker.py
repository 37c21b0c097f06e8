"""Start-up time of the embedded broker (Apache Kafka, KRaft, one node).

In the same run: a bare JVM (``java -version``) as the baseline, then the broker's
first start (storage formatted) and restarts over its data, each timed until it
answers a metadata request; and a SIGKILL followed by a start, as after a crash.

    .venv/bin/python bench/bench_broker.py [--restarts 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from gpcdc_toolkit._runtime import interrupt_on_sigterm
from gpcdc_toolkit.broker import EmbeddedBroker, kafka_classpath


def timed_up(broker: EmbeddedBroker) -> float:
    t0 = time.perf_counter()
    broker.up()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=3)
    args = parser.parse_args()
    kafka_classpath()  # resolved before timing anything
    jvm = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(["java", "-version"], capture_output=True, check=True)
        jvm.append(time.perf_counter() - t0)
    baseline = statistics.median(jvm)
    work = Path(tempfile.mkdtemp(prefix="gpcdc-bench-"))
    broker = EmbeddedBroker(work)
    try:
        first = timed_up(broker)
        restarts = []
        for _ in range(args.restarts):
            broker.down()
            restarts.append(timed_up(broker))
        broker.kill()
        after_crash = timed_up(broker)
    finally:
        broker.remove()
        shutil.rmtree(work)
    restart = statistics.median(restarts)
    print(f"bare JVM (java -version)     : {baseline:6.2f} s")
    print(f"first start (format + start) : {first:6.2f} s  ratio {first / baseline:5.1f}")
    print(f"restart over its data        : {restart:6.2f} s  ratio {restart / baseline:5.1f} (median of {len(restarts)})")
    print(f"start after SIGKILL          : {after_crash:6.2f} s  ratio {after_crash / baseline:5.1f}")


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
