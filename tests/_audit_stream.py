"""A protocol stream written by hand: for audits of exact situations, as messages or
produced to a real broker."""

from __future__ import annotations

import orjson
from confluent_kafka import Producer

from gpcdc_toolkit.audit._faults import Message


class StreamBuilder:
    def __init__(self, prefix: str = "t", segments: int = 3, *, numbered: bool = False) -> None:
        self.changes, self.dtx = f"{prefix}.changes", f"{prefix}.dtx"
        self.segments = segments
        self.partitions: dict[tuple[str, int], list[tuple[bytes | None, dict, int]]] = {}
        # Numbered, as capture numbers a Citus worker's parts: per segment, the last number given.
        self.numbers: dict[int, int] | None = {s: 0 for s in range(segments)} if numbered else None
        # Every partition begins with its pipeline marker, as capture writes it.
        for topic, partition, node in [(self.changes, s, s) for s in range(segments)] + [(self.dtx, 0, -1)]:
            marker = {"type": "pipeline", "pipeline": "test", "segment": node, "version": 2}
            if numbered and node >= 0:
                marker["parts"] = 0
            self._put(topic, partition, None, marker, 1)

    def _put(self, topic, partition, key, value, ts):
        self.partitions.setdefault((topic, partition), []).append((key, value, ts))

    def part(self, segment, gxid, lsn, ts, rows=(("t", 1),), one_phase=False, count=None, lost=False, ended=True):
        """A segment's local transaction: BEGIN, a row event per (table, key), END
        (``lost``: numbered, and then lost on its way; not ``ended``: its END never
        written, as by a worker killed after its rows)."""
        common = {"segment": segment, "gxid": gxid, "xid": lsn, "commit_lsn": lsn, "commit_ts_ms": ts}
        if self.numbers is not None:
            self.numbers[segment] += 1
            common["number"] = self.numbers[segment]
        if lost:
            return self
        self._put(self.changes, segment, None, {"status": "BEGIN", "id": f"{segment}:{lsn}", "ts_ms": ts,
                                                 "event_count": None, "data_collections": None, **common}, ts)
        for seq, (table, key) in enumerate(rows, 1):
            source = {"version": 2, "connector": "gpcdc", "name": "t", "db": "postgres", "schema": "public",
                      "table": table, "segment": segment, "txId": lsn, "commit_lsn": lsn, "ts_ms": ts, "gxid": gxid,
                      "seq": seq, "one_phase": one_phase}
            self._put(self.changes, segment, orjson.dumps({"id": key}),
                      {"before": None, "after": {"id": key, "v": seq}, "source": source, "op": "c", "ts_ms": ts}, ts)
        if not ended:
            return self
        self._put(self.changes, segment, None, {"status": "END", "id": f"{segment}:{lsn}", "ts_ms": ts,
                                                 "event_count": len(rows) if count is None else count,
                                                 "data_collections": [], "one_phase": one_phase, "end_lsn": lsn + 8,
                                                 **common}, ts)
        return self

    def record(self, gxid, segments, lsn, ts, ddl=()):
        for statement in ddl:
            self._put(self.dtx, 0, None, {"type": "ddl", "gxid": gxid, "statement": statement, "segment": -1,
                                          "xid": lsn, "commit_lsn": lsn, "commit_ts_ms": ts}, ts)
        self._put(self.dtx, 0, None, {"type": "commit", "gxid": gxid, "segments": segments, "segment": -1,
                                      "xid": lsn, "commit_lsn": lsn, "commit_ts_ms": ts, "ddl_count": len(ddl)}, ts)
        return self

    def lost(self, node, reason, ts=9_000):
        """The lost mark capture ends a node's partition with when the node changed."""
        topic, partition = (self.dtx, 0) if node == -1 else (self.changes, node)
        self._put(topic, partition, None, {"type": "lost", "segment": node, "reason": reason, "version": 2}, ts)
        return self

    def repaired(self, node, number, xmax, running=(), coordinator_lsn=0, ts=9_500):
        """The repaired mark `gpcdc bootstrap repair` writes after a node's lost mark."""
        self._put(self.changes, node, None, {"type": "repaired", "segment": node, "number": number, "xmax": xmax,
                                             "in_progress": list(running), "coordinator_lsn": coordinator_lsn,
                                             "version": 2}, ts)
        return self

    def watermark(self, node, resolved, ts, prepared=(), prepared_ts=None):
        value = {"resolved": resolved, "resolved_ts_ms": ts, "segment": node, "ts_ms": ts,
                 "prepared": list(prepared), "prepared_ts_ms": ts - 1 if prepared_ts is None else prepared_ts}
        if self.numbers is not None and node >= 0:
            value["parts"] = self.numbers[node]
        if node == -1:
            self._put(self.dtx, 0, None, {**value, "type": "resolved"}, ts)
        else:
            self._put(self.changes, node, None, value, ts)
        return self

    def messages(self) -> list[Message]:
        return [Message(topic, partition, offset, ts, key, orjson.dumps(value))
                for (topic, partition), items in sorted(self.partitions.items())
                for offset, (key, value, ts) in enumerate(items)]

    def produce(self, kafka: dict[str, str]) -> None:
        """Everything added so far (since the last produce) to the broker, in order."""
        producer = Producer({**kafka, "enable.idempotence": True})
        for (topic, partition), items in sorted(self.partitions.items()):
            for key, value, ts in items:
                producer.produce(topic, orjson.dumps(value), key, partition=partition, timestamp=ts)
        assert producer.flush(30) == 0
        self.partitions.clear()
