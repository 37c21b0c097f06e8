"""py4j round trips made while building the audit's rules in a local Spark session.

In a local session every PySpark call that reaches the JVM is a round trip over py4j;
building the sixteen rules' DataFrames (not running them) makes thousands, which every
audit pays before its first job. On the Spark server (Spark Connect) the client builds
the plan itself and makes none. This counts them on the warm-up stream (``audit/_warm.py``),
with Python's collector off so that releases of JVM handles do not mix in: in all, per
rule, and within the helpers ``finding`` and ``_text``. A count, not a time: it is the
same from run to run.

    .venv/bin/python bench/bench_audit_calls.py
"""

from __future__ import annotations

import collections
import functools
import gc
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from py4j import clientserver  # noqa: E402

from gpcdc_toolkit._runtime import interrupt_on_sigterm  # noqa: E402
from gpcdc_toolkit.audit import Thresholds, events_frame  # noqa: E402
from gpcdc_toolkit.audit import _rules as rules  # noqa: E402
from gpcdc_toolkit.audit._warm import warm_stream  # noqa: E402
from gpcdc_toolkit.config import load_config  # noqa: E402
from gpcdc_toolkit.ingest.spark import spark_session  # noqa: E402

calls: collections.Counter[str] = collections.Counter()
where = ["other"]


def counted(send: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(send)
    def send_command(self: Any, command: str, *args: Any, **kwargs: Any) -> Any:
        calls[where[0]] += 1
        return send(self, command, *args, **kwargs)
    return send_command


def within(tag: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def tagged(*args: Any, **kwargs: Any) -> Any:
        outer, where[0] = where[0], tag
        try:
            return function(*args, **kwargs)
        finally:
            where[0] = outer
    return tagged


def main() -> None:
    with tempfile.TemporaryDirectory() as work_dir:
        spark = spark_session(load_config({"work_dir": work_dir, "spark.master": "local[2]"}, environ={}))
        send = clientserver.ClientServerConnection.send_command
        try:
            stream = rules.prepare(events_frame(spark, warm_stream()))
            rules.finding = within("finding", rules.finding)  # the rules call them through the module
            rules._text = within("_text", rules._text)
            per_rule = {}
            gc.disable()
            clientserver.ClientServerConnection.send_command = counted(send)
            for rule in rules.RULES:
                before = sum(calls.values())
                where[0] = "the rules' own operations"
                rule(stream, Thresholds())
                per_rule[rule.__name__] = sum(calls.values()) - before
        finally:
            clientserver.ClientServerConnection.send_command = send
            gc.enable()
            spark.stop()
    print(f"py4j round trips building the {len(rules.RULES)} rules: {sum(per_rule.values()):,}")
    for tag, count in calls.most_common():
        print(f"  {tag:28s} {count:6,}")
    print("per rule:")
    for name, count in sorted(per_rule.items(), key=lambda item: -item[1]):
        print(f"  {name:28s} {count:6,}")


if __name__ == "__main__":
    interrupt_on_sigterm()  # `timeout` or `kill` ends it as Ctrl-C does: what it started is stopped
    main()
