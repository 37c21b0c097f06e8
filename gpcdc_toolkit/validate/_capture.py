"""What capture put in Kafka, read whole, and checked against a workload's ground-truth log."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from ..connect import kafka_client_settings
from ..ingest import read_values
from ..protocol import COORDINATOR, Topics, kind_of


@dataclass
class Captured:
    """A pipeline's topics, read to their end, duplicates removed."""

    rows: list[dict[str, Any]] = field(default_factory=list)  # in partition order
    ends: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)  # (segment, commit_lsn) -> END
    parts: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # gxid -> segments
    records: dict[int, tuple[int, ...] | None] = field(default_factory=dict)  # gxid -> its commit record's segments
    ddl: list[dict[str, Any]] = field(default_factory=list)
    watermarks: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    duplicates: int = 0


def read_captured(config: Config) -> Captured:
    kafka = kafka_client_settings(config)
    topics = Topics(config.kafka.topic_prefix)
    out = Captured()
    seen: set[tuple[Any, ...]] = set()
    for _partition, _offset, v in read_values(kafka, topics.changes):
        kind = kind_of(v)
        if kind == "row":
            identity: tuple[Any, ...] = (v["source"]["segment"], v["source"]["commit_lsn"], v["source"]["seq"])
        elif kind in ("begin", "end"):
            identity = (v["segment"], v["commit_lsn"], v["status"])
        elif kind == "resolved":
            out.watermarks[v["segment"]].append(v)
            continue
        else:
            continue  # the pipeline marker
        if identity in seen:
            out.duplicates += 1
            continue
        seen.add(identity)
        if kind == "row":
            out.rows.append(v)
        elif kind == "end":
            out.ends[(v["segment"], v["commit_lsn"])] = v
            if v["gxid"] is not None:
                out.parts[v["gxid"]].add(v["segment"])
    for _partition, _offset, v in read_values(kafka, topics.dtx):
        kind = kind_of(v)
        if kind == "commit":
            out.records[v["gxid"]] = tuple(v["segments"]) if v["segments"] is not None else None
        elif kind == "ddl":
            out.ddl.append(v)
        elif kind == "resolved":
            out.watermarks[COORDINATOR].append(v)
    return out


@dataclass
class CaptureCheck:
    after: int = 0  # committed after the start point: must be captured whole
    before: int = 0  # committed before it: must not be captured
    in_doubt: int = 0  # the log cannot tell whether they committed: whole, or absent
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_against_truth(captured: Captured, truth: Iterable[Mapping[str, Any]],
                        before_start: Callable[[int], bool]) -> CaptureCheck:
    """Every committed gxid after the start has a part on each segment it touched and,
    when two-phase, a commit record naming them; nothing of earlier or uncommitted gxids
    is captured; a gxid in doubt is captured so, or not at all. ``before_start(gxid)``: whether the start point's snapshot sees it."""
    check = CaptureCheck()
    for r in truth:
        gxid = r["gxid"]
        captured_parts = sorted(captured.parts.get(gxid, ()))
        if r["outcome"] == "in_doubt":
            # Committed or not, only the servers know: captured whole, or not at all.
            check.in_doubt += 1
            if captured_parts or gxid in captured.records:
                r = {**r, "outcome": "committed"}
            else:
                continue
        if r["outcome"] != "committed" or before_start(gxid):
            if r["outcome"] == "committed":
                check.before += 1
            if captured_parts or gxid in captured.records:
                why = "is before the start point" if r["outcome"] == "committed" else f"was {r['outcome']}"
                check.problems.append(f"gxid {gxid} {why} but was captured on segments {captured_parts}")
            continue
        check.after += 1
        if captured_parts != sorted(r["segments"]):
            check.problems.append(f"gxid {gxid} touched segments {r['segments']}, captured on {captured_parts}")
        if not r["one_phase"] and captured.records.get(gxid) != tuple(r["segments"]):
            check.problems.append(f"gxid {gxid}: commit record {captured.records.get(gxid)}, expected {r['segments']}")
        if r["one_phase"] and gxid in captured.records:
            check.problems.append(f"gxid {gxid} is one-phase but has a commit record")
    return check
