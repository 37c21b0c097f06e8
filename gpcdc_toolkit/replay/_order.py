"""Reassembling distributed transactions and ordering them as the source did (pure).

Segments commit the parts of distributed transactions in orders that disagree with
each other and with the coordinator. What is fixed is this:

* two-phase transactions follow the coordinator's commit-record order (a writer that
  waited for another's row lock prepared, and so wrote its record, later);
* a one-phase transaction on segment s goes right after the latest, in coordinator
  order, of the two-phase transactions before it in s's log (its *anchor*), and the
  one-phase transactions of one segment keep their local order.

A two-phase transaction before a one-phase one in s's log but later in coordinator
order cannot conflict with it (the later record would have to be earlier), so the rule
never reorders conflicting writes. A two-phase transaction is whole when its record
and the part of every segment it lists have arrived; a one-phase one is whole on its
own. :class:`Reassembler` is fed parts (per segment, in partition order), records (in
coordinator order) and watermarks, in any interleaving, and hands out whole
transactions in an order that keeps every conflicting pair as the source had it.

A lost part is not in its segment's log, so by the rules above the one-phase parts
after it could go out before a watermark proves it missing, and one of them may change
what it wrote. Where parts are numbered, the next number shows the loss at once, and
nothing after a gap in a segment's numbers goes out.

A replay resumes by reading each partition again from the first offset of anything
not yet applied (:meth:`Reassembler.resume_offsets`). What it reads again may include
transactions applied already; given as ``applied``, they are passed over without being
waited for: their parts no longer need a record, and nothing waits on their anchor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import ClusterChangedError, StreamError
from ..protocol import COORDINATOR, DistributedSnapshot


@dataclass(frozen=True)
class Part:
    """One segment's local transaction of a distributed transaction."""

    segment: int
    gxid: int | None  # None: written with legacy markers
    one_phase: bool
    commit_lsn: int
    commit_ts_ms: int = 0
    payload: Any = None  # the row events, opaque here
    offset: int = -1  # where the part begins in its segment's partition
    damage: str | None = None  # why its rows are not whole (see Framer); None: whole
    number: int | None = None  # its place among the segment's parts (numbered streams)
    # Its END lies at or past where the run before a restart had read to: nothing of it
    # was read then, so if its transaction is applied, it went out without this part.
    new: bool = False


@dataclass(frozen=True)
class Record:
    """The coordinator's commit record of a two-phase distributed transaction."""

    gxid: int
    segments: tuple[int, ...]
    commit_ts_ms: int = 0
    ddl: tuple[str, ...] = ()
    commit_lsn: int = -1  # of the coordinator's local commit; -1: unknown
    offset: int = -1  # where the record (or its first DDL statement) is in the coordinator's partition
    syncpoint: bool = False  # a sync point's: the source's state at a consistent cut ends here
    # Every part it lists is decoded (the sandbox's): one that does not come is missing.
    # Otherwise a listed part may have changed nothing, and is then never decoded (Citus).
    all_parts_decoded: bool = False


@dataclass(frozen=True)
class RepairMark:
    """A repaired segment (a repaired mark, after its lost mark): its part of a
    transaction ``snapshot`` sees is in the repair's copied rows; of any other, in the
    stream after the mark (``offset``)."""

    segment: int
    number: int
    snapshot: DistributedSnapshot
    coordinator_lsn: int  # every commit record of a transaction the snapshot sees lies before it
    offset: int


@dataclass(frozen=True)
class Whole:
    """A distributed transaction ready to apply: every part, in segment order (or, from
    a legacy stream, one segment's local transaction, with no gxid). With ``reconcile``,
    no transaction: a repaired segment's rows to put in place on the target."""

    gxid: int | None
    parts: tuple[Part, ...]
    record: Record | None  # None: one-phase
    # Segments whose part is in a repair's copied rows: applied with that reconcile.
    covered: tuple[int, ...] = ()
    reconcile: RepairMark | None = None

    @property
    def one_phase(self) -> bool:
        return self.record is None


@dataclass(frozen=True)
class Missing:
    """A part that is proven never to come whole: the segment's watermark has passed
    the record while the segment no longer holds the transaction prepared, or the part
    arrived damaged (``damage`` says how)."""

    gxid: int | None
    segment: int
    present: tuple[int, ...]  # segments whose part did arrive
    record_ts_ms: int
    watermark_ts_ms: int
    offsets: tuple[tuple[int, int], ...] = ()  # (segment, offset) of the parts present; -1: the record
    damage: str | None = None  # the part arrived, but not whole
    lost: str | None = None  # the part cannot come: its node is lost to the pipeline (why)
    gap: tuple[int, int] | None = None  # numbers of the segment's parts that never arrived (first, last)

    @property
    def record_never_came(self) -> bool:
        """Whether what is missing is the transaction's commit record (its parts arrived)."""
        return self.lost is not None and self.gxid is not None and all(s != COORDINATOR for s, _ in self.offsets)


class ReassemblyError(StreamError, ValueError):
    """The stream contradicts itself (a part the record does not list, a duplicate record)."""


class _Recent:
    """The last ``size`` commit LSNs of one partition, to tell a resend (seen before)
    from a message that was lost and sent again later (never seen: its place in the
    order is gone)."""

    def __init__(self, size: int = 20_000) -> None:
        self._order: deque[int] = deque(maxlen=size)
        self._set: set[int] = set()

    def add(self, lsn: int) -> None:
        if len(self._order) == self._order.maxlen:
            self._set.discard(self._order[0])
        self._order.append(lsn)
        self._set.add(lsn)

    def resend(self, lsn: int) -> bool:
        """Whether ``lsn`` (below the last one added) was seen, or is too old to tell."""
        return lsn in self._set or not self._order or lsn < self._order[0]

    def __contains__(self, value: int) -> bool:
        return value in self._set


@dataclass
class _Segment:
    log: deque[Part] = field(default_factory=deque)  # arrived, not yet passed by the cursor
    anchor: int = -1  # coordinator position of the latest two-phase part passed so far
    watermark_ts_ms: int = -1
    # From the latest watermark: the gxids the segment held prepared, read at
    # prepared_ts_ms by its clock (None: the watermark did not say, so nothing is proven).
    prepared: frozenset[int] | None = None
    prepared_ts_ms: int = -1
    last_lsn: int = -1  # commit LSN of the last part arrived: partitions are in commit order
    recent: _Recent = field(default_factory=_Recent)
    # Numbered streams: the last number met (on a part, or a watermark's count), and the
    # first gap in the numbers, which stops the segment's order at the next part after it.
    numbered: bool = False
    last_number: int | None = None
    gap: tuple[int, int] | None = None  # numbers that never arrived, first and last
    gap_ts_ms: int = -1  # the commit time of the part after the gap, or the time of the watermark that showed it
    # Where the number before the gap was read (a part's, a watermark's count; else where
    # a watermark showed the gap; -1: nowhere known): read again at every resume, so that
    # the gap is seen again in what comes after, even where retention removed everything
    # before that offset.
    gap_at: int = -1
    blocked_from: int | None = None  # offset of the first part after the gap
    # Where the latest number was read (a part's, a watermark's count): a resume reads
    # again from there, so that it meets the number to count on from even where
    # retention removed everything before its resume point.
    numbered_at: int = -1
    lost: str | None = None  # why the segment's capture stopped for good: nothing of it comes any more
    lost_at: int = -1  # offset of its latest lost mark
    repair: RepairMark | None = None  # captured again after a loss (the latest repair)
    copy_out: bool = False  # the repair's copy is handed out (or was applied before a resume)
    # Two-phase parts not handed out yet, by gxid: their place in the log (counted from 0).
    arrival: dict[int, int] = field(default_factory=dict)
    arrived: int = 0
    # (place, gxid) of the parts that arrived before their record, in log order; one
    # whose record came since, or that went out, is dropped when it reaches the front.
    unrecorded: deque[tuple[int, int]] = field(default_factory=deque)

    @property
    def repaired(self) -> bool:
        """Captured again since its latest loss."""
        return self.repair is not None and self.repair.offset > self.lost_at


# A part's commit time is its microseconds cut to milliseconds, a watermark's time the
# server's clock rounded to them: with no clock skew allowed, a part committed just after
# a watermark could otherwise seem to come before it.
_ROUNDING_MS = 2


class Reassembler:
    """Streaming reassembly and ordering; see the module docstring.

    ``clock_skew_ms`` is how far a segment's clock may run ahead of the coordinator's:
    a part is proven missing only from a prepared list read at least that long after
    the record's commit time.
    """

    def __init__(self, segments: int, *, clock_skew_ms: int = 1000, applied: Container[int] = frozenset(),
                 applied_lsn: Mapping[int, int] | None = None, copies_applied: Mapping[int, int] | None = None) -> None:
        self.segments = [_Segment() for _ in range(segments)]
        # Per segment, the number of the latest repair whose copy is applied.
        self.copies_applied = dict(copies_applied or {})
        self._coordinator_resolved = -1  # the coordinator's watermark: every record before it has arrived
        self._coordinator_resolved_ts = -1  # the same by its clock: every record of a commit before it has arrived
        self._parts_added = 0  # two-phase parts added so far
        self._passed: tuple[tuple[int, int, int], list[Missing]] | None = None  # _record_passed's, and what it saw
        self.applied = applied
        # Per segment, the commit LSN up to which its one-phase parts without a gxid are
        # applied: they go out in their segment's order, so that order names them.
        self.applied_lsn = dict(applied_lsn or {})
        self.clock_skew_ms = clock_skew_ms
        self._records: deque[Record] = deque()  # not handed out yet; the first is at position _next
        self._position: dict[int, int] = {}  # gxid -> coordinator position (counted from 0)
        self._added = 0  # records added so far
        self._coordinator_lsn = -1  # commit LSN of the last record added
        self._coordinator_recent = _Recent()
        self._parts: dict[int, dict[int, Part]] = {}  # gxid -> segment -> part (two-phase)
        self._next = 0  # coordinator position of the next record to hand out
        self._damaged: Missing | None = None  # the first damaged part met where it would go out
        self._coordinator_lost: str | None = None  # why the coordinator's capture stopped: no record comes any more
        self._lost_at: dict[int, int] = {}  # partition -> offset of its lost mark
        # The latest gxids handed out without a part they list (it changed nothing, or is
        # in a repair's copy): their positions are kept, so that such a part arriving late
        # is refused as what it is.
        self._handed_out_without = _Recent(5_000)

    # -- input ----------------------------------------------------------------------------
    def add_part(self, part: Part) -> None:
        segment = self.segments[part.segment]
        if part.commit_lsn <= segment.last_lsn:
            if segment.recent.resend(part.commit_lsn):
                return  # sent again after a capture restart
            raise ReassemblyError(
                f"segment {part.segment}'s transaction at offset {part.offset} (commit LSN {part.commit_lsn}, gxid "
                f"{part.gxid}) arrives after a later one (commit LSN {segment.last_lsn}) and was never seen before: a "
                "message was lost and sent again, and its place in the source order cannot be rebuilt; bootstrap the "
                "pipeline again")
        segment.last_lsn = part.commit_lsn
        segment.recent.add(part.commit_lsn)
        if part.number is not None:
            self._count(segment, part)
        if part.gxid is None and part.one_phase and part.commit_lsn <= self.applied_lsn.get(part.segment, -1):
            return
        if part.gxid in self.applied:
            if part.new and not part.one_phase:
                raise self._late(part)  # applied by a run before, without it
            if not part.one_phase:
                segment.log.append(part)  # passed over in its place, see _advance
            return
        if not part.one_phase:
            if part.gxid is None:
                raise ReassemblyError(f"segment {part.segment}'s two-phase part at offset {part.offset} has no gxid")
            position = self._position.get(part.gxid)
            if position is not None and position < self._next:
                raise self._late(part)
            known = self._parts.setdefault(part.gxid, {})
            if part.segment in known:
                return
            known[part.segment] = part
            self._parts_added += 1
            segment.arrival[part.gxid] = segment.arrived
            if part.gxid not in self._position:
                segment.unrecorded.append((segment.arrived, part.gxid))
            segment.arrived += 1
            record = self._record_of(part.gxid)
            if record is not None and part.segment not in record.segments:
                raise ReassemblyError(f"gxid {part.gxid} has a part on segment {part.segment}, "
                                      f"but its commit record lists segments {list(record.segments)}")
        segment.log.append(part)

    def went_out_without(self, gxid: int) -> ReassemblyError:
        """The error for the parts of ``gxid`` waiting here for a record, once the target
        says it applied that transaction: it went out without them, in this run (its
        place since forgotten) or in a run before (its record read before the restart).
        A part read again is never among them: the window a run begins with holds it."""
        return self._late(min(self._parts[gxid].values(), key=lambda part: part.offset))

    def add_record(self, record: Record) -> None:
        if record.commit_lsn >= 0:
            if record.commit_lsn <= self._coordinator_lsn:
                if self._coordinator_recent.resend(record.commit_lsn):
                    return  # sent again after a capture restart
                raise ReassemblyError(
                    f"the commit record of gxid {record.gxid} at offset {record.offset} (commit LSN "
                    f"{record.commit_lsn}) arrives after a later one and was never seen before: a message was lost and "
                    "sent again, and its place in the source order cannot be rebuilt; bootstrap the pipeline again")
            self._coordinator_lsn = record.commit_lsn
            self._coordinator_recent.add(record.commit_lsn)
        if record.gxid in self._position or record.gxid in self.applied:
            return  # a duplicate, or applied before a restart
        if beyond := [s for s in record.segments if s >= len(self.segments)]:
            raise ClusterChangedError(
                f"the commit record of gxid {record.gxid} lists segments {beyond}, beyond segments 0 to "
                f"{len(self.segments) - 1}, which this replay reads: the pipeline was extended to segments added to "
                "the source since it began",
                fix="run the replay again: it reads the new segments' partitions and goes on from its checkpoint")
        for segment in self._parts.get(record.gxid, {}):
            if segment not in record.segments:
                raise ReassemblyError(f"gxid {record.gxid} has a part on segment {segment}, "
                                      f"but its commit record lists segments {list(record.segments)}")
        self._position[record.gxid] = self._added
        self._added += 1
        self._records.append(record)

    @staticmethod
    def _late(part: Part) -> ReassemblyError:
        return ReassemblyError(
            f"segment {part.segment}'s part of gxid {part.gxid} at offset {part.offset} arrives after the "
            "transaction went out without it (its part there was proven to have changed nothing, or to be in "
            "a repair's copy): the target lacks what it changed; bootstrap the pipeline again")

    def _count(self, segment: _Segment, part: Part) -> None:
        assert part.number is not None
        segment.numbered = True
        before, segment.numbered_at = segment.numbered_at, max(segment.numbered_at, part.offset)
        if segment.last_number is not None and part.number <= segment.last_number:
            raise ReassemblyError(f"segment {part.segment}'s part at offset {part.offset} is numbered {part.number}, "
                                  f"after part {segment.last_number}: the partition's numbering goes back")
        if segment.last_number is not None and part.number > segment.last_number + 1 and segment.gap is None:
            segment.gap, segment.gap_ts_ms = (segment.last_number + 1, part.number - 1), part.commit_ts_ms
            segment.gap_at = before
        if segment.gap is not None and segment.blocked_from is None:
            segment.blocked_from = part.offset
        segment.last_number = part.number

    def add_watermark(self, segment: int, resolved_ts_ms: int, prepared: Iterable[int] | None = None,
                      prepared_ts_ms: int | None = None, parts: int | None = None, lost: str | None = None,
                      lost_at: int = -1, resolved_lsn: int | None = None, at: int = -1) -> None:
        """A node's progress, at offset ``at`` of its partition; ``lost``: its capture
        stopped for good (a lost mark at offset ``lost_at`` ends its partition: every part
        of it that will ever come is read)."""
        if lost is not None:
            self._lost_at[segment] = min(self._lost_at.get(segment, lost_at), lost_at)
        if segment < 0:
            # The coordinator's: records come in their own order, nothing waits on it, unless
            # it is lost (then no record comes for parts arrived without one).
            self._coordinator_lost = self._coordinator_lost or lost
            if resolved_lsn is not None:
                self._coordinator_resolved = max(self._coordinator_resolved, resolved_lsn)
            self._coordinator_resolved_ts = max(self._coordinator_resolved_ts, resolved_ts_ms)
            return
        seg = self.segments[segment]
        if lost is not None:
            seg.lost, seg.lost_at = lost, max(seg.lost_at, lost_at)
        if parts is not None:
            seg.numbered = True
            before, seg.numbered_at = seg.numbered_at, max(seg.numbered_at, at)
            if seg.last_number is None:
                seg.last_number = parts
            elif parts > seg.last_number and seg.gap is None:
                # Lost before this watermark: what follows waits.
                seg.gap, seg.gap_ts_ms, seg.gap_at = (seg.last_number + 1, parts), resolved_ts_ms, (before if before >= 0 else at)
        seg.watermark_ts_ms = max(seg.watermark_ts_ms, resolved_ts_ms)
        if prepared is not None and prepared_ts_ms is not None and prepared_ts_ms >= seg.prepared_ts_ms:
            seg.prepared, seg.prepared_ts_ms = frozenset(prepared), prepared_ts_ms

    def add_repair(self, mark: RepairMark) -> None:
        """A repaired mark: the segment's stream goes on after it, from a new slot whose
        LSNs are its own. The latest mark is the repair (one that failed half-way and was
        run again leaves an earlier mark of the same number)."""
        segment = self.segments[mark.segment]
        if segment.repair is None or mark.offset > segment.repair.offset:
            segment.repair = mark
            segment.copy_out = self.copies_applied.get(mark.segment, 0) >= mark.number
            segment.last_lsn, segment.recent = -1, _Recent()

    def _copy_applied(self, segment: _Segment) -> bool:
        """Whether the segment's latest repair's copy was applied before this replay began."""
        return (segment.repaired and segment.repair is not None
                and self.copies_applied.get(segment.repair.segment, 0) >= segment.repair.number)

    def _covered(self, record: Record, s: int) -> bool:
        """Whether the record's part on ``s`` is in a repair's copied rows."""
        repair = self.segments[s].repair
        return repair is not None and repair.snapshot.sees(record.gxid)

    def _reconcile_due(self, out: list[Whole]) -> bool:
        """Hand out each repair's rows once every transaction its snapshot sees is out:
        the next record is one it does not see, or the coordinator's stream is past
        the cut with no record waiting. Every part from before the segment's loss is
        of such a transaction, so none comes after the copy to bring older values back;
        every part after the repaired mark waits for the copy (``_blocked``)."""
        head = self._records[0] if self._records else None
        coordinator = max(self._coordinator_lsn, self._coordinator_resolved)
        handed = False
        for segment in self.segments:
            repair = segment.repair
            if repair is None or segment.copy_out:
                continue
            if (not repair.snapshot.sees(head.gxid)) if head is not None else coordinator >= repair.coordinator_lsn:
                out.append(Whole(None, (), None, reconcile=repair))
                segment.copy_out = True
                handed = True
        return handed

    def _record_of(self, gxid: int) -> Record | None:
        position = self._position.get(gxid)
        return None if position is None or position < self._next else self._records[position - self._next]

    # -- output ---------------------------------------------------------------------------
    def ready(self) -> list[Whole]:
        """Every transaction that can be applied now, in an order true to the source."""
        if self._record_passed():
            return []  # the order from here on cannot be proven (see missing())
        out: list[Whole] = []
        progress = True
        while progress:
            progress = False
            for segment in self.segments:
                progress |= self._advance(segment, out)
            if self._reconcile_due(out):
                # The repaired segment's parts after its mark are free now: the one-phase
                # ones go out before any later record takes a part from behind them.
                progress = True
                continue
            if self._records:
                record = self._records[0]
                parts = self._parts.get(record.gxid, {})
                if all(s in parts or self._empty(record, s) or self._covered(record, s) for s in record.segments):
                    if any(self._blocked(p) for p in parts.values()):
                        break  # after a gap in its segment's numbers: the order there is lost
                    if self._follows_unrecorded(record, parts):
                        break  # it may have to follow a transaction whose record is late, or lost
                    damaged = [parts[s] for s in sorted(parts) if parts[s].damage]
                    if damaged:
                        self._hold_damaged(damaged[0], record, parts)
                        break
                    covered = tuple(s for s in record.segments if s not in parts and self._covered(record, s))
                    if len(parts) < len(record.segments):
                        self._handed_out_without.add(record.gxid)
                    out.append(Whole(record.gxid, tuple(parts[s] for s in sorted(parts)), record, covered))
                    self._parts.pop(record.gxid, None)  # none when every part changed nothing
                    for s in parts:
                        del self.segments[s].arrival[record.gxid]
                    self._records.popleft()
                    self._next += 1
                    progress = True
        if len(self._position) > 2 * len(self._records) + 10_000:
            self._forget_handed_out()
        return out

    def _forget_handed_out(self) -> None:
        """Drop the positions of handed-out records that no segment log still needs
        (their parts have all arrived; a part sent again is caught by its LSN), but for
        the latest handed out without a part."""
        needed = {p.gxid for seg in self.segments for p in seg.log}
        self._position = {g: pos for g, pos in self._position.items()
                          if pos >= self._next or g in needed or g in self._handed_out_without}

    def _advance(self, segment: _Segment, out: list[Whole]) -> bool:
        """Pass the head of a segment's log while its order allows."""
        moved = False
        while segment.log:
            head = segment.log[0]
            if self._blocked(head):
                break
            if head.one_phase:
                if segment.anchor >= self._next:
                    break  # its anchor has not been handed out yet
                if head.damage:
                    self._hold_damaged(head, None, {head.segment: head})
                    break
                out.append(Whole(head.gxid, (head,), None))
            elif head.gxid not in self.applied:
                # A two-phase part goes out with its record, in coordinator order;
                # here it only moves the anchor of the one-phase parts after it.
                position = self._position.get(head.gxid) if head.gxid is not None else None
                if position is None:
                    break  # the record has not arrived: the anchor of what follows is unknown
                segment.anchor = max(segment.anchor, position)
            segment.log.popleft()
            moved = True
        return moved

    def _blocked(self, part: Part) -> bool:
        """Whether the part comes after a gap in its segment's numbers, or after its
        segment's repaired mark while the repair's rows are not out yet."""
        segment = self.segments[part.segment]
        if segment.repair is not None and not segment.copy_out and part.offset > segment.repair.offset:
            return True
        return segment.blocked_from is not None and part.offset >= segment.blocked_from

    def _follows_unrecorded(self, record: Record, parts: Mapping[int, Part]) -> bool:
        """Whether one of the transaction's parts comes after a part, in its segment's log,
        whose record has not arrived. That transaction may have had to go first: a writer
        that waited for its row lock wrote its own record later, so that record came
        first, and the other is lost. Or its record comes later in the coordinator's
        order, and they do not conflict: then it is only held until that record comes.
        A part that changed nothing has no place in its segment's log: any part waiting
        there may come before it (its DDL, applied from the record, may have had to wait
        for that part's locks)."""
        for s in record.segments:
            segment = self.segments[s]
            waiting = segment.unrecorded
            while waiting and (waiting[0][1] in self._position or waiting[0][1] not in segment.arrival):
                waiting.popleft()  # its record came, or it went out (with a record, or applied before)
            if waiting and (s not in parts or waiting[0][0] < segment.arrival[record.gxid]):
                return True
        return False

    def _proven_absent(self, record: Record, s: int) -> bool:
        """Whether segment ``s`` holds no part of the record's transaction uncommitted:
        its prepared list, read late enough after the record, does not name it."""
        segment = self.segments[s]
        return (segment.prepared is not None and record.gxid not in segment.prepared
                and segment.prepared_ts_ms >= record.commit_ts_ms + self.clock_skew_ms)

    def _undecided(self, record: Record, s: int) -> bool:
        """Whether segment ``s`` has yet to say whether it still holds the record's part
        prepared: no prepared list of it read late enough after the record."""
        segment = self.segments[s]
        return segment.lost is None and (segment.prepared is None
                                         or segment.prepared_ts_ms < record.commit_ts_ms + self.clock_skew_ms)

    def _empty(self, record: Record, s: int) -> bool:
        """Whether the record's part on ``s``, not arrived, changed nothing: proven absent
        from a numbered stream with no gap, where a listed part may go undecoded. A part
        that changed nothing is not decoded (Citus lists every prepared connection,
        written to or not); one with changes would have arrived, numbered, before the
        proving watermark."""
        segment = self.segments[s]
        return (not record.all_parts_decoded and segment.numbered and segment.gap is None and segment.lost is None
                and self._proven_absent(record, s))

    def _hold_damaged(self, part: Part, record: Record | None, parts: Mapping[int, Part]) -> None:
        """Hand out nothing from here on: a damaged part stops the order where it stands."""
        if self._damaged is None:
            offsets: tuple[tuple[int, int], ...] = ((-1, record.offset),) if record is not None else ()
            offsets += tuple((c, parts[c].offset) for c in sorted(parts))
            self._damaged = Missing(part.gxid, part.segment, tuple(sorted(parts)),
                                    record.commit_ts_ms if record is not None else part.commit_ts_ms,
                                    self.segments[part.segment].watermark_ts_ms, offsets, part.damage)

    def missing(self) -> list[Missing]:
        """Parts of the next transaction proven never to come whole: damaged, or
        missing (see :class:`Missing`). Until then a part that has not arrived is late."""
        if self._damaged is not None:
            return [self._damaged]
        return self._missing_parts() or self._lost_parts() or self._unrecorded()

    def _lost_parts(self) -> list[Missing]:
        """Gaps in a segment's numbers, once everything before the gap has passed, or can
        never pass: parts lost. Named by the first waiting record that lists the segment,
        written before the gap was seen, whose part there is proven absent (the gap shows
        it did not change nothing), once each such record's part is known to be absent or
        still prepared there; else unnamed (a one-phase part has no record)."""
        out: list[Missing] = []
        gapped = [(content, segment) for content, segment in enumerate(self.segments) if segment.gap is not None]
        stuck = bool(gapped) and self._stuck_at_a_gap()
        for content, segment in gapped:
            assert segment.gap is not None
            if not stuck and any(not self._blocked(p) for p in segment.log):
                continue
            # A lost two-phase part committed before the gap was seen, its record earlier.
            before = segment.gap_ts_ms + self.clock_skew_ms + _ROUNDING_MS
            absent = [r for r in self._records if content in r.segments and r.commit_ts_ms <= before
                      and content not in self._parts.get(r.gxid, {}) and not self._covered(r, content)]
            if any(self._undecided(r, content) for r in absent):
                continue  # the next prepared list may prove the lost part a record's: named then
            if named := next((r for r in absent if self._proven_absent(r, content)), None):
                out.append(self._missing(named, content, gap=segment.gap))
                continue
            first, last = segment.gap
            numbers = f"{first}" if first == last else f"{first} to {last}"
            offsets = ((content, segment.blocked_from),) if segment.blocked_from is not None else ()
            out.append(Missing(None, content, (), -1, segment.watermark_ts_ms, offsets,
                               f"its parts numbered {numbers} never arrived: the order after them is lost"))
        return out

    def _stuck_at_a_gap(self) -> bool:
        """Whether the next record can never go out: its part on a segment with a gap in
        its numbers came after the gap, or has not come (then it is lost, or comes after
        the gap). No record goes out after it either, so the parts before a gap that wait
        for their records, or follow one, never pass: the gap is reported without them."""
        if not self._records:
            return False
        record = self._records[0]
        parts = self._parts.get(record.gxid, {})
        return any(self.segments[s].gap is not None and (self._blocked(parts[s]) if s in parts
                                                          else not self._covered(record, s))
                   for s in record.segments)

    def _missing(self, record: Record, s: int, **why: Any) -> Missing:
        """The record's part on ``s`` as missing, with the offsets of what did arrive."""
        parts = self._parts.get(record.gxid, {})
        offsets = ((-1, record.offset), *((c, parts[c].offset) for c in sorted(parts)))
        return Missing(record.gxid, s, tuple(sorted(parts)), record.commit_ts_ms, self.segments[s].watermark_ts_ms,
                       offsets, **why)

    def _missing_parts(self) -> list[Missing]:
        if not self._records:
            return []
        record = self._records[0]
        parts = self._parts.get(record.gxid, {})
        out = []
        for s in record.segments:
            segment = self.segments[s]
            if s not in parts and segment.repaired:
                continue  # in the repair's copy, or still to come after its mark
            if s not in parts and segment.lost is not None and not self._covered(record, s):
                out.append(self._missing(record, s, lost=f"segment {s} is lost to the pipeline ({segment.lost})"))
                continue
            if s in parts or segment.prepared is None or record.gxid in segment.prepared:
                continue  # arrived, not provable, or still prepared there: it can still commit
            if self._proven_absent(record, s) and not self._empty(record, s):
                out.append(self._missing(record, s, gap=segment.gap))
        return out

    def _unrecorded(self) -> list[Missing]:
        """With the coordinator lost and every record it wrote read, a part still waiting
        for its record (the one of lowest offset, not always the one the next record is
        held behind), once every record it wrote is handed out or the next is held behind
        such a part: no record of them can come. Else, one whose record was lost
        (:meth:`_record_passed`)."""
        if self._coordinator_lost is None or (self._records and not self._follows_unrecorded(
                self._records[0], self._parts.get(self._records[0].gxid, {}))):
            return self._record_passed()
        unrecorded = [(gxid, parts) for gxid, parts in self._parts.items() if gxid not in self._position]
        return self._waiting_for_record(unrecorded,
                                        f"the coordinator is lost to the pipeline ({self._coordinator_lost})")

    def _record_passed(self) -> list[Missing]:
        """The first part whose commit the coordinator's watermark has passed, by more
        than the clocks may disagree, with no record: the coordinator commits before its
        segments do, so the record came before that watermark, or was lost. Nothing is
        handed out after it (:meth:`ready`): a later record may be of a transaction that
        had to follow it."""
        seen = (self._coordinator_resolved_ts, self._added, self._parts_added)
        if self._passed is None or self._passed[0] != seen:  # asked at every ready(): looked at again on news only
            passed = [(gxid, parts) for gxid, parts in self._parts.items()
                      if gxid not in self._position and gxid not in self.applied
                      and min(p.commit_ts_ms for p in parts.values()) + self.clock_skew_ms + _ROUNDING_MS
                      <= self._coordinator_resolved_ts]
            self._passed = (seen, self._waiting_for_record(passed, "the coordinator's watermark passed its commit",
                                                           lambda p: p.commit_ts_ms))
        return self._passed[1]

    def _waiting_for_record(self, waiting: Iterable[tuple[int, dict[int, Part]]], why: str,
                            named: Callable[[Part], int] = lambda p: p.offset) -> list[Missing]:
        """The first (by offset) of the transactions ``waiting``, named by its part that
        comes first by ``named`` (the one whose commit proves the record lost)."""
        first_waiting = min(waiting, key=lambda item: min(p.offset for p in item[1].values()), default=None)
        if first_waiting is None:
            return []
        gxid, parts = first_waiting
        first = min(parts.values(), key=named)
        return [Missing(gxid, first.segment, tuple(sorted(parts)), -1, self.segments[first.segment].watermark_ts_ms,
                        tuple((c, parts[c].offset) for c in sorted(parts)),
                        lost=f"{why}, and gxid {gxid}'s commit record never came")]

    def in_doubt(self) -> list[tuple[int, int]]:
        """(gxid, segment) of the next record's parts that have not arrived and cannot be
        called missing yet: late, or still prepared on their segment (not those proven to
        have changed nothing)."""
        if not self._records:
            return []
        record = self._records[0]
        parts = self._parts.get(record.gxid, {})
        return [(record.gxid, s) for s in record.segments
                if s not in parts and not self._empty(record, s) and not self._covered(record, s)]

    def resume_offsets(self) -> dict[int, int]:
        """Per segment, and for the coordinator (key -1), the first offset of anything
        arrived but not handed out, or of the latest number read on a numbered segment;
        a source with neither is left out."""
        out: dict[int, int] = {}
        for content, segment in enumerate(self.segments):
            waiting = [p.offset for p in segment.log if p.gxid not in self.applied]
            if waiting:
                out[content] = min(waiting)
        for parts in self._parts.values():
            for content, part in parts.items():
                out[content] = min(out.get(content, part.offset), part.offset)
        if self._records:
            out[-1] = self._records[0].offset
        for content, offset in self._lost_at.items():  # read again at every resume, so that it is known
            if content >= 0 and self._copy_applied(self.segments[content]):
                continue  # repaired, and its copy applied: nothing before the marks is needed again
            out[content] = min(out.get(content, offset), offset)
        for content, segment in enumerate(self.segments):
            for offset in (segment.gap_at, segment.numbered_at):
                if offset >= 0:
                    out[content] = min(out.get(content, offset), offset)
            # A repaired mark too, until its copy is applied: a joined segment's has no
            # lost mark before it, and a resume past it would hand out its covered
            # transactions without the copy.
            if segment.repair is not None and not self._copy_applied(segment):
                out[content] = min(out.get(content, segment.repair.offset), segment.repair.offset)
        return out

    def oldest_waiting_ts_ms(self) -> int | None:
        """The source commit time of the oldest transaction arrived but not handed out."""
        times = [p.commit_ts_ms for seg in self.segments for p in seg.log if p.gxid not in self.applied]
        times += [p.commit_ts_ms for parts in self._parts.values() for p in parts.values()]
        times += [r.commit_ts_ms for r in self._records]
        return min(times, default=None)

    @property
    def pending(self) -> int:
        """Transactions arrived in part but not handed out."""
        waiting = {p.gxid for seg in self.segments for p in seg.log}
        return len(waiting | set(self._parts) | {r.gxid for r in self._records})


class Ordering(Protocol):
    def resume_offsets(self) -> dict[int, int]: ...


def resume_point(read: Mapping[int, int], reassembler: Ordering, unapplied: Iterable[Whole],
                 *begun: Mapping[int, int]) -> dict[int, int]:
    """Per partition (segment; -1 for the coordinator), where to read again so that
    nothing not yet applied is skipped: the first offset of anything waiting in the
    reassembler, of the ``unapplied`` transactions handed out, or of ``begun`` (framing
    in progress); else ``read``, the next offset not read."""
    resume = dict(read)
    waiting = [reassembler.resume_offsets(), *begun]
    for whole in unapplied:
        waiting.append({p.segment: p.offset for p in whole.parts})
        if whole.record is not None:
            waiting.append({-1: whole.record.offset})
    for offsets in waiting:
        for partition, offset in offsets.items():
            resume[partition] = min(resume.get(partition, offset), offset)
    return resume
