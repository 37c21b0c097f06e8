"""The evidence that explains differing rows (see ``_causes``), read from the pipeline's
topics, its initial snapshot, its quarantine file, the replay's settings and the
target's record of applied transactions. Read only when rows differ: the topics are
read whole, keeping only what names a differing key."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from ..bootstrap import InitialSnapshot, Pipeline
from ..broker import check_reachable
from ..cluster import Cluster
from ..config import Config
from ..connect import kafka_client_settings
from ..ingest import located, read_to_end
from ..protocol import Topics, kind_of
from ._causes import Evidence, Gap, KeyEvent, value_text
from ._checksum import ChecksumResult
from ._diff import Text


def gather_evidence(config: Config, target: Cluster, results: Sequence[ChecksumResult]) -> Evidence:
    wanted = {(r.table, row.key) for r in results for row in r.diff.rows}
    if not wanted:
        return Evidence()
    homes = {(r.table, row.key): row.source_segment for r in results for row in r.diff.rows
             if row.source_segment is not None}
    tables = {r.parts: r for r in results if r.diff.rows}
    kafka = kafka_client_settings(config)
    check_reachable(kafka, timeout=3.0)  # a broker away is said in seconds, not after a read's patience
    topics = Topics(config.kafka.topic_prefix)
    found: dict[tuple[str, Text], list[tuple[int | None, int, int, int, dict[str, str | None] | None]]] = \
        defaultdict(list)
    images: dict[tuple[str, Text], dict[str, str | None] | None] = {}
    parts: dict[int, set[int]] = defaultdict(set)
    truncated: dict[str, list[tuple[int | None, int, int, int]]] = defaultdict(list)  # table -> its truncates' parts
    seen: set[tuple[int, int, int]] = set()
    numbering = PartNumbers()
    for offset, v in _decoded(kafka, topics.changes):
        kind = kind_of(v)
        numbering.feed(kind, v, offset)
        if kind == "end" and v.get("gxid") is not None:
            parts[v["gxid"]].add(v["segment"])
        if kind != "row":
            continue
        source = v["source"]
        identity = (source["segment"], source["commit_lsn"], source["seq"])
        result = tables.get((source["schema"], source["table"]))
        if result is None or identity in seen:
            continue
        seen.add(identity)
        if v.get("op") == "t":
            truncated[result.table].append((source.get("gxid"), source["segment"], offset, source["ts_ms"]))
            continue
        for key, image in _writes(result, v, images):
            if (result.table, key) in wanted:
                images[(result.table, key)] = image
                found[(result.table, key)].append((source.get("gxid"), source["segment"], offset,
                                                    source["ts_ms"], image))
    records: dict[int, tuple[int, ...]] = {}
    for _offset, v in _decoded(kafka, topics.dtx):
        if kind_of(v) == "commit" and v.get("segments") is not None:
            records[v["gxid"]] = tuple(v["segments"])
    for table_key in wanted:
        _fold_truncates(found, table_key, truncated.get(table_key[0], ()), homes.get(table_key))
    applied = _applied(target, config.kafka.topic_prefix, {g for events in found.values() for g, *_ in events})
    events = {k: [KeyEvent(g, s, o, ts, image, g is None or g in applied) for g, s, o, ts, image in v]
              for k, v in found.items()}
    pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)
    gaps = [Gap("lost_in_stream", s, f"gxid {gxid}'s part on segment {s}, which its commit record names")
            for gxid, segments in sorted(records.items()) for s in segments if s not in parts.get(gxid, ())]
    gaps += numbering.gaps
    gaps += _set_aside(pipeline.directory / "quarantine.jsonl", topics.changes)
    statements = _skipped(pipeline.skipped_ddl_file)
    skipped = {r.table: [s for s in statements if _names(s, r.parts)] for r in tables.values()}
    return Evidence(events, _snapshot_rows(pipeline, tables, wanted), gaps,
                    {table: statements for table, statements in skipped.items() if statements})


class PartNumbers:
    """Gaps in a numbered stream's part numbers, per segment (pure): a part lost from
    its partition, one-phase ones too, which no commit record names. The numbers go up
    by one from the pipeline's marker, each END carrying its part's and each watermark
    the last one's before it; a number met again is a resend after a capture restart.
    A lost or repaired mark starts the count afresh."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}  # segment -> the last number met
        self.gaps: list[Gap] = []

    def feed(self, kind: str | None, value: Mapping[str, Any], offset: int) -> None:
        segment = value.get("segment")
        if not isinstance(segment, int):
            return
        if kind in ("lost", "repaired"):
            self.last.pop(segment, None)
            return
        number = value.get("number") if kind == "end" else value.get("parts") if kind in ("resolved", "pipeline") \
            else None
        if not isinstance(number, int) or isinstance(number, bool):
            return
        last = self.last.get(segment)
        if last is not None and number > last + (1 if kind == "end" else 0):
            first, final = last + 1, number - 1 if kind == "end" else number
            what = f"part {first}" if first == final else f"parts {first} to {final}"
            self.gaps.append(Gap("lost_in_stream", segment,
                                 f"{what} of segment {segment} (a gap in its part numbers before offset {offset}: "
                                 "one-phase parts are named by no commit record)"))
        self.last[segment] = number if last is None else max(last, number)


def _fold_truncates(found: dict[tuple[str, Text], list[tuple[int | None, int, int, int, dict[str, str | None] | None]]],
                    key: tuple[str, Text], truncates: Sequence[tuple[int | None, int, int, int]],
                    home: int | None) -> None:
    """Put the table's truncates among the key's events, as writes that leave it no row.

    A truncate has a part on every segment; the one that matters to a key is on the
    key's segment (its source row's, or its events'), where the offsets order it among
    the key's events. A key the stream never wrote takes each truncate once."""
    events = found.get(key, [])
    segment = home if home is not None else (events[-1][1] if events else None)
    if segment is not None:
        mine = [t for t in truncates if t[1] == segment]
    else:
        first: dict[int | None, tuple[int | None, int, int, int]] = {}
        for t in truncates:
            first.setdefault(t[0], t)
        mine = list(first.values())
    if not mine:
        return
    pending = sorted(mine, key=lambda t: (t[3], t[2]) if segment is None else t[2])
    merged: list[tuple[int | None, int, int, int, dict[str, str | None] | None]] = []
    for event in events:  # the key's own events keep their order; a truncate goes before the first it precedes
        while segment is not None and event[1] == segment and pending and pending[0][2] < event[2]:
            g, s, o, ts = pending.pop(0)
            merged.append((g, s, o, ts, None))
        merged.append(event)
    found[key] = merged + [(g, s, o, ts, None) for g, s, o, ts in pending]


def _decoded(kafka: Mapping[str, str], topic: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(offset, value) of every message that is a JSON object: a malformed one, which
    the replayer set aside, tells nothing here (the quarantine file names it)."""
    for message in read_to_end(kafka, topic):
        try:
            value = orjson.loads(message.value() or b"")
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            yield located(message)[1], value


def _writes(result: ChecksumResult, event: Mapping[str, Any],
            images: Mapping[tuple[str, Text], dict[str, str | None] | None]) -> list[tuple[Text, dict[str, str | None] | None]]:
    """The keys an event writes, each with the row it leaves (None: no row)."""
    op, after, before = event.get("op"), event.get("after"), event.get("before")
    out: list[tuple[Text, dict[str, str | None] | None]] = []
    if op == "d" and before:
        out.append((_key(result, before), None))
    elif op in ("c", "u") and after:
        key = _key(result, after)
        image = {c: value_text(v) for c, v in after.items()}
        if op == "u":
            if before and (old := _key(result, before)) != key:
                out.append((old, None))  # the key changed: the old key's row is gone
            elif event.get("unchanged"):  # values the WAL did not carry: as they were
                previous = images.get((result.table, key)) or {}
                image.update({c: previous.get(c) for c in event["unchanged"]})
        out.append((key, image))
    return out


def _key(result: ChecksumResult, values: Mapping[str, Any]) -> Text:
    return tuple(value_text(values.get(c)) for c in result.key_columns)


def _applied(target: Cluster, pipeline: str, gxids: set[int | None]) -> set[int]:
    from ..replay import APPLIED

    asked = sorted(g for g in gxids if g is not None)
    if not asked:
        return set()
    with target.coordinator_connection() as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (APPLIED,)).fetchone()[0]  # type: ignore[index]
    if not exists:
        return set()
    return {int(g) for (g,) in target.fetch_all(f"SELECT gxid FROM {APPLIED} WHERE pipeline = %s AND gxid = ANY(%s)",
                                                 (pipeline, asked))}


def _set_aside(quarantine: Path, topic: str) -> list[Gap]:
    if not quarantine.is_file():
        return []
    out = []
    for line in quarantine.read_bytes().splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("topic") == topic and "offset" in entry:
            out.append(Gap("set_aside", int(entry["partition"]), f"the message at offset {entry['offset']} of {topic} "
                                                                 f"partition {entry['partition']}, set aside as malformed "
                                                                 f"({str(entry.get('reason', ''))[:120]})"))
    return out


def _skipped(path: Path) -> list[str]:
    """The DDL statements replays skipped, as they kept them."""
    if not path.is_file():
        return []
    out: list[str] = []
    for line in path.read_bytes().splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            out += [s for s in entry.get("statements", []) if isinstance(s, str) and s not in out]
    return out


def _names(statement: str, parts: tuple[str, str]) -> bool:
    """Whether a DDL statement names the table (by its name, as written or quoted)."""
    return parts[1].lower() in statement.lower()


def _snapshot_rows(pipeline: Pipeline, tables: Mapping[tuple[str, str], ChecksumResult],
                   wanted: set[tuple[str, Text]]) -> dict[tuple[str, Text], dict[str, str | None]]:
    if not (pipeline.snapshot_dir / "manifest.json").is_file():
        return {}
    snapshot = InitialSnapshot(pipeline.snapshot_dir)
    out: dict[tuple[str, Text], dict[str, str | None]] = {}
    for result in tables.values():
        if result.table not in snapshot.tables:
            continue
        columns = snapshot.columns(result.table)
        for values in snapshot.rows(result.table):
            image = {c: value_text(v) for c, v in zip(columns, values)}
            key = tuple(image.get(c) for c in result.key_columns)
            if (result.table, key) in wanted:
                out[(result.table, key)] = image
    return out
