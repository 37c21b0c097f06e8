"""Fault injection: a clean captured stream made faulty, with the findings each fault
must raise (pure).

A stream is a list of :class:`Message` (what Kafka holds). :func:`inject` applies one
fault to it and returns the faulty stream and the :class:`Expected` findings, the
ground truth an audit of it must report exactly. Messages are renumbered per
partition, as a broker would have numbered them.

The clean stream must be settled: every node's last watermark well past the last
commit (so that nothing in it is late), and audited clean under the same thresholds.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from ..protocol import COORDINATOR, kind_of
from ._findings import Thresholds

FAULTS = ("drop_part", "strip_markers", "reorder_partition", "duplicate_range", "delay_segment", "drop_watermarks",
          "corrupt_message", "conflicting_pair", "drop_record", "unlist_segment", "flag_one_phase", "early_watermark",
          "conflicting_duplicate", "ddl_out_of_place")


class NoPlaceForFault(ValueError):
    """The stream has nowhere to put the fault (e.g. no two adjacent commit records that share a key)."""


@dataclass(frozen=True)
class Message:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, order=True)
class Expected:
    """A finding an audit must report: its rule, the node concerned, the gxid (if any)."""

    rule: str
    node: int
    gxid: int | None = None


@dataclass
class _Block:
    """A run of one partition's messages: a whole local transaction, or one other message."""

    messages: list[Message]
    values: list[dict[str, Any] | None]

    @property
    def end(self) -> dict[str, Any] | None:
        last = self.values[-1]
        return last if last is not None and kind_of(last) == "end" else None

    @property
    def kind(self) -> str | None:
        first = self.values[0]
        return kind_of(first) if first is not None else None

    def keys(self) -> set[tuple[Any, ...]]:
        return {(v["source"]["table"], m.key) for m, v in zip(self.messages, self.values)
                if v is not None and kind_of(v) == "row" and m.key is not None}


def _decode(value: bytes | None) -> dict[str, Any] | None:
    try:
        decoded = orjson.loads(value) if value is not None else None
    except orjson.JSONDecodeError:
        return None
    return decoded if isinstance(decoded, dict) else None


@dataclass
class _Stream:
    partitions: dict[tuple[str, int], list[_Block]] = field(default_factory=dict)
    changes: str = ""
    dtx: str = ""
    only: int | None = None  # the node a fault is to act on; None: any

    def targets(self) -> list[int]:
        """The segments a fault may act on."""
        return [s for s in self.segments() if self.only is None or s == self.only]

    @classmethod
    def of(cls, messages: Iterable[Message]) -> _Stream:
        out = cls()
        ordered = sorted(messages, key=lambda m: (m.topic, m.partition, m.offset))
        for m in ordered:
            value = _decode(m.value)
            blocks = out.partitions.setdefault((m.topic, m.partition), [])
            kind = kind_of(value) if value is not None else None
            if m.topic.endswith(".dtx"):
                out.dtx = m.topic
            else:
                out.changes = m.topic
            open_block = blocks and blocks[-1].kind == "begin" and blocks[-1].end is None
            if open_block and kind in ("row", "end"):
                blocks[-1].messages.append(m)
                blocks[-1].values.append(value)
            else:
                blocks.append(_Block([m], [value]))
        return out

    def messages(self) -> list[Message]:
        out = []
        for _key, blocks in sorted(self.partitions.items()):
            offset = 0
            for block in blocks:
                for m in block.messages:
                    out.append(replace(m, offset=offset))
                    offset += 1
        return out

    def segment(self, s: int) -> list[_Block]:
        return self.partitions[(self.changes, s)]

    def segments(self) -> list[int]:
        return sorted(p for t, p in self.partitions if t == self.changes)

    def coordinator(self) -> list[_Block]:
        return self.partitions[(self.dtx, 0)]

    def records(self) -> dict[int, dict[str, Any]]:
        return {v["gxid"]: v for b in self.coordinator() for v in b.values if v is not None and kind_of(v) == "commit"}

    def watermarks(self, node: int) -> list[dict[str, Any]]:
        blocks = self.coordinator() if node == COORDINATOR else self.segment(node)
        return [v for b in blocks if b.kind == "resolved" and (v := b.values[0]) is not None
                and v.get("resolved_ts_ms") is not None]


def node_of(topic: str, partition: int) -> int:
    """The node whose messages a partition holds (the segment dispatcher)."""
    return COORDINATOR if topic.endswith(".dtx") else partition


def _gxid(block: _Block) -> int | None:
    end = block.end
    return end["gxid"] if end is not None else None


def _ids(*gxids: int | None) -> set[int]:
    return {g for g in gxids if g is not None}


def _transactions(blocks: list[_Block]) -> list[int]:
    return [i for i, b in enumerate(blocks) if b.end is not None]


def _silence(stream: _Stream, thresholds: Thresholds) -> list[Expected]:
    """A silent_node finding per node whose watermarks, as they now stand, have a gap (or
    a tail behind the latest of any node) over the threshold."""
    nodes = [COORDINATOR, *stream.segments()]
    times = {n: [w["resolved_ts_ms"] for w in stream.watermarks(n)] for n in nodes}
    latest = max((t[-1] for t in times.values() if t), default=0)
    out = []
    for node, ts in times.items():
        gaps = sum(1 for a, b in zip(ts, ts[1:]) if b - a > thresholds.silence_ms)
        tail = 1 if ts and latest - ts[-1] > thresholds.silence_ms else 0
        out += [Expected("watermark_gap", node)] * gaps + [Expected("silent_node", node)] * tail
    return out


def _numbering(stream: _Stream, thresholds: Thresholds) -> list[Expected]:
    """On segments whose parts are numbered, what the numbers imply as
    they now stand: a lost_parts finding at each break in them (a part whose number does
    not follow the one before it, a watermark whose count of parts differs from it); and
    for each part a record lists that is not there (a part that changed nothing is never
    decoded): nothing where its absence is proven and the numbers are whole, missing where
    they are not, late where its absence is not proven yet."""
    records = stream.records()
    out = []
    for s in stream.segments():
        blocks = stream.segment(s)
        breaks, last, numbered, seen = 0, None, False, set()
        for block in blocks:
            value = block.end if block.end is not None else block.values[0]
            if value is None or value.get("number" if block.end is not None else "parts") is None:
                continue
            if block.end is not None:
                if value["commit_lsn"] in seen:
                    continue  # a part delivered again: a duplicate, not a break
                seen.add(value["commit_lsn"])
            numbered = True
            number = value["number"] if block.end is not None else value["parts"]
            if last is not None and number != (last + 1 if block.end is not None else last):
                breaks += 1
            last = number
        if not numbered:
            continue
        out += [Expected("lost_parts", s)] * breaks
        present, provable = {_gxid(b) for b in blocks}, _provable(stream, thresholds, s)
        for gxid, record in records.items():
            if s in (record.get("segments") or ()) and gxid not in present:
                if gxid not in provable:
                    out.append(Expected("late_part", s, gxid))
                elif breaks:
                    out.append(Expected("missing_part", s, gxid))
    return out


def quiet_thresholds(messages: Sequence[Message], clock_skew_ms: int = 1000) -> Thresholds:
    """Thresholds under which the clean stream has no silence: the longest gap between two
    watermarks of one node, or between a node's last and the latest of any."""
    stream = _Stream.of(messages)
    nodes = [COORDINATOR, *stream.segments()]
    times = {n: [w["resolved_ts_ms"] for w in stream.watermarks(n)] for n in nodes}
    latest = max((t[-1] for t in times.values() if t), default=0)
    longest = max([b - a for t in times.values() for a, b in zip(t, t[1:])]
                  + [latest - t[-1] for t in times.values() if t] + [0])
    return Thresholds(clock_skew_ms=clock_skew_ms, silence_ms=longest)


def inject(messages: Sequence[Message], fault: str, rng: random.Random, thresholds: Thresholds,
           avoid: set[int] | None = None, node: int | None = None) -> tuple[list[Message], list[Expected], set[int]]:
    """The stream with ``fault`` injected, the findings it must raise, and the gxids it
    touched. To mix faults without overlap, give each its own ``node`` to act on (a
    fault on one node's messages), and the gxids touched so far as ``avoid``; a delay
    goes first, since it changes what later faults can prove."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}: use one of {', '.join(FAULTS)}")
    stream = _Stream.of(messages)
    stream.only = node
    before = Counter(_silence(stream, thresholds)) + Counter(_numbering(stream, thresholds))
    expected, touched = globals()[f"_{fault}"](stream, rng, thresholds, avoid or set())
    # Silence is judged on watermarks as they end up: a fault that removes some can make
    # a node silent, and one that delays a node makes it fall behind the others. So are
    # numbered parts: a fault that breaks the numbers leaves no part a record lists
    # proven to have changed nothing.
    after = Counter(_silence(stream, thresholds)) + Counter(_numbering(stream, thresholds))
    added = [e for e in (after - before).elements() if e.gxid is None or e not in expected]
    # The transactions those findings name are touched too: a later fault must leave them
    # be, or it could take back what is expected of them (a record dropped or unlisted).
    return stream.messages(), expected + added, touched | {e.gxid for e in added if e.gxid is not None}


def _choose(rng: random.Random, candidates: Sequence[Any], fault: str) -> Any:
    if not candidates:
        raise NoPlaceForFault(f"the stream has no place for fault {fault}")
    return rng.choice(list(candidates))


def _provable(stream: _Stream, t: Thresholds, s: int) -> set[int]:
    """The gxids of two-phase transactions whose part on segment ``s``, if absent, is
    proven missing: its latest prepared list was read past their record, without them."""
    marks = [w for w in stream.watermarks(s) if w.get("prepared_ts_ms") is not None]
    if not marks:
        return set()
    last = max(marks, key=lambda w: w["prepared_ts_ms"])
    return {g for g, record in stream.records().items() if g not in last.get("prepared", [])
            and last["prepared_ts_ms"] >= record["commit_ts_ms"] + t.clock_skew_ms}


def _drop_part(stream: _Stream, rng: random.Random, t: Thresholds, avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """A segment's part of a two-phase transaction, gone: missing, once proven."""
    candidates = []
    for s in stream.targets():
        provable = _provable(stream, t, s)
        for i in _transactions(stream.segment(s)):
            end = stream.segment(s)[i].end
            assert end is not None
            if not end["one_phase"] and end["gxid"] in provable and end["gxid"] not in avoid:
                candidates.append((s, i, end["gxid"]))
    s, i, gxid = _choose(rng, candidates, "drop_part")
    del stream.segment(s)[i]
    return [Expected("missing_part", s, gxid)], {gxid}


def _strip_markers(stream: _Stream, rng: random.Random, t: Thresholds,
                   avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """Every gxid, one-phase flag and segment list removed, as legacy markers write."""
    expected = []
    for (topic, partition), blocks in stream.partitions.items():
        for block in blocks:
            for j, value in enumerate(block.values):
                if value is None:
                    continue
                kind = kind_of(value)
                if kind == "row":
                    value["source"].update(gxid=None, one_phase=None)
                elif kind in ("begin", "end"):
                    value.update(gxid=None, one_phase=None)
                elif kind == "commit":
                    value["segments"] = None
                    expected.append(Expected("legacy_record", COORDINATOR, value["gxid"]))
                    if Expected("legacy_share", COORDINATOR) not in expected:
                        expected.append(Expected("legacy_share", COORDINATOR))
                else:
                    continue
                block.messages[j] = replace(block.messages[j], value=orjson.dumps(value))
            if block.end is not None:
                expected.append(Expected("legacy_part", partition))
        if topic == stream.changes and any(b.end is not None for b in blocks):
            expected.append(Expected("legacy_share", partition))
    return expected, set()


def _reorder_partition(stream: _Stream, rng: random.Random, t: Thresholds,
                       avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """Two adjacent transactions of a segment swapped (sharing no key, neither a DDL part):
    the second now commits below the first."""
    candidates = []
    for s in stream.targets():
        blocks = stream.segment(s)
        for i in range(len(blocks) - 1):
            a, b = blocks[i], blocks[i + 1]
            if (a.end is not None and b.end is not None and a.end["event_count"] and b.end["event_count"]
                    and not (a.keys() & b.keys()) and not ({a.end["gxid"], b.end["gxid"]} & avoid)):
                candidates.append((s, i))
    s, i = _choose(rng, candidates, "reorder_partition")
    blocks = stream.segment(s)
    blocks[i], blocks[i + 1] = blocks[i + 1], blocks[i]
    late = blocks[i + 1].end
    assert late is not None and blocks[i].end is not None
    return [Expected("commit_lsn_backwards", s, late["gxid"])], {late["gxid"], blocks[i].end["gxid"]}


def _duplicate_range(stream: _Stream, rng: random.Random, t: Thresholds,
                     avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """One to three transactions of a segment delivered again later, as after a capture restart."""
    s = _choose(rng, [s for s in stream.targets() if len(_transactions(stream.segment(s))) >= 2], "duplicate_range")
    blocks = stream.segment(s)
    transactions = _transactions(blocks)
    first = rng.randrange(len(transactions) - 1)
    chosen = transactions[first:first + rng.randint(1, 3)]
    copies = [_Block(list(blocks[i].messages), list(blocks[i].values)) for i in chosen]
    at = rng.randint(chosen[-1] + 1, len(blocks))
    blocks[at:at] = copies
    return [Expected("duplicate_events", s)], _ids(*(_gxid(b) for b in copies))


def _delay_segment(stream: _Stream, rng: random.Random, t: Thresholds,
                   avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """A segment's last messages not delivered yet: its parts of recorded transactions
    are late, not missing."""
    records = stream.records()
    s = _choose(rng, [s for s in stream.targets()
                      if any(b.end is not None and b.end["gxid"] in records for b in stream.segment(s))],
                "delay_segment")
    blocks = stream.segment(s)
    recorded = [i for i in _transactions(blocks) if _gxid(blocks[i]) in records]
    cut = rng.choice(recorded[-5:])
    gone, stream.partitions[(stream.changes, s)] = blocks[cut:], blocks[:cut]
    expected, touched = [], set()
    for block in gone:
        end = block.end
        if end is not None and end["gxid"] in records and not end["one_phase"]:
            expected.append(Expected("late_part", s, end["gxid"]))
            touched.add(end["gxid"])
    return expected, touched | {b.end["gxid"] for b in gone if b.end is not None}


def _drop_watermarks(stream: _Stream, rng: random.Random, t: Thresholds,
                     avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """Every watermark of a node but its first and last, gone."""
    nodes = [n for n in [COORDINATOR, *stream.segments()]
             if (stream.only is None or n == stream.only) and len(stream.watermarks(n)) >= 3]
    node = _choose(rng, nodes, "drop_watermarks")
    key = (stream.dtx, 0) if node == COORDINATOR else (stream.changes, node)
    blocks = stream.partitions[key]
    marks = [i for i, b in enumerate(blocks)
             if b.kind == "resolved" and (v := b.values[0]) is not None and v.get("resolved_ts_ms") is not None]
    stream.partitions[key] = [b for i, b in enumerate(blocks) if i not in set(marks[1:-1])]
    return [], set()  # the silence it makes is judged by inject


def _corrupt_message(stream: _Stream, rng: random.Random, t: Thresholds,
                     avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """A row event's value cut short: not a message any more, and its part not whole."""
    candidates = [(s, i, j) for s in stream.targets() for i in _transactions(stream.segment(s))
                  for j, v in enumerate(stream.segment(s)[i].values)
                  if v is not None and kind_of(v) == "row" and _gxid(stream.segment(s)[i]) not in avoid]
    s, i, j = _choose(rng, candidates, "corrupt_message")
    block = stream.segment(s)[i]
    m = block.messages[j]
    block.messages[j] = replace(m, value=(m.value or b"")[: max(1, len(m.value or b"") // 2)])
    block.values[j] = None
    gxid = _gxid(block)
    return [Expected("corrupt_message", s), Expected("damaged_part", s, gxid)], _ids(gxid)


def _conflicting_pair(stream: _Stream, rng: random.Random, t: Thresholds,
                      avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """Two adjacent commit records of transactions that wrote one key, swapped (their
    commit LSNs too, so the coordinator's log still looks in order): every segment where
    they share a key now shows their writes against coordinator order."""
    blocks = stream.coordinator()
    keys: dict[int, dict[int, set[tuple[Any, ...]]]] = {}  # gxid -> segment -> keys
    for s in stream.segments():
        for block in stream.segment(s):
            if block.end is not None and block.end["gxid"] is not None:
                keys.setdefault(block.end["gxid"], {})[s] = block.keys()
    candidates = []
    for i in range(len(blocks) - 1):
        a, b = blocks[i].values[0], blocks[i + 1].values[0]
        if a is None or b is None or kind_of(a) != "commit" or kind_of(b) != "commit":
            continue
        if a.get("ddl_count") or b.get("ddl_count") or {a["gxid"], b["gxid"]} & avoid:
            continue
        shared = [s for s in keys.get(a["gxid"], {}) if keys[a["gxid"]][s] & keys.get(b["gxid"], {}).get(s, set())]
        if shared:
            candidates.append((i, shared))
    i, shared = _choose(rng, candidates, "conflicting_pair")
    first, second = blocks[i].values[0], blocks[i + 1].values[0]
    assert first is not None and second is not None
    first["commit_lsn"], second["commit_lsn"] = second["commit_lsn"], first["commit_lsn"]
    for block, value in ((blocks[i], first), (blocks[i + 1], second)):
        block.messages[0] = replace(block.messages[0], value=orjson.dumps(value))
    blocks[i], blocks[i + 1] = blocks[i + 1], blocks[i]
    return [Expected("key_order", s, second["gxid"]) for s in shared], {first["gxid"], second["gxid"]}


def _record_blocks(stream: _Stream, avoid: set[int], least_segments: int = 1) -> list[int]:
    """Indexes of the coordinator's commit records (of no DDL) that a fault may take."""
    out = []
    for i, block in enumerate(stream.coordinator()):
        v = block.values[0]
        if (v is not None and kind_of(v) == "commit" and not v.get("ddl_count") and v["gxid"] not in avoid
                and len(v["segments"] or ()) >= least_segments):
            out.append(i)
    return out


def _parts_of(stream: _Stream, gxid: int) -> list[tuple[int, int]]:
    """(segment, block index) of a transaction's parts."""
    out, seen = [], set()
    for s in stream.segments():
        for i in _transactions(stream.segment(s)):
            end = stream.segment(s)[i].end
            if _gxid(stream.segment(s)[i]) == gxid and (s, end["commit_lsn"]) not in seen:  # type: ignore[index]
                seen.add((s, end["commit_lsn"]))  # type: ignore[index]
                out.append((s, i))
    return out


def _rewrite(block: _Block, j: int, value: dict[str, Any]) -> None:
    block.values[j] = value
    block.messages[j] = replace(block.messages[j], value=orjson.dumps(value))


def _drop_record(stream: _Stream, rng: random.Random, t: Thresholds,
                 avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """A commit record gone: its parts are orphans once the coordinator's watermark passed them."""
    i = _choose(rng, [i for i in _record_blocks(stream, avoid) if _parts_of(stream, stream.coordinator()[i]
                                                                             .values[0]["gxid"])],  # type: ignore[index]
                "drop_record")
    record = stream.coordinator().pop(i).values[0]
    assert record is not None
    return [Expected("orphan_part", s, record["gxid"]) for s, _ in _parts_of(stream, record["gxid"])], {record["gxid"]}


def _unlist_segment(stream: _Stream, rng: random.Random, t: Thresholds,
                    avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """A segment taken off a commit record's list although its part is in the stream (a
    listed part that changed nothing, never decoded, is no candidate: there is none)."""
    blocks = stream.coordinator()
    with_parts: dict[int, list[int]] = {}  # record's block -> listed segments holding a part
    for i in _record_blocks(stream, avoid, least_segments=2):
        listed = blocks[i].values[0]
        assert listed is not None
        if present := sorted({s for s, _ in _parts_of(stream, listed["gxid"])} & set(listed["segments"])):
            with_parts[i] = present
    i = _choose(rng, sorted(with_parts), "unlist_segment")
    block = blocks[i]
    record = dict(block.values[0] or {})
    dropped = rng.choice(with_parts[i])
    _rewrite(block, 0, {**record, "segments": [s for s in record["segments"] if s != dropped]})
    return [Expected("unlisted_part", dropped, record["gxid"])], {record["gxid"]}


def _flag_one_phase(stream: _Stream, rng: random.Random, t: Thresholds,
                    avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """A two-phase part flagged one-phase: it contradicts its record, which now lacks a
    two-phase part there (proven missing in a settled stream)."""
    provable = {s: _provable(stream, t, s) for s in stream.targets()}
    candidates = [(s, i) for s in stream.targets() for i in _transactions(stream.segment(s))
                  if (g := _gxid(stream.segment(s)[i])) in provable[s] and g not in avoid]
    s, i = _choose(rng, candidates, "flag_one_phase")
    block = stream.segment(s)[i]
    for j, value in enumerate(block.values):
        if value is not None and kind_of(value) == "row":
            _rewrite(block, j, {**value, "source": {**value["source"], "one_phase": True}})
        elif value is not None and kind_of(value) == "end":
            _rewrite(block, j, {**value, "one_phase": True})
    gxid = _gxid(block)
    return [Expected("one_phase_contradiction", s, gxid), Expected("missing_part", s, gxid)], _ids(gxid)


def _early_watermark(stream: _Stream, rng: random.Random, t: Thresholds,
                     avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """A watermark moved before the transaction it had passed."""
    candidates = []
    for s in stream.targets():
        blocks = stream.segment(s)
        for i in range(len(blocks) - 1):
            end, mark = blocks[i].end, blocks[i + 1].values[0]
            if (end is not None and end["gxid"] not in avoid and blocks[i + 1].kind == "resolved"
                    and mark is not None and mark["resolved"] >= end["end_lsn"]):
                candidates.append((s, i))
    s, i = _choose(rng, candidates, "early_watermark")
    blocks = stream.segment(s)
    blocks[i], blocks[i + 1] = blocks[i + 1], blocks[i]
    gxid = _gxid(blocks[i + 1])
    return [Expected("after_watermark", s, gxid)], _ids(gxid)


def _conflicting_duplicate(stream: _Stream, rng: random.Random, t: Thresholds,
                           avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """A row event delivered again, later in its partition, with different content."""
    candidates = [(s, i, j) for s in stream.targets() for i in _transactions(stream.segment(s))
                  for j, v in enumerate(stream.segment(s)[i].values)
                  if v is not None and kind_of(v) == "row" and v["after"] and _gxid(stream.segment(s)[i]) not in avoid]
    s, i, j = _choose(rng, candidates, "conflicting_duplicate")
    blocks = stream.segment(s)
    value = blocks[i].values[j]
    assert value is not None
    changed = {**value, "after": {**value["after"], "__changed__": 1}}
    copy = _Block([replace(blocks[i].messages[j], value=orjson.dumps(changed))], [changed])
    blocks.insert(rng.randint(i + 1, len(blocks)), copy)
    gxid = _gxid(blocks[i])
    return [Expected("conflicting_duplicate", s, gxid), Expected("duplicate_events", s)], _ids(gxid)


def _ddl_out_of_place(stream: _Stream, rng: random.Random, t: Thresholds,
                      avoid: set[int]) -> tuple[list[Expected], set[int]]:
    """A segment's DDL part moved past the first two-phase transaction after it that
    writes the DDL's table: the DDL is no barrier there any more."""
    records = stream.records()
    ddl_tables = {v["gxid"]: v["statement"] for b in stream.coordinator() for v in b.values
                  if v is not None and kind_of(v) == "ddl"}
    candidates = []
    for s in stream.targets():
        blocks = stream.segment(s)
        for i, block in enumerate(blocks):
            gxid = _gxid(block)
            if gxid not in ddl_tables or gxid in avoid:
                continue
            for j in range(i + 1, len(blocks)):
                writer = _gxid(blocks[j])
                end = blocks[j].end
                if (end is not None and writer in records and not end["one_phase"] and writer not in avoid
                        and any(table in ddl_tables[gxid] for table, _key in blocks[j].keys())):
                    candidates.append((s, i, j))
                    break
    s, i, j = _choose(rng, candidates, "ddl_out_of_place")
    blocks = stream.segment(s)
    ddl, writer = blocks[i], blocks[j]
    end = ddl.end
    assert end is not None
    passed = [b for b in blocks[i + 1:j + 1] if b.kind == "resolved" and b.values[0] is not None
              and b.values[0]["resolved"] >= end["end_lsn"]]
    blocks.insert(j + 1, ddl)
    del blocks[i]
    expected = [Expected("commit_lsn_backwards", s, end["gxid"]), Expected("ddl_barrier", s, _gxid(writer))]
    if passed:
        expected.append(Expected("after_watermark", s, end["gxid"]))
    return expected, _ids(end["gxid"], _gxid(writer))
