"""Warming a Spark session for audits: an audit run, as the audit notebook runs one, on
a small stream made here.

A JVM's first audit pays for compiling what it runs (Catalyst's rules, generated
code), which on two cores takes longer than the audit of a small stream itself; a
Spark server keeps what it compiled for every session after. ``gpcdc spark up
--warm`` and the demo warm the server while nothing waits for it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from ..config import Config
from ._faults import Message
from ._run import AuditResult, run_audit

PREFIX = "warm"
SEGMENTS = 2


def warm_stream(transactions: int = 24, now_ms: int | None = None) -> list[Message]:
    """A stream of ``transactions`` distributed transactions over two segments, every
    other one two-phase on both, with one part sent twice (as a capture restart sends
    it), one part still held prepared (late) and one DDL of the table written: every
    rule has rows to read (the rules that stop early on a window with no DDL or no
    absent part too), and the duplicates theirs."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    changes, dtx = f"{PREFIX}.changes", f"{PREFIX}.dtx"
    partitions: dict[tuple[str, int], list[tuple[bytes | None, dict[str, Any], int]]] = {
        (topic, partition): [(None, {"type": "pipeline", "pipeline": PREFIX, "segment": node, "version": 2}, now_ms)]
        for topic, partition, node in [(changes, s, s) for s in range(SEGMENTS)] + [(dtx, 0, -1)]}
    lsn = 1000
    late, altering = transactions - 1 - transactions % 2, 1  # two-phase transactions (odd gxids)
    for gxid in range(1, transactions + 1):
        lsn += 100
        ts = now_ms + gxid
        segments = list(range(SEGMENTS)) if gxid % 2 else [gxid % SEGMENTS]
        for segment in segments:
            one_phase = len(segments) == 1
            common: dict[str, Any] = {"segment": segment, "gxid": gxid, "xid": lsn, "commit_lsn": lsn,
                                      "commit_ts_ms": ts, "id": f"{segment}:{lsn}", "ts_ms": ts}
            source = {"version": 2, "connector": "gpcdc", "name": PREFIX, "db": "postgres", "schema": "public",
                      "table": "t", "segment": segment, "txId": lsn, "commit_lsn": lsn, "ts_ms": ts, "gxid": gxid,
                      "seq": 1, "one_phase": one_phase}
            key = gxid * SEGMENTS + segment
            part: list[tuple[bytes | None, dict[str, Any], int]] = [
                (None, {"status": "BEGIN", "event_count": None, "data_collections": None, **common}, ts),
                (orjson.dumps({"id": key}),
                 {"before": None, "after": {"id": key, "v": gxid}, "source": source, "op": "c", "ts_ms": ts}, ts),
                (None, {"status": "END", "event_count": 1, "data_collections": [], "one_phase": one_phase,
                        "end_lsn": lsn + 8, **common}, ts)]
            if (gxid, segment) != (late, SEGMENTS - 1):
                partitions[(changes, segment)] += part * (2 if gxid == 2 else 1)
        if len(segments) > 1:
            record = {"gxid": gxid, "segment": -1, "xid": lsn, "commit_lsn": lsn, "commit_ts_ms": ts}
            if gxid == altering:
                partitions[(dtx, 0)].append((None, {"type": "ddl", "statement": "ALTER TABLE public.t ADD COLUMN w int",
                                                    **record}, ts))
            partitions[(dtx, 0)].append((None, {"type": "commit", "segments": segments,
                                                "ddl_count": int(gxid == altering), **record}, ts))
    end = now_ms + transactions + 1
    for topic, partition in partitions:
        node = -1 if topic == dtx else partition
        held = [late] if node == SEGMENTS - 1 else []
        mark = {"resolved": lsn + 100, "resolved_ts_ms": end, "segment": node, "ts_ms": end, "prepared": held,
                "prepared_ts_ms": end}
        partitions[(topic, partition)].append((None, {**mark, "type": "resolved"} if node == -1 else mark, end))
    return [Message(topic, partition, offset, ts, key, orjson.dumps(value))
            for (topic, partition), items in sorted(partitions.items())
            for offset, (key, value, ts) in enumerate(items)]


def warm_up(spark: Any, config: Config) -> AuditResult:
    """Audit :func:`warm_stream` with ``spark`` as the audit notebook audits a pipeline
    (the rules, the stream's suites, the findings written, their charts), in a work
    directory of its own, removed after; its result."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..ingest._rows import arrow_schema, to_arrow, to_row

    with tempfile.TemporaryDirectory(prefix="gpcdc-warm-") as work_dir:
        archive = Path(work_dir) / "archive"
        (archive / "run-000001").mkdir(parents=True)
        rows = [to_row(m.topic, m.partition, m.offset, m.timestamp_ms, m.key, m.value) for m in warm_stream()]
        pq.write_table(pa.Table.from_batches([to_arrow(rows, arrow_schema())]), archive / "run-000001" / "stream.parquet")
        result = run_audit(spark, config.with_settings({"work_dir": work_dir, "kafka.topic_prefix": PREFIX}),
                           archive=archive)
        result.figures()
        result.findings.limit(500).toPandas()
        return result
