"""Where a replay stops: a sync point named, or the last one at or before a time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import orjson

from ..errors import ConfigError
from ..ingest import read_to_end
from ..protocol import Topics, kind_of


def parse_time(text: str) -> int:
    """An ISO 8601 time (UTC when it names no zone) as epoch milliseconds."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(f"--until {text!r} is not a time", fix="give an ISO 8601 time, e.g. 2026-11-26T15:04:05Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def syncpoint_before(points: Sequence[tuple[int, int]], until_ms: int) -> tuple[int, int]:
    """The last of ``points`` ((gxid, commit time in ms), in stream order) committed at
    or before ``until_ms``."""
    before = [p for p in points if p[1] <= until_ms]
    if not before:
        first = (f"; the first is {points[0][0]}, committed at {iso_time(points[0][1])}" if points
                 else "; the stream holds none")
        raise ConfigError(f"no sync point was committed at or before {iso_time(until_ms)}{first}",
                          fix="give a later --until, or take sync points (`gpcdc syncpoint`) as the source runs")
    return before[-1]


def syncpoints_in_kafka(kafka: Mapping[str, str], topics: Topics) -> list[tuple[int, int]]:
    """(gxid, commit time in ms) of the sync points the coordinator's topic holds."""
    found = []
    for message in read_to_end(kafka, topics.dtx):
        try:
            value = orjson.loads(message.value() or b"")
        except orjson.JSONDecodeError:
            continue  # not a commit record: the replay sets it aside
        if isinstance(value, dict) and kind_of(value) == "commit" and value.get("syncpoint") is not None:
            found.append((int(value["gxid"]), int(value["commit_ts_ms"])))
    return found


def iso_time(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
