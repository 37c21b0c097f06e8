"""Running an audit: the stream read (Kafka or an archive), the rules applied, what a
scheduled run carries to the next, and the findings written under the work directory.

A scheduled run (``since_last``) reads from where the previous one left off, and
reads again what was still open then: parts and records waiting for each other, a
transaction not ended yet, and each partition's last transaction and watermark (so
that order and silence are judged across the boundary). Of what it finds, it reports
what shows in a message it had not read before, and what concerns a transaction that
was open (late, awaiting its record: reported again with its new age, or now proven
missing); the rest was reported by an earlier run. Transactions met before the
window are remembered by commit LSN (the latest 20,000 per partition), so that a
capture's resend of them is a duplicate, not a commit out of order.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .._expect import load_suites
from .._runtime import read_json, write_json
from ..archive import archive_runs, read_archive
from ..archive._layout import Offsets
from ..broker import check_reachable
from ..config import Config
from ..connect import kafka_client_settings
from ..errors import ConfigError
from ..protocol import Topics
from ._expectations import validate
from ._findings import ADVICE, Thresholds, at_or_above, summarize
from ._rules import RULES, Stream, prepare, watermark_delay

col = F.col
OPEN_RULES = ("late_part", "awaiting_record")  # about transactions still open: reported again while open
CLOSING_RULES = ("missing_part", "orphan_part")  # what an open transaction can turn into
STANDING_RULES = ("silent_node",)  # about now, not about a message: reported again while true
SEEN_PER_PARTITION = 20_000


@dataclass
class AuditResult:
    findings: DataFrame  # the findings schema, most severe first
    lag: DataFrame  # per node and watermark: delay_ms
    summary: list[tuple[str, str, int]]  # (rule, severity, count)
    events: int  # messages read
    parts: DataFrame  # one row per segment part: for completeness charts
    output: Path | None = None  # where the findings were written
    window: dict[str, Any] = field(default_factory=dict)
    # Every check that ran, found something or not: (rule or expectation, "rules" or its
    # suite's name, findings).
    checks: list[tuple[str, str, int]] = field(default_factory=list)

    def worst(self) -> str | None:
        return self.summary[0][1] if self.summary else None

    def fails(self, threshold: str) -> bool:
        """Whether a finding is at or above ``threshold`` (error, warning or info)."""
        return any(at_or_above(severity, threshold) for _rule, severity, _count in self.summary)

    def figures(self) -> dict[str, Any]:
        from ._figures import figures

        return figures(self)


def thresholds_of(config: Config) -> Thresholds:
    return Thresholds(clock_skew_ms=config.audit.clock_skew_ms, silence_ms=config.audit.silence_ms)


def audit_events(events: DataFrame, thresholds: Thresholds, seen: DataFrame | None = None) -> tuple[DataFrame, Stream]:
    """Every rule's findings on ``events`` (the ingest schema, both topics), and the
    prepared stream. ``seen``: (segment, commit_lsn) of transactions read before."""
    stream = prepare(events, seen)
    findings = reduce(DataFrame.unionByName, (rule(stream, thresholds) for rule in RULES))
    return findings, stream


class AuditState:
    """What a scheduled run leaves for the next, under ``<work_dir>/audit/<prefix>/``."""

    def __init__(self, config: Config) -> None:
        self.dir = Path(config.work_dir) / "audit" / config.kafka.topic_prefix
        self.file = self.dir / "state.json"
        self.seen_dir = self.dir / "seen"

    def load(self) -> dict[str, Any]:
        if not self.file.is_file():
            return {"resume": {}, "end": {}, "open": []}
        state: dict[str, Any] = read_json(self.file)
        return state

    def offsets(self, name: str) -> Offsets:
        """``resume`` (where the next run reads from) or ``end`` (where the last one stopped)."""
        return {t: {int(p): o for p, o in parts.items()} for t, parts in self.load().get(name, {}).items()}

    def seen(self, spark: Any) -> DataFrame | None:
        if not self.seen_dir.is_dir():
            return None
        seen: DataFrame = spark.read.parquet(str(self.seen_dir))
        return seen

    def save(self, spark: Any, resume: Offsets, end: Offsets, open_gxids: list[int], seen: DataFrame) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        aside = self.dir / "seen.writing"
        shutil.rmtree(aside, ignore_errors=True)
        seen.write.parquet(str(aside))
        shutil.rmtree(self.seen_dir, ignore_errors=True)
        aside.rename(self.seen_dir)
        write_json(self.file, {name: {t: {str(p): o for p, o in parts.items()} for t, parts in offsets.items()}
                               for name, offsets in (("resume", resume), ("end", end))} | {"open": open_gxids})


def _new(findings: DataFrame, spark: Any, previous_end: Offsets, open_gxids: list[int]) -> DataFrame:
    """The findings an earlier run has not reported: shown by a message past where it
    stopped, about a transaction it left open (still open, or now proven missing or
    orphaned), or standing (a node silent now)."""
    ends = spark.createDataFrame([(t, p, o) for t, parts in previous_end.items() for p, o in parts.items()],
                                 "topic string, partition int, previous_end bigint")
    fresh = (col("previous_end").isNull() | col("offsets").isNull()
             | (F.array_max("offsets") >= col("previous_end")) | col("rule").isin(*STANDING_RULES)
             | (col("rule").isin(*OPEN_RULES, *CLOSING_RULES) & col("gxid").isin(*open_gxids)))
    return findings.join(F.broadcast(ends), ["topic", "partition"], "left").where(fresh).drop("previous_end")


def _read_kafka(spark: Any, config: Config, start: Offsets | None, start_ms: int | None,
                end_ms: int | None) -> tuple[DataFrame, Offsets]:
    from ..ingest import end_offsets
    from ..ingest.spark import read_changes, read_coordinator

    topics = Topics(config.kafka.topic_prefix)
    kafka = kafka_client_settings(config)
    check_reachable(kafka)  # one line now, rather than the client's retries
    end = {topic: end_offsets(kafka, topic) for topic in (topics.changes, topics.dtx)}
    frames = []
    for topic, reader in ((topics.changes, read_changes), (topics.dtx, read_coordinator)):
        window: dict[str, Any] = {"starting_timestamp": start_ms, "ending_timestamp": end_ms}
        if start is not None:
            window["starting_offsets"] = {p: start.get(topic, {}).get(p, -2) for p in end[topic]}
        if end_ms is None:
            window["ending_offsets"] = end[topic]
        frames.append(reader(spark, config, **window))
    return frames[0].unionByName(frames[1]), end


def _window_of_archive(events: DataFrame, start: Offsets | None, start_ms: int | None,
                       end_ms: int | None) -> tuple[DataFrame, Offsets]:
    if start:
        bounds = [(col("topic") == t) & (col("partition") == p) & (col("offset") < o)
                  for t, parts in start.items() for p, o in parts.items()]
        events = events.where(~reduce(lambda a, b: a | b, bounds))
    if start_ms is not None:
        events = events.where(col("timestamp") >= F.timestamp_millis(F.lit(start_ms)))
    if end_ms is not None:
        events = events.where(col("timestamp") < F.timestamp_millis(F.lit(end_ms)))
    ends = events.groupBy("topic", "partition").agg(F.max("offset").alias("last")).collect()
    end: Offsets = {}
    for row in ends:
        end.setdefault(row["topic"], {})[row["partition"]] = row["last"] + 1
    return events, end


def _check_window(since_last: bool, start_ms: int | None, end_ms: int | None) -> None:
    if since_last and (start_ms is not None or end_ms is not None):
        raise ConfigError("a scheduled audit (--since-last) reads from where the last one ended",
                          fix="give either --since-last or --from/--to")
    if start_ms is not None and end_ms is not None and end_ms <= start_ms:
        raise ConfigError(f"the window ends ({end_ms}) where or before it starts ({start_ms})",
                          fix="give a --to later than --from")


def check_request(config: Config, *, since_last: bool = False, start_ms: int | None = None,
                  end_ms: int | None = None, archive: Path | None = None) -> None:
    """What an audit refuses before it needs a Spark session (whose start can take half a
    minute): a window given two ways or ending where it starts, an archive with no runs,
    a broker that does not answer, a topic that does not exist, a whole stream that was
    never written (not even a bootstrap's marker: nothing would be audited)."""
    _check_window(since_last, start_ms, end_ms)
    if archive is not None:
        archive_runs(archive)
        return
    from ..ingest import end_offsets

    kafka = kafka_client_settings(config)
    check_reachable(kafka)
    topics = Topics(config.kafka.topic_prefix)
    written = [any(end_offsets(kafka, topic).values()) for topic in (topics.changes, topics.dtx)]
    if not any(written) and not since_last and start_ms is None and end_ms is None:
        raise ConfigError(f"topics {topics.changes!r} and {topics.dtx!r} were never written to, so there is nothing "
                          "to audit", fix="give the kafka.topic_prefix of a pipeline that was bootstrapped")


def run_audit(spark: Any, config: Config, *, since_last: bool = False, start_ms: int | None = None,
              end_ms: int | None = None, archive: Path | None = None, write: bool = True) -> AuditResult:
    """Audit the pipeline's stream (its Kafka topics, or ``archive``) in a window: all of
    it, ``start_ms``..``end_ms`` (Kafka time), or ``since_last`` scheduled run."""
    _check_window(since_last, start_ms, end_ms)
    suites = load_suites(Path(config.audit.expectations_dir) if config.audit.expectations_dir else None)
    state = AuditState(config)
    start = state.offsets("resume") if since_last else None
    if archive is not None:
        events, end = _window_of_archive(read_archive(spark, archive), start, start_ms, end_ms)
    else:
        events, end = _read_kafka(spark, config, start, start_ms, end_ms)
    seen = state.seen(spark) if since_last else None
    findings, stream = audit_events(events, thresholds_of(config), seen)  # the events read once, into the stream
    read = stream.events.count() + stream.duplicates.count()
    failed, outcomes = validate(stream, suites)
    findings = findings.unionByName(failed)
    if since_last:
        findings = _new(findings, spark, state.offsets("end"), state.load().get("open", []))
    ranked = F.when(col("severity") == "error", 0).when(col("severity") == "warning", 1).otherwise(2)
    # Checkpointed, not persisted: released when the result is, not kept for the session.
    findings = findings.orderBy(ranked, "rule", "first_seen", "topic", "partition").localCheckpoint()
    counts = findings.groupBy("rule", "severity").count().collect()
    summary = summarize(c.asDict() for c in counts)
    found: dict[str, int] = {}
    for rule, _severity, count in summary:
        found[rule] = found.get(rule, 0) + count
    checks = ([(rule, "rules", found.get(rule, 0)) for rule in ADVICE]
              + [(o.expectation, o.suite, found.get(o.expectation, 0)) for o in outcomes])
    result = AuditResult(findings, watermark_delay(stream), summary, read, stream.parts,
                         window={"since_last": since_last, "start_ms": start_ms, "end_ms": end_ms,
                                 "archive": str(archive) if archive else None, "end": end}, checks=checks)
    if write:
        result.output = _write(config, result)
    if since_last:
        _carry(spark, state, stream, findings, end, seen)
    return result


def _write(config: Config, result: AuditResult) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    out = Path(config.work_dir) / "audit" / config.kafka.topic_prefix / "runs" / stamp
    out.mkdir(parents=True, exist_ok=True)
    result.findings.write.parquet(str(out / "findings.parquet"))
    with (out / "findings.json").open("w") as f:
        # Spark writes the times, in the session's time zone (UTC), with their offset.
        for (line,) in result.findings.select(F.to_json(F.struct("*"), {"ignoreNullFields": "false"})).toLocalIterator():
            f.write(line + "\n")
    write_json(out / "summary.json", {"events": result.events, "window": result.window,
                                      "summary": [{"rule": r, "severity": s, "count": n}
                                                  for r, s, n in result.summary],
                                      "checks": [{"check": c, "from": f, "findings": n} for c, f, n in result.checks]})
    return out


def latest_findings(spark: Any, config: Config) -> DataFrame | None:
    """The findings of the pipeline's latest audit run written, or None when none was."""
    runs = sorted((Path(config.work_dir) / "audit" / config.kafka.topic_prefix / "runs").glob("*/findings.parquet"))
    return spark.read.parquet(str(runs[-1])) if runs else None


def _open_offsets(stream: Stream, findings: DataFrame) -> Iterable[Any]:
    """(topic, partition, offset) of what the next run must read again."""
    open_gxids = findings.where(col("rule").isin(*OPEN_RULES)).select("gxid").distinct()
    waiting_parts = stream.parts.join(open_gxids, "gxid").select("topic", "partition", "offset")
    waiting_records = (stream.records.join(open_gxids, "gxid").select("topic", "partition", "offset")
                       .unionByName(stream.ddl.join(open_gxids, "gxid").select("topic", "partition", "offset")))
    order = Window.partitionBy("topic", "partition").orderBy(col("offset").desc())
    last_parts = (stream.parts.withColumn("n", F.row_number().over(order)).where(col("n") == 1)
                  .select("topic", "partition", "offset"))
    last_marks = (stream.watermarks.withColumn("n", F.row_number().over(order)).where(col("n") == 1)
                  .select("topic", "partition", "offset"))
    return (waiting_parts.unionByName(waiting_records).unionByName(last_parts).unionByName(last_marks)
            .groupBy("topic", "partition").agg(F.min("offset").alias("offset")).collect())


def _carry(spark: Any, state: AuditState, stream: Stream, findings: DataFrame, end: Offsets,
           seen: DataFrame | None) -> None:
    resume = {t: dict(parts) for t, parts in end.items()}
    for row in _open_offsets(stream, findings):
        parts = resume.setdefault(row["topic"], {})
        parts[row["partition"]] = min(parts.get(row["partition"], row["offset"]), row["offset"])
    # Transactions before the resume point, remembered so that a resend of them is known.
    bounds = spark.createDataFrame([(t, p, o) for t, parts in resume.items() for p, o in parts.items()],
                                   "topic string, partition int, resume bigint")
    passed = (stream.parts.select("topic", "partition", "segment", "commit_lsn", "offset")
              .unionByName(stream.records.select("topic", "partition", F.lit(-1).alias("segment"), "commit_lsn",
                                                 "offset"))
              .join(bounds, ["topic", "partition"]).where(col("offset") < col("resume"))
              .select("topic", "partition", "segment", "commit_lsn"))
    if seen is not None:
        passed = passed.unionByName(seen)
    newest = Window.partitionBy("topic", "partition").orderBy(col("commit_lsn").desc())
    kept = (passed.distinct().withColumn("n", F.row_number().over(newest)).where(col("n") <= SEEN_PER_PARTITION)
            .drop("n").localCheckpoint())
    open_gxids = [r["gxid"] for r in findings.where(col("rule").isin(*OPEN_RULES) & col("gxid").isNotNull())
                  .select("gxid").distinct().collect()]
    state.save(spark, resume, end, open_gxids, kept)


def events_frame(spark: Any, messages: Iterable[Any]) -> DataFrame:
    """Messages (with topic, partition, offset, timestamp_ms, key, value, as
    :class:`._faults.Message`) as an events DataFrame, parsed as the Spark source parses."""
    import pyarrow as pa

    from ..ingest._rows import arrow_schema, to_arrow, to_row

    schema = arrow_schema()
    rows = [to_row(m.topic, m.partition, m.offset, m.timestamp_ms, m.key, m.value) for m in messages]
    table = pa.Table.from_batches([to_arrow(rows, schema)], schema=schema)
    frame: DataFrame = spark.createDataFrame(table)
    return frame
