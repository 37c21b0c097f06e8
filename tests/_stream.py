"""Read what capture put in Kafka and check it against the source and the ground truth."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gpcdc_toolkit.config import Config
from gpcdc_toolkit.connect import kafka_client_settings
from gpcdc_toolkit.ingest import read_values
from gpcdc_toolkit.protocol import Topics


@dataclass
class Captured:
    rows: list[dict[str, Any]] = field(default_factory=list)  # deduplicated, in partition order
    ends: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)  # (segment, commit_lsn) -> END
    parts: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # gxid -> segments
    records: dict[int, tuple[int, ...] | None] = field(default_factory=dict)  # gxid -> segments of its commit record
    ddl: list[dict[str, Any]] = field(default_factory=list)
    watermarks: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    duplicates: int = 0


def read_captured(config: Config) -> Captured:
    kafka = kafka_client_settings(config)
    topics = Topics(config.kafka.topic_prefix)
    out = Captured()
    seen: set[tuple[Any, ...]] = set()
    for _partition, _offset, v in read_values(kafka, topics.changes):
        if "op" in v:
            identity = (v["source"]["segment"], v["source"]["commit_lsn"], v["source"]["seq"])
        elif "status" in v:
            identity = (v["segment"], v["commit_lsn"], v["status"])
        else:
            out.watermarks[v["segment"]].append(v)
            continue
        if identity in seen:
            out.duplicates += 1
            continue
        seen.add(identity)
        if "op" in v:
            out.rows.append(v)
        elif v["status"] == "END":
            out.ends[(v["segment"], v["commit_lsn"])] = v
            if v["gxid"] is not None:
                out.parts[v["gxid"]].add(v["segment"])
    for _partition, _offset, v in read_values(kafka, topics.dtx):
        if v.get("type") == "commit":
            out.records[v["gxid"]] = tuple(v["segments"]) if v["segments"] is not None else None
        elif v.get("type") == "ddl":
            out.ddl.append(v)
        else:
            out.watermarks[-1].append(v)
    return out


def check_against_truth(captured: Captured, truth: list[dict[str, Any]], sees) -> tuple[int, int]:
    """Every committed gxid after the start has a part on each of its segments and, if
    two-phase, a commit record naming them; none before the start appears. Returns
    (gxids after, gxids before)."""
    after = before = 0
    for r in truth:
        gxid = r["gxid"]
        if r["outcome"] != "committed":
            assert gxid not in captured.parts and gxid not in captured.records, f"uncommitted gxid {gxid} captured"
            continue
        if sees(gxid):
            before += 1
            assert gxid not in captured.parts and gxid not in captured.records, f"gxid {gxid} is before the start"
            continue
        after += 1
        assert captured.parts.get(gxid) == set(r["segments"]), (
            f"gxid {gxid} touched segments {r['segments']}, captured on {sorted(captured.parts.get(gxid, ()))}")
        if r["one_phase"]:
            assert gxid not in captured.records
        else:
            assert captured.records.get(gxid) == tuple(r["segments"])
    return after, before


def apply_rows(state: dict[tuple[Any, ...], dict[str, Any]], rows: list[dict[str, Any]], key: list[str]) -> None:
    """Fold row events into a keyed table, in order."""
    for v in rows:
        if v["op"] in ("c", "u", "r"):
            if v["op"] == "u" and v["before"] is not None:
                state.pop(tuple(v["before"][k] for k in key), None)
            state[tuple(v["after"][k] for k in key)] = v["after"]
        elif v["op"] == "d":
            state.pop(tuple(v["before"][k] for k in key), None)
