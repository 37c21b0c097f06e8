"""From the pipeline's messages to parts, records and watermarks (pure).

Messages come per partition, in partition order: partition ``s`` of the changes topic
holds segment ``s``'s local transactions (the ``segment`` dispatcher), and the
coordinator's topic is called partition -1 here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from ..errors import StreamError
from ..protocol import COORDINATOR, PROTOCOL_VERSION, DistributedSnapshot, kind_of, problem_of
from ._order import Part, Record, RepairMark

ROW_OPS = ("c", "u", "d", "t")
# The image each operation cannot do without: the row written, or the row deleted.
_IMAGE_OF = {"c": "after", "u": "after", "d": "before"}

_LEGACY_FIX = ("nothing was applied past this point; replay it segment by segment with --replay-legacy-per-segment "
               "(exact once every segment is replayed, but parts of distributed transactions can show until then), "
               "or capture from a cluster that writes the gxid markers")


class LegacyStreamError(StreamError):
    """The stream was written with legacy markers: no gxid on segment parts, or no
    participant list on commit records."""


class MalformedMessageError(StreamError):
    """A message that is not one of the protocol's (another writer's, or damaged): the
    replayer sets it aside and reads on, since a protocol event it might have been
    leaves a gap that the parts' sequence numbers and counts show."""

    def __init__(self, partition: int, offset: int, reason: str) -> None:
        self.partition, self.offset, self.reason = partition, offset, reason
        super().__init__(f"the message at offset {offset} of partition {partition} is not a protocol message: {reason}",
                         fix="find what else writes to the pipeline's topics")


@dataclass(frozen=True)
class Watermark:
    segment: int
    resolved_ts_ms: int
    prepared: frozenset[int] | None = None  # gxids the node held prepared at prepared_ts_ms (None: not said)
    prepared_ts_ms: int | None = None
    parts: int | None = None  # the number of the node's last part before it (numbered streams)
    lost: str | None = None  # a lost mark: why the node's capture stopped for good
    offset: int = -1  # where it is in its partition (a lost mark's is read again at every resume: see Reassembler)
    resolved_lsn: int | None = None  # the node's WAL position up to which everything has been sent
    repaired: RepairMark | None = None  # a repaired mark: the node is captured again after its loss


def _watermark(partition: int, offset: int, value: Mapping[str, Any]) -> Watermark | None:
    if value.get("resolved_ts_ms") is None:
        # The first of a capture session, written before its clock was read: it says no
        # time, but its count of parts may show a gap, as a resume reading before it finds.
        return None if value.get("parts") is None else Watermark(partition, -1, parts=value["parts"], offset=offset)
    prepared = value.get("prepared")
    return Watermark(partition, value["resolved_ts_ms"], frozenset(prepared) if prepared is not None else None,
                     value.get("prepared_ts_ms"), value.get("parts"), offset=offset, resolved_lsn=value.get("resolved"))


def _row_problem(partition: int, event: Mapping[str, Any]) -> str | None:
    """What makes a well-formed row event one the replayer cannot apply: an operation
    it does not know, the image its operation needs missing, or another segment's event
    (whose own partition then lacks it, which its part's numbering shows)."""
    op = event["op"]
    if op not in ROW_OPS:
        return f"a row event with op {op[:10]!r}"
    image = _IMAGE_OF.get(op)
    if image is not None and not isinstance(event.get(image), dict):
        return f"a row event with op {op!r} and no {image} image"
    if event["source"]["segment"] != partition:
        return f"a row event of segment {event['source']['segment']}"
    return None


def _damage(seqs: Iterable[int], event_count: Any) -> str | None:
    """Why a part's rows are not whole, or None: a part is whole when it holds exactly
    the END's count of row events, numbered 1..count (``seqs``: its numbers, ascending)."""
    if not isinstance(event_count, int) or isinstance(event_count, bool):
        return f"its END carries no event count ({event_count!r})"
    held, absent, extra = 0, list[int](), list[int]()
    expected = 1
    for seq in seqs:
        held += 1
        if seq > event_count:
            extra.append(seq)
            continue
        if len(absent) < 1000:  # enough to name them
            absent.extend(range(expected, min(seq, expected + 1000)))
        expected = seq + 1
    if len(absent) < 1000:
        absent.extend(range(expected, min(event_count + 1, expected + 1000)))
    if held == event_count and not absent and not extra:
        return None
    what = f"it holds {held} of its {event_count} row events"
    if absent:
        what += f"; sequence numbers {_ranges(absent)} are absent"
    if extra:
        what += f"; sequence numbers {_ranges(extra[:1000])} lie past its count"
    return what


def _ranges(numbers: list[int]) -> str:
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    shown = [f"{a}" if a == b else f"{a}..{b}" for a, b in spans[:5]]
    return ", ".join(shown) + (", ..." if len(spans) > 5 else "")


def resent_content(event: Mapping[str, Any]) -> bytes:
    """A digest of what a row event says of its row, which a resend after a capture
    restart repeats (its capture time, and the transaction's flags as capture knew them
    when it sent it, may differ): two events of one sequence number that differ in it
    are damage."""
    source = event["source"]
    return hashlib.blake2b(orjson.dumps((event["op"], source.get("schema"), source.get("table"), event.get("before"),
                                         event.get("after"), event.get("unchanged"))), digest_size=16).digest()


class Spill(Protocol):
    """Where a large part's row events go instead of memory, by sequence number (a
    resend replaces); it is then the part's payload, read back in sequence order."""

    def put(self, seq: int, event: Mapping[str, Any]) -> None: ...

    def conflicting(self) -> int | None: ...  # the first sequence number put twice with different content

    def seqs(self) -> Iterator[int]: ...  # ascending

    def __iter__(self) -> Iterator[Mapping[str, Any]]: ...  # the events, by sequence number

    def __len__(self) -> int: ...


@dataclass
class _Open:
    offset: int  # of its first BEGIN
    rows: dict[int, Mapping[str, Any]] = field(default_factory=dict)  # by sequence: a resend replaces
    spill: Spill | None = None  # where its rows went once there were too many to hold
    gxid: int | None = None  # from its rows
    conflicting: int | None = None  # a sequence number met with two different rows

    def put(self, seq: int, event: Mapping[str, Any], limit: int, spill: Callable[[], Spill] | None) -> None:
        self.gxid = event["source"].get("gxid") if self.gxid is None else self.gxid
        if self.spill is not None:
            self.spill.put(seq, event)
            return
        earlier = self.rows.get(seq)
        if earlier is not None and resent_content(earlier) != resent_content(event):
            self.conflicting = seq if self.conflicting is None else min(self.conflicting, seq)
        self.rows[seq] = event
        if spill is not None and len(self.rows) > limit:
            self.spill = spill()
            for number in sorted(self.rows):
                self.spill.put(number, self.rows[number])
            self.rows = {}

    def damage(self, numbers: Iterable[int], event_count: Any) -> str | None:
        spilled = self.spill.conflicting() if self.spill is not None else None
        conflicting = [seq for seq in (self.conflicting, spilled) if seq is not None]
        if conflicting:
            return f"it holds two different row events numbered {min(conflicting)}"
        return _damage(numbers, event_count)

    def payload(self) -> tuple[Sequence[Mapping[str, Any]] | Spill, Iterable[int]]:
        """The rows in sequence order, and their sequence numbers."""
        if self.spill is not None:
            return self.spill, self.spill.seqs()
        numbers = sorted(self.rows)
        return tuple(self.rows[n] for n in numbers), numbers


class Framer:
    """Turns messages into :class:`Part`, :class:`Record` and :class:`Watermark`."""

    def __init__(self, topic_prefix: str = "", *, legacy: bool = False,
                 read: Mapping[int, int] | None = None, lsn: Mapping[int, int] | None = None,
                 spill: Callable[[], Spill] | None = None, spill_rows: int = 10_000) -> None:
        self.topic_prefix = topic_prefix
        # A part of more than spill_rows rows goes to a spill() (when given) as it comes,
        # so that memory stays bounded whatever a source transaction's size.
        self.spill, self.spill_rows = spill, spill_rows
        self.legacy = legacy  # accept parts without gxid and records without segments
        # What a run before a restart had read: per partition, the next offset and the
        # highest commit LSN. A transaction at or past that offset with a commit LSN up
        # to that one is a resend, whether or not it was applied.
        self.read_before = dict(read or {})
        self.lsn_before = dict(lsn or {})
        self.last_lsn: dict[int, int] = dict(lsn or {})  # highest commit LSN framed, per partition
        self._open: dict[tuple[int, int], _Open] = {}  # (segment, commit_lsn) -> rows so far
        self._ddl: dict[int, tuple[int, list[str]]] = {}  # gxid -> (first offset, statements)

    def feed(self, partition: int, offset: int, value: Any) -> Part | Record | Watermark | None:
        """Frame one decoded message; MalformedMessageError when it is not the protocol's."""
        problem = problem_of(value)
        if problem is None and kind_of(value) == "row":
            problem = _row_problem(partition, value)
        if problem is not None:
            raise MalformedMessageError(partition, offset, problem)
        framed = self._coordinator(offset, value) if partition == COORDINATOR else self._segment(partition, offset, value)
        if not isinstance(framed, (Part, Record)):
            return framed
        if framed.offset >= self.read_before.get(partition, 0) and framed.commit_lsn <= self.lsn_before.get(partition, -1):
            return None  # sent again after a capture restart; read (and dealt with) before ours
        self.last_lsn[partition] = max(self.last_lsn.get(partition, -1), framed.commit_lsn)
        return framed

    def _segment(self, partition: int, offset: int, value: Mapping[str, Any]) -> Part | Watermark | None:
        kind = kind_of(value)
        if kind == "row":
            source = value["source"]
            if source.get("version") != PROTOCOL_VERSION:
                raise StreamError(
                    f"the row event at offset {offset} of {self.topic_prefix}.changes partition {partition} was written "
                    f"with protocol version {source.get('version')}, and this replayer reads version {PROTOCOL_VERSION} "
                    "(version 1 wrote unchanged TOASTed values as a string that data can equal)",
                    fix="capture the pipeline again with this version of the toolkit (gpcdc bootstrap create) and "
                        "replay into a fresh target")
            key = (source["segment"], source["commit_lsn"])
            self._open.setdefault(key, _Open(offset)).put(source["seq"], value, self.spill_rows, self.spill)
            return None
        if kind == "resolved":
            return _watermark(partition, offset, value)
        if kind in ("lost", "repaired"):
            # Nothing before the mark comes any more: a transaction left without its END
            # will never have it. After a repair, the segment's LSNs are the new slot's.
            self._open = {key: opened for key, opened in self._open.items() if key[0] != partition}
        if kind == "lost":
            return Watermark(partition, -1, lost=value["reason"], offset=offset)
        if kind == "repaired":
            self.lsn_before.pop(partition, None)
            self.last_lsn.pop(partition, None)
            return Watermark(partition, -1, repaired=RepairMark(
                partition, value["number"], DistributedSnapshot(value["xmax"], frozenset(value["in_progress"])),
                value["coordinator_lsn"], offset))
        if kind == "pipeline":  # a numbered stream's marker: its numbering starts here
            return Watermark(partition, -1, parts=value["parts"], offset=offset) if value.get("parts") is not None else None
        if kind not in ("begin", "end"):
            return None
        if value["segment"] != partition:
            raise StreamError(f"partition {partition} of {self.topic_prefix}.changes holds events of segment {value['segment']}",
                              fix="replay needs a pipeline captured with the segment dispatcher (the default)")
        key = (value["segment"], value["commit_lsn"])
        self._check_unended(partition, value["commit_lsn"], offset)
        if kind == "begin":
            self._open.setdefault(key, _Open(offset))
            return None
        opened = self._open.pop(key, None) or _Open(offset)
        # A one-phase part needs no gxid (Citus's single-node commits have none); any
        # other part without one, or without the flag, was written with legacy markers.
        if (value["one_phase"] is None or (value["gxid"] is None and not value["one_phase"])) and not self.legacy:
            raise LegacyStreamError(
                f"segment {partition}'s transaction at offset {opened.offset} of {self.topic_prefix}.changes has no "
                f"{'gxid' if value['gxid'] is None else 'one-phase flag'} (legacy markers): "
                "distributed transactions cannot be rebuilt from this stream",
                fix=_LEGACY_FIX)
        rows, numbers = opened.payload()
        new = partition in self.read_before and offset >= self.read_before[partition]
        return Part(partition, value["gxid"], bool(value["one_phase"]), value["commit_lsn"], value["commit_ts_ms"], rows,
                    opened.offset, opened.damage(numbers, value.get("event_count")), value.get("number"), new)

    def _check_unended(self, segment: int, commit_lsn: int, offset: int) -> None:
        """A segment's transactions come one after another, each ended before the next
        begins; one left open below a later one lost its END (a resend after a capture
        restart starts over from an earlier transaction, never skips ahead)."""
        for (s, lsn), opened in self._open.items():
            if s == segment and lsn < commit_lsn:
                gxid = f", gxid {opened.gxid}" if opened.gxid is not None else ""
                raise StreamError(
                    f"segment {segment}'s transaction at offset {opened.offset} of {self.topic_prefix}.changes "
                    f"(commit LSN {lsn}{gxid}) has no END before the next "
                    f"transaction at offset {offset}: its rows cannot be proven whole, and nothing of it or after it "
                    "was applied", fix="restore the partition's events from capture, or bootstrap the pipeline again")

    def _coordinator(self, offset: int, value: Mapping[str, Any]) -> Record | Watermark | None:
        kind = kind_of(value)
        if kind == "resolved":
            return _watermark(COORDINATOR, offset, value)
        if kind == "lost":
            return Watermark(COORDINATOR, -1, lost=value["reason"], offset=offset)
        if kind == "ddl":
            first, statements = self._ddl.setdefault(value["gxid"], (offset, []))
            if value["statement"] not in statements:  # a resend after a capture restart
                statements.append(value["statement"])
            return None
        if kind != "commit":
            return None
        if value["segments"] is None and not self.legacy:
            raise LegacyStreamError(
                f"the commit record of gxid {value['gxid']} at offset {offset} of {self.topic_prefix}.dtx lists no "
                "segments (legacy markers): whole distributed transactions cannot be told apart from partial ones",
                fix=_LEGACY_FIX)
        first, statements = self._ddl.pop(value["gxid"], (offset, []))
        expected = value.get("ddl_count")
        if expected is not None and expected != len(statements):
            raise StreamError(
                f"the commit record of gxid {value['gxid']} at offset {offset} of {self.topic_prefix}.dtx announces "
                f"{expected} DDL records, and {len(statements)} came before it: a DDL record was lost; nothing of "
                f"gxid {value['gxid']} or after it was applied", fix="bootstrap the pipeline again")
        return Record(value["gxid"], tuple(value["segments"] or ()), value["commit_ts_ms"], tuple(statements),
                      value["commit_lsn"], first, syncpoint=value.get("syncpoint") is not None,
                      all_parts_decoded=value.get("all_parts_decoded") is True)

    def resume_offsets(self) -> dict[int, int]:
        """Per partition, the first offset of a transaction begun but not ended."""
        out: dict[int, int] = {}
        for (segment, _lsn), opened in self._open.items():
            out[segment] = min(out.get(segment, opened.offset), opened.offset)
        for first, _statements in self._ddl.values():
            out[COORDINATOR] = min(out.get(COORDINATOR, first), first)
        return out
