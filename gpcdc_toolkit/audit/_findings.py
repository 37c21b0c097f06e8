"""What an audit reports (one schema for every rule, the severities) and the
thresholds its rules judge by (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SEVERITIES = ("error", "warning", "info")  # most severe first

# (name, Spark SQL type), the columns of every findings DataFrame.
FINDING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rule", "string"),
    ("severity", "string"),  # error, warning or info
    ("gxid", "bigint"),  # the distributed transaction, when one is concerned
    ("segments", "array<int>"),  # the nodes concerned (-1: the coordinator)
    ("table", "string"),  # schema.table, when one is concerned
    ("evidence", "string"),  # what was seen, with the numbers
    ("topic", "string"),
    ("partition", "int"),
    ("offsets", "array<bigint>"),  # of the messages that show it, in that partition
    ("commit_ts", "timestamp"),  # source commit time of what is concerned
    ("first_seen", "timestamp"),  # Kafka time of the first message that shows it
)


@dataclass(frozen=True)
class Thresholds:
    clock_skew_ms: int = 1000  # how far one node's clock may be off another's
    silence_ms: int = 30_000  # a node with no watermark for longer is silent


FINDINGS_DDL = ", ".join(f"`{name}` {kind}" for name, kind in FINDING_COLUMNS)


def severity_rank(severity: str) -> int:
    """0 for error, 1 for warning, 2 for info."""
    if severity not in SEVERITIES:
        raise ValueError(f"unknown severity {severity!r}: use one of {', '.join(SEVERITIES)}")
    return SEVERITIES.index(severity)


def at_or_above(severity: str, threshold: str) -> bool:
    return severity_rank(severity) <= severity_rank(threshold)


def summarize(counts: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, int]]:
    """(rule, severity, count) rows from per-rule counts, most severe first, then by rule."""
    rows = [(str(c["rule"]), str(c["severity"]), int(c["count"])) for c in counts]
    return sorted(rows, key=lambda r: (severity_rank(r[1]), r[0]))


def summary_table(rows: list[tuple[str, str, int]]) -> str:
    """The summary as a plain-text table, for the terminal."""
    if not rows:
        return "no findings"
    width = max(len("rule"), *(len(r[0]) for r in rows))
    lines = [f"{'rule':<{width}}  {'severity':<8}  {'count':>9}"]
    lines += [f"{rule:<{width}}  {severity:<8}  {count:>9}" for rule, severity, count in rows]
    return "\n".join(lines)


# What to do about a finding of each rule: for reports, beside the evidence.
ADVICE: dict[str, str] = {
    "missing_part": "A segment's part is lost from the stream: do not replay past it. Check that segment's capture "
                    "worker (gpcdc status) and its slot; re-bootstrap the pipeline if the WAL is gone.",
    "lost_parts": "Parts of a segment are lost from the stream (their numbers are missing), whatever their "
                  "transactions: do not replay past them. Check that segment's capture worker (gpcdc status) and the "
                  "changes topic's retention; re-bootstrap the pipeline if the WAL is gone.",
    "covered_part": "Nothing to do: the segment was repaired (gpcdc bootstrap repair), and the replayer applies this "
                    "part's rows from the repair's copy.",
    "late_part": "Nothing to do yet: the part may still come. If it is reported again in later runs, look at the "
                 "segment's capture worker and its prepared transactions.",
    "damaged_part": "Events of a part are lost or repeated: re-capture from the slot (reset the worker to the last "
                    "acknowledged position) and check the topic's retention.",
    "orphan_part": "The coordinator's commit record is lost: check the coordinator's capture worker and the dtx "
                   "topic's retention; the replayer will not apply this transaction.",
    "awaiting_record": "Nothing to do yet: the coordinator has not reported past this commit.",
    "unlisted_part": "A part on a segment its commit record does not name: the source's markers disagree; report it "
                     "with the evidence, and do not trust the replay of this transaction.",
    "one_phase_contradiction": "A one-phase part has a commit record: the source's markers disagree; report it with "
                               "the evidence.",
    "lost_ddl_record": "DDL records are missing before a commit record: check the coordinator's capture and the dtx "
                       "topic; the target's schema may be behind.",
    "legacy_share": "The source runs without the toolkit's WAL markers: install them (see docs/protocol.md), or "
                    "accept that completeness cannot be proven (replay.legacy_per_segment replays such a stream "
                    "segment by segment).",
    "legacy_part": "A detail of legacy_share: see there.",
    "legacy_record": "A detail of legacy_share: see there.",
    "commit_lsn_backwards": "A partition holds commits out of order: check that one worker writes each node's "
                            "partition (gpcdc status) and that nothing else produces to the topic.",
    "resend_before_window": "Usually a resend: audit from the partition's start to be sure.",
    "after_watermark": "A transaction came after a watermark that had passed it: a capture worker broke the "
                       "resolved rule; report it with the evidence, and validate the target.",
    "key_order": "Two transactions wrote a key in opposite orders on a segment and the coordinator: validate the "
                 "target's table against the source.",
    "ddl_barrier": "A transaction sits on the other side of its table's DDL: validate the target's table.",
    "duplicate_events": "Normal after a capture restart: the replayer applies each transaction once.",
    "conflicting_duplicate": "Two copies of one event differ: something else writes to the topic, or a message was "
                             "damaged; do not replay past it until explained.",
    "watermark_gap": "A node was silent for a while: look at its capture worker's log for that time.",
    "lost_node": "The node changed under the pipeline (a mirror promoted, its slot dropped or invalidated): "
                 "`gpcdc status` says how. For a segment, capture it again with `gpcdc bootstrap repair --segment N` "
                 "(docs/reliability.md); otherwise bootstrap the pipeline again and replay into a fresh target.",
    "silent_node": "A node is silent now: check its capture worker (gpcdc status) and restart it.",
    "corrupt_message": "A message is not of the protocol: find its producer; the replayer stops at it.",
}


def advice(rule: str) -> str:
    """What to do about a finding of ``rule`` (an expectation's failure, or a rule)."""
    if rule.startswith("expect_"):
        return "An invariant of the stream's expectation suite failed: read the evidence, then the suite in expectations/."
    return ADVICE.get(rule, "")
