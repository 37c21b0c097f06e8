"""What an audit reports (one schema for every rule, the severities) and the
thresholds its rules judge by (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SEVERITIES = ("error", "warning", "info")  # most severe first

# (name, Spark SQL type), the columns of every findings DataFrame.
FINDING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rule", "string"),
    ("severity", "string"),  # error, warning or info
    ("gxid", "bigint"),  # the distributed transaction, when one is concerned
    ("segments", "array<int>"),  # the nodes concerned (-1: the coordinator)
    ("table", "string"),  # schema.table, when one is concerned
    ("evidence", "string"),  # what was seen, with the numbers
    ("topic", "string"),
    ("partition", "int"),
    ("offsets", "array<bigint>"),  # of the messages that show it, in that partition
    ("commit_ts", "timestamp"),  # source commit time of what is concerned
    ("first_seen", "timestamp"),  # Kafka time of the first message that shows it
)


@dataclass(frozen=True)
class Thresholds:
    clock_skew_ms: int = 1000  # how far one node's clock may be off another's
    silence_ms: int = 30_000  # a node with no watermark for longer is silent


FINDINGS_DDL = ", ".join(f"`{name}` {kind}" for name, kind in FINDING_COLUMNS)


def severity_rank(severity: str) -> int:
    """0 for error, 1 for warning, 2 for info."""
    if severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity!r}: use one of {', '.join(SEVERITIES)}")
    return SEVERITIES.index(severity)


def at_or_above(severity: str, threshold: str) -> bool:
    return severity_rank(severity) <= severity_rank(threshold)


def summarize(counts: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, int]]:
    """(rule, severity, count) rows from per-rule counts, most severe first, then by rule."""
    rows = [(str(c["rule"]), str(c["severity"]), int(c["count"])) for c in counts]
    return sorted(rows, key=lambda r: (severity_rank(r[1]), r[0]))


def summary_table(rows: list[tuple[str, str, int]]) -> str:
    """The summary as a plain-text table, for the terminal."""
    if not rows:
        return "no findings"
    width = max(len("rule"), *(len(r[0]) for r in rows))
    lines = [f"{'rule':<{width}}  {'severity':<8}  {'count':>9}"]
    lines += [f"{rule:<{width}}  {severity:<8}  {count:>9}" for rule, severity, count in rows]
    return "\n".join(lines)
