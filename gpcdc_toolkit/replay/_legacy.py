"""Replaying a stream written with legacy markers, segment by segment (pure).

Stock Greenplum writes no gxid into a segment's local transaction and no participant
list into the coordinator's commit record, so nothing ties the parts of a distributed
transaction together. What can still be done safely:

* Each segment's local transactions are applied in that segment's commit order. Every
  version of a row lives on one segment (the primary key holds the distribution key),
  so each row's history is replayed in order and, once every segment's log has been
  applied up to the same point, the target equals the source.
* Until then the target can show part of a distributed transaction (its part on one
  segment applied, on another not yet), and writes on different segments in another
  order than the source's. Nothing here can tell a missing part from a late one.
* DDL (its coordinator record has the gxid and statement) is placed by time: applied
  once every segment's watermark has passed the record's commit time plus the clock
  skew allowance, after every part committed at or before that time and before any
  part committed after it. So a part is held until the coordinator's watermark shows
  that no earlier DDL is still to come. That relies on the nodes' clocks agreeing
  within the skew.

Each part is applied exactly once through the checkpoint alone: a segment's parts are
applied in log order, so everything before the resume offset is applied and nothing
after it, and a part resent by a capture restart is known by its commit LSN, up to
which the checkpoint says everything is applied.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import StreamError
from ..protocol import COORDINATOR
from ._order import Missing, Part, Record, RepairMark, Whole


@dataclass
class _Log:
    parts: deque[Part] = field(default_factory=deque)
    watermark_ts_ms: int = -1
    last_lsn: int = -1


class SegmentOrder:
    """The legacy counterpart of :class:`Reassembler`, with the same interface."""

    def __init__(self, segments: int, *, clock_skew_ms: int = 1000, applied_lsn: Mapping[int, int] | None = None) -> None:
        self.logs = [_Log(last_lsn=(applied_lsn or {}).get(s, -1)) for s in range(segments)]
        self.clock_skew_ms = clock_skew_ms
        self._ddl: deque[Record] = deque()
        self._coordinator_lsn = (applied_lsn or {}).get(-1, -1)
        self._coordinator_watermark_ts_ms = -1
        self._damaged: Missing | None = None

    def add_repair(self, mark: RepairMark) -> None:
        raise StreamError(f"segment {mark.segment} was captured from a new cut (repair {mark.number}), which a stream written with "
                          "legacy markers cannot be replayed through: its transactions carry no gxid to tell which "
                          "the repair's copy holds", fix="bootstrap the pipeline again and replay into a fresh target")

    def add_part(self, part: Part) -> None:
        log = self.logs[part.segment]
        if part.commit_lsn <= log.last_lsn:
            return  # sent again after a capture restart
        log.last_lsn = part.commit_lsn
        log.parts.append(part)

    def add_record(self, record: Record) -> None:
        if not record.ddl or record.commit_lsn <= self._coordinator_lsn:
            return  # a legacy commit record says nothing usable; or a resend
        self._coordinator_lsn = record.commit_lsn
        self._ddl.append(record)

    def add_watermark(self, segment: int, resolved_ts_ms: int, prepared: object = None,
                      prepared_ts_ms: int | None = None, parts: int | None = None, lost: str | None = None,
                      lost_at: int = -1, resolved_lsn: int | None = None, at: int = -1) -> None:
        # A lost segment's log simply ends: segment by segment, nothing waits for it.
        if segment == COORDINATOR:
            self._coordinator_watermark_ts_ms = max(self._coordinator_watermark_ts_ms, resolved_ts_ms)
            return
        log = self.logs[segment]
        log.watermark_ts_ms = max(log.watermark_ts_ms, resolved_ts_ms)

    def ready(self) -> list[Whole]:
        out: list[Whole] = []
        while True:
            barrier = self._ddl[0].commit_ts_ms if self._ddl else None
            for log in self.logs:
                while log.parts and self._may_pass(log.parts[0], barrier):
                    head = log.parts[0]
                    if head.damage:  # nothing of this segment goes out from here on
                        self._damaged = self._damaged or Missing(
                            head.gxid, head.segment, (head.segment,), head.commit_ts_ms, log.watermark_ts_ms,
                            ((head.segment, head.offset),), head.damage)
                        break
                    out.append(Whole(None, (log.parts.popleft(),), None))
            if barrier is None:
                return out
            passed = all(log.watermark_ts_ms >= barrier + self.clock_skew_ms or
                         (log.parts and log.parts[0].commit_ts_ms > barrier) for log in self.logs)
            if not passed:
                return out
            ddl = self._ddl.popleft()
            out.append(Whole(ddl.gxid, (), ddl))

    def _may_pass(self, part: Part, barrier: int | None) -> bool:
        if barrier is not None:
            return part.commit_ts_ms <= barrier
        # No DDL known: one committed before this part may still be on its way.
        return part.commit_ts_ms + self.clock_skew_ms <= self._coordinator_watermark_ts_ms

    def missing(self) -> list[Missing]:
        # Without participant lists a missing part cannot be told from none; a damaged one can.
        return [self._damaged] if self._damaged is not None else []

    def resume_offsets(self) -> dict[int, int]:
        out = {s: log.parts[0].offset for s, log in enumerate(self.logs) if log.parts}
        if self._ddl:
            out[-1] = self._ddl[0].offset
        return out

    def oldest_waiting_ts_ms(self) -> int | None:
        times = [log.parts[0].commit_ts_ms for log in self.logs if log.parts]
        times += [self._ddl[0].commit_ts_ms] if self._ddl else []
        return min(times, default=None)

    @property
    def pending(self) -> int:
        return sum(len(log.parts) for log in self.logs) + len(self._ddl)
