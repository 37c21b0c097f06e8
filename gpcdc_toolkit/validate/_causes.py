"""Why a row differs (pure): each differing row explained by the pipeline's own record.

The evidence, gathered by ``_evidence``: the source events that wrote each differing
key (in source order, each with whether the replayer applied its transaction), the
initial snapshot's row of the key, what the stream lacks per source segment (parts a
commit record names that never came, messages set aside as malformed) and the DDL the
replay was told to skip. A row's cause is the first that holds of:

``skipped_ddl``
    the replay skipped DDL of the row's table (``--skip-ddl``): the target's table is
    not the source's, so its rows may not be either;
``not_replayed``
    a source transaction that wrote the key is in the stream but not applied yet: the
    target is behind (how far: how many, and the first one's commit time);
``outside_pipeline``
    everything the stream holds of the key is applied, and it leaves the row as the
    source has it (or the initial snapshot does, with no event since): the target was
    written outside the pipeline;
``lost_in_stream`` / ``set_aside``
    the stream leaves the row otherwise than the source has it, and it lacks something
    of the key's source segment (a part a commit record names; a message set aside as
    malformed): named;
``unexplained``
    none of these: what the toolkit cannot account for (a defect to report).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ._diff import DifferingRow, Text

CAUSES = ("skipped_ddl", "not_replayed", "outside_pipeline", "lost_in_stream", "set_aside", "unexplained")

# What to do about a row of each cause (None: the rows the evidence could not classify).
REMEDIES: dict[str | None, str] = {
    "skipped_ddl": "Give the target's table the change of the DDL the replay skipped (skipped_ddl.jsonl lists it), "
                   "then validate again; fix.sql makes the rows equal once the tables are alike.",
    "not_replayed": "The target is behind: let the replayer catch up (`gpcdc replay`, with capture running), then "
                    "validate again. Do not run fix.sql for these rows: the replay writes them.",
    "outside_pipeline": "Something other than the replayer wrote the target: find what (the target's logs and "
                        "grants) and stop it, then run the statements of fix.sql, which restore the source's rows.",
    "lost_in_stream": "The stream lacks a part of the row's segment: nothing after it was applied. Restore the "
                      "segment's events to the topic, or capture the segment again (`gpcdc bootstrap repair "
                      "--segment S`) and replay.",
    "set_aside": "A message of the row's segment was set aside as malformed (quarantine.jsonl names it): find what "
                 "wrote it to the topic, restore the true event, or capture the segment again "
                 "(`gpcdc bootstrap repair --segment S`).",
    "unexplained": "The pipeline's record does not account for this row: report it, with rows.parquet and the run's "
                   "directory; fix.sql restores the source's row meanwhile.",
    None: "Not classified: the pipeline's record could not be read (the detail says why); validate again once the "
          "broker answers.",
}


@dataclass(frozen=True)
class KeyEvent:
    """A source event that wrote a key: ``image`` the row after it ({column: text},
    the columns the stream carries; None: the key no longer has a row)."""

    gxid: int | None
    segment: int
    offset: int
    commit_ts_ms: int
    image: Mapping[str, str | None] | None
    applied: bool


@dataclass(frozen=True)
class Gap:
    """Something of a source segment's stream that is not there: ``cause`` is
    lost_in_stream or set_aside."""

    cause: str
    segment: int
    what: str


@dataclass(frozen=True)
class Evidence:
    events: Mapping[tuple[str, Text], Sequence[KeyEvent]] = field(default_factory=dict)  # (table, key) -> events
    snapshot: Mapping[tuple[str, Text], Mapping[str, str | None]] = field(default_factory=dict)  # initial rows
    gaps: Sequence[Gap] = ()
    skipped_ddl: Mapping[str, Sequence[str]] = field(default_factory=dict)  # table -> statements skipped


def cause_of(table: str, columns: Sequence[str], row: DifferingRow, evidence: Evidence) -> tuple[str, str]:
    """The row's cause (one of CAUSES) and a line saying what shows it."""
    if skipped := evidence.skipped_ddl.get(table):
        return "skipped_ddl", f"the replay skipped DDL of {table} ({len(skipped)}: {skipped[0][:120]!r})"
    events = evidence.events.get((table, row.key), ())
    waiting = [e for e in events if not e.applied]
    if waiting:
        first = waiting[0]
        return "not_replayed", (f"{len(waiting)} source transactions of this key are not applied yet, the first "
                                f"(gxid {first.gxid}, segment {first.segment}, offset {first.offset}) committed at "
                                f"{_time(first.commit_ts_ms)}: the target is behind")
    implied = events[-1].image if events else evidence.snapshot.get((table, row.key))
    source = None if row.source is None else dict(zip(columns, row.source))
    if _same(implied, source):
        said = (f"its last source event (gxid {events[-1].gxid}, segment {events[-1].segment}, offset "
                f"{events[-1].offset}) is applied" if events else
                "no source event wrote it since the initial snapshot, which the target loaded")
        return "outside_pipeline", f"{said} and leaves it as the source has it: the target was written outside the pipeline"
    segment = row.source_segment if row.source_segment is not None else (events[-1].segment if events else None)
    gaps = [g for g in evidence.gaps if segment is None or g.segment == segment]
    if gaps:
        return gaps[0].cause, (f"the stream leaves it otherwise than the source has it, and lacks {gaps[0].what}"
                               + (f" (and {len(gaps) - 1} more of segment {segment})" if len(gaps) > 1 else ""))
    return "unexplained", ("the stream leaves it otherwise than the source has it, and lacks nothing of its segment "
                           f"{segment}" if segment is not None else "the stream leaves it otherwise than the source")


def events_of(table: str, row: DifferingRow, evidence: Evidence) -> list[dict[str, object]]:
    """The source events that wrote the row's key, in source order, as records: gxid,
    segment, offset in its partition, commit time, and whether the replay applied it."""
    return [{"gxid": e.gxid, "segment": e.segment, "offset": e.offset, "commit_ts_ms": e.commit_ts_ms,
             "applied": e.applied} for e in evidence.events.get((table, row.key), ())]


def _same(implied: Mapping[str, str | None] | None, source: Mapping[str, str | None] | None) -> bool:
    """Whether the row the stream implies is the source's, on the columns the stream carries."""
    if implied is None or source is None:
        return implied is None and source is None
    return all(source.get(c) == v for c, v in implied.items())


def _time(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def value_text(value: object) -> str | None:
    """A stream value as PostgreSQL prints it (the stream writes integers, floats and
    booleans as JSON, everything else as PostgreSQL's text)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "t" if value else "f"
    return str(value)
