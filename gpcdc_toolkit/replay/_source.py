"""Feeding a Reassembler from the pipeline's topics (one pass over what is there)."""

from __future__ import annotations

from typing import Any

from ..config import Config
from ..connect import kafka_client_settings
from ..ingest import read_values
from ..protocol import Topics
from ._order import Part, Reassembler, Record


def feed_from_kafka(reassembler: Reassembler, config: Config) -> None:
    """Every part, record and watermark now in the topics, in partition order."""
    kafka = kafka_client_settings(config)
    topics = Topics(config.kafka.topic_prefix)
    open_rows: dict[tuple[int, int], list[dict[str, Any]]] = {}  # (segment, commit_lsn) -> rows
    for _partition, _offset, v in read_values(kafka, topics.changes):
        if "op" in v:
            s = v["source"]
            open_rows.setdefault((s["segment"], s["commit_lsn"]), []).append(v)
        elif v.get("status") == "END":
            rows = open_rows.pop((v["segment"], v["commit_lsn"]), [])
            # A restart may send a transaction's rows again: keep each sequence once.
            unique = {r["source"]["seq"]: r for r in rows}
            reassembler.add_part(Part(v["segment"], v["gxid"], bool(v["one_phase"]), v["commit_lsn"],
                                      v["commit_ts_ms"], tuple(unique[k] for k in sorted(unique))))
        elif "resolved" in v and v.get("resolved_ts_ms") is not None:
            reassembler.add_watermark(v["segment"], v["resolved_ts_ms"])
    ddl: dict[int, list[str]] = {}
    for _partition, _offset, v in read_values(kafka, topics.dtx):
        if v.get("type") == "ddl":
            ddl.setdefault(v["gxid"], []).append(v["statement"])
        elif v.get("type") == "commit":
            reassembler.add_record(Record(v["gxid"], tuple(v["segments"]), v["commit_ts_ms"],
                                          tuple(ddl.pop(v["gxid"], ()))))
