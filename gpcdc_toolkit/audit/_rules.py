"""The audit's rules: functions from the stream's DataFrames to findings (no I/O).

:func:`prepare` turns the events of both topics (the ingest schema, one row per
message) into the tables the rules read: duplicates set apart, segment parts
(one row per local transaction), commit and DDL records, watermarks. Each rule is a
function of that :class:`Stream` and the :class:`Thresholds` to a DataFrame in the
findings schema; Spark SQL only, so that rules run where the data is.

Each rule's definition is the protocol's (docs/protocol.md) and the replayer's
(``replay/_order.py``): a part is *missing* only when its segment's latest prepared
list, read at least ``clock_skew_ms`` after the record's commit, no longer holds it;
until then it is *late*.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from ..replay._ddl_policy import locked_relations
from ._findings import FINDING_COLUMNS, FINDINGS_DDL, Thresholds

col, lit = F.col, F.lit


@dataclass(frozen=True)
class Stream:
    """The tables the rules read (see :func:`prepare`)."""

    events: DataFrame  # every message read once: duplicates removed
    duplicates: DataFrame  # the second and later copies, with the first copy's offset and hash
    parts: DataFrame  # one row per (segment, commit LSN)
    records: DataFrame  # coordinator commit records, with their position (offset) in coordinator order
    ddl: DataFrame  # coordinator DDL records
    watermarks: DataFrame  # every node's resolved watermarks
    marks: DataFrame  # the nodes' other marks, whole: pipeline markers, lost and repaired marks
    # Per partition read: whether the window holds its beginning (the pipeline marker),
    # its first offset, and the earliest source time in it (commit or resolved).
    starts: DataFrame
    # Of the events, those that are not a segment part's row, BEGIN or END, and any
    # corrupt one: few.
    unframed: DataFrame


def finding(rule: str, severity: str | Column, evidence: Column, **columns: Column | None) -> list[Column]:
    """The findings schema's columns, in order, for a select."""
    given: dict[str, Any] = {"rule": lit(rule), "severity": lit(severity) if isinstance(severity, str) else severity,
                             "evidence": evidence, **columns}
    unknown = set(given) - {name for name, _ in FINDING_COLUMNS}
    if unknown:
        raise ValueError(f"not columns of a finding: {', '.join(sorted(unknown))}")
    out = []
    for name, kind in FINDING_COLUMNS:
        value = given.get(name)
        # A column the rule leaves null, as SQL: one function call rather than a literal, a
        # cast and an alias, each of which is round trips to a local session's JVM.
        out.append(value.cast(kind).alias(name) if value is not None else F.expr(f"CAST(NULL AS {kind}) AS `{name}`"))
    return out


def _ms(column: str | Column) -> Column:
    return F.unix_millis(col(column) if isinstance(column, str) else column)


def _text(column: str | Column) -> Column:
    """A value as text for evidence, "null" for none. A column's name becomes one SQL
    expression: one function call where the column, cast, literal and coalesce are four."""
    if isinstance(column, str):
        return F.expr(f"coalesce(cast(`{column}` AS string), 'null')")
    return F.coalesce(column.cast("string"), lit("null"))


# -- preparation ------------------------------------------------------------------------

# What makes a message the same message when delivered again (docs/protocol.md):
# row events (segment, commit LSN, sequence); BEGIN and END (segment, commit LSN, kind);
# coordinator records (commit LSN, kind, statement). Watermarks and markers have none.
def _identity_seq() -> Column:
    return (F.when(col("kind") == "row", col("seq")).when(col("kind") == "begin", lit(-1))
            .when(col("kind") == "end", lit(-2)).when(col("kind") == "commit", lit(-3))
            .when(col("kind") == "ddl", lit(-4)))


_IDENTITY = ["segment", "commit_lsn", "_id_seq", "_id_text"]


def _position() -> Column:
    """Where a message is: Kafka never puts two there."""
    return F.struct("topic", "partition", "offset")


def _join_identity(frame: DataFrame, other: DataFrame, broadcast: bool) -> DataFrame:
    """``frame`` left-joined to ``other`` on the identity, null equal to null (a field a
    damaged message lacks still groups it with its copies)."""
    renamed = other.select(*[col(c).alias(f"_other{c}") if c in _IDENTITY else col(c) for c in other.columns])
    on = [frame[c].eqNullSafe(renamed[f"_other{c}"]) for c in _IDENTITY]
    joined = frame.join(F.broadcast(renamed) if broadcast else renamed, on, "left")
    return joined.drop(*[f"_other{c}" for c in _IDENTITY])


_PAYLOAD = ["kind", "gxid", "xid", "commit_ts", "op", "table_schema", "table_name", "seq", "one_phase", "key",
            "before", "after", "event_count", "end_lsn", "segments", "statement", "unchanged", "ddl_count"]


def _payload_hash() -> Column:
    values = [F.to_json(col(c)) if c in ("before", "after") else col(c) for c in _PAYLOAD]
    return F.xxhash64(*values)


# Above this many identities met more than once, the events are joined to them by a
# shuffle; below, each task holds them all (a broadcast) and the events stay where they are.
BROADCAST_REPEATS = 200_000

# A part's row events whose sequence numbers all lie in 0..63 are shown distinct by a
# 64-bit mask (see :func:`_parts`); a longer part's are compared identity by identity.
_MASKED_SEQ = 63


def _framed() -> Column:
    """A segment part's message (row, BEGIN, END): nearly all of a stream. Every other
    message (records, watermarks, marks, corrupt ones) is few."""
    return F.coalesce((col("segment") >= 0) & col("kind").isin("row", "begin", "end"), lit(False))


def prepare(events: DataFrame, seen: DataFrame | None = None) -> Stream:
    """The rules' tables from events of both topics (the ingest schema), each computed
    once, since the rules read them again and again: checkpointed where Spark keeps its
    blocks, memory then disk. ``seen``: (segment, commit_lsn) of transactions read
    before these events (by an earlier scheduled run): met again, they are duplicates.

    The events are read whole twice: into the parts, and into the few other messages.
    Only when some are copies are they read again, to set those apart (:func:`_set_apart`)."""
    identified = (events.withColumn("_id_seq", _identity_seq())
                  .withColumn("_id_text", F.coalesce(col("statement"), lit(""))).localCheckpoint())
    unframed, parts = _unframed(identified), _parts(identified).localCheckpoint()
    unique, duplicates = identified, _no_duplicates(identified)
    repeated = _repeated(identified, unframed, _unproven(parts))
    if not repeated.isEmpty() or _met_again(parts, unframed, seen):
        unique, duplicates = _set_apart(identified, repeated, seen)
        unframed, parts = _unframed(unique), _parts(unique).localCheckpoint()
    tables = (_records(unframed),
              unframed.where(col("kind") == "ddl").select("gxid", "statement", "offset", "topic", "partition",
                                                          "commit_ts", "timestamp"),
              unframed.where(col("kind") == "resolved").select("topic", "partition", "segment", "offset", "timestamp",
                                                               "resolved_lsn", "resolved_ts", "prepared", "prepared_ts",
                                                               "number"),
              unframed.where(col("kind").isin("pipeline", "lost", "repaired")),
              _starts(parts, unframed, duplicates, seen))
    records, ddl, watermarks, marks, starts = (frame.localCheckpoint() for frame in tables)
    return Stream(events=unique, duplicates=duplicates, parts=parts.drop(*_WORKING), records=records, ddl=ddl,
                  watermarks=watermarks, marks=marks, starts=starts, unframed=unframed)


def _unframed(events: DataFrame) -> DataFrame:
    return events.where(~_framed() | col("_corrupt_record").isNotNull()).localCheckpoint()


# What a copy carries besides its event's columns: its content hash, and its first copy's
# offset and content hash.
_COPY_COLUMNS = ("_hash", "_first_offset", "_first_hash")


def _no_duplicates(identified: DataFrame) -> DataFrame:
    nothing = F.lit(None).cast("bigint")
    return identified.select("*", *(nothing.alias(c) for c in _COPY_COLUMNS)).where(lit(False))


def _starts(parts: DataFrame, unframed: DataFrame, duplicates: DataFrame, seen: DataFrame | None) -> DataFrame:
    """Per partition read: whether the window holds its beginning, its first offset, its
    earliest source time. Of every message read: the parts stand for their messages, the
    other messages and the copies for themselves."""
    single = [col("topic"), col("partition"), col("offset"), F.coalesce("commit_ts", "resolved_ts").alias("ts"),
              (col("kind") == "pipeline").alias("pipeline")]
    read = (parts.select("topic", "partition", "offset", col("_first_ts").alias("ts"), lit(False).alias("pipeline"))
            .unionByName(unframed.select(*single)).unionByName(duplicates.select(*single)))
    return read.groupBy("topic", "partition").agg(
        # A window that continues a scheduled run's (``seen``) has what came before it
        # accounted for, as if read from the start.
        F.max((col("pipeline") | lit(seen is not None)).cast("int")).alias("from_start"),
        F.min("offset").alias("first_offset"),
        F.min("ts").alias("first_ts"))


def _unproven(parts: DataFrame) -> DataFrame:
    """(segment, commit_lsn) of the parts whose messages may share an identity: a part
    whose BEGINs, ENDs or row sequence numbers are not shown distinct, or a transaction
    with parts in two partitions. A part's are shown distinct by one BEGIN, one END and
    as many numbered rows as bits set in their mask: so many rows only set so many bits
    when each has a number of its own, from 0 to 63.

    Any message sharing its identity with another is in one of these parts, or is not
    framed (records and other messages): a framed message's identity can only equal
    another framed one's, or a record's through a row's negative sequence number, which
    sets no bit."""
    shown = ((col("begins") <= 1) & (col("ends") <= 1)
             & (col("_numbered_rows") == F.bit_count(F.coalesce(col("_seq_mask"), lit(0).cast("bigint")))))
    spread = parts.groupBy("segment", "commit_lsn").count().where(col("count") > 1).select("segment", "commit_lsn")
    return parts.where(~shown).select("segment", "commit_lsn").unionByName(spread).distinct().localCheckpoint()


def _repeated(identified: DataFrame, unframed: DataFrame, unproven: DataFrame) -> DataFrame:
    """The identities met more than once, each with its first message's position. Only
    the messages that may share one are compared, in narrow columns: those not framed,
    and those of the parts :func:`_unproven` names (usually none)."""
    candidates = unframed.where(col("_id_seq").isNotNull() & ~_framed())
    if not unproven.isEmpty():
        keys = unproven.select(col("segment").alias("_k_segment"), col("commit_lsn").alias("_k_lsn"))
        framed = identified.where(_framed() & col("_id_seq").isNotNull()).join(
            F.broadcast(keys) if keys.count() <= BROADCAST_REPEATS else keys,
            col("segment").eqNullSafe(col("_k_segment")) & col("commit_lsn").eqNullSafe(col("_k_lsn")), "left_semi")
        candidates = candidates.unionByName(framed)
    return (candidates.groupBy(*_IDENTITY)
            .agg(F.count(lit(1)).alias("_copies"), F.min(_position()).alias("_first"))
            .where(col("_copies") > 1).drop("_copies").localCheckpoint())


def _met_again(parts: DataFrame, unframed: DataFrame, seen: DataFrame | None) -> bool:
    """Whether a transaction an earlier scheduled run read (``seen``) is read again."""
    if seen is None:
        return False
    met = (parts.select("segment", "commit_lsn")
           .unionByName(unframed.where(col("_id_seq").isNotNull()).select("segment", "commit_lsn")))
    return not met.join(F.broadcast(seen.select("segment", "commit_lsn").distinct()), ["segment", "commit_lsn"],
                        "left_semi").isEmpty()


def _set_apart(identified: DataFrame, repeated: DataFrame, seen: DataFrame | None) -> tuple[DataFrame, DataFrame]:
    """The messages read once, and the copies (each with its first copy's offset and
    content hash). Of the messages sharing an identity (``repeated``: :func:`_repeated`),
    the first in (topic, partition, offset) order stays. A message is known by its
    position, so the events are filtered, never sorted."""
    few = repeated.count() <= BROADCAST_REPEATS
    marked = _join_identity(identified, repeated, few)
    again = col("_first").isNotNull() & (_position() != col("_first"))
    if seen is not None:
        known = seen.select("segment", "commit_lsn", lit(True).alias("_seen")).distinct()
        marked = marked.join(F.broadcast(known), ["segment", "commit_lsn"], "left")
        again = again | (col("_id_seq").isNotNull() & col("_seen").isNotNull())
    marked = marked.withColumn("_again", F.coalesce(again, lit(False)))
    is_first = F.coalesce(col("_first") == _position(), lit(False))
    copies = marked.where(col("_again") | is_first).withColumn("_hash", _payload_hash())
    firsts = copies.where(is_first).select(*_IDENTITY, col("offset").alias("_first_offset"),
                                           col("_hash").alias("_first_hash"))
    duplicates = _join_identity(copies.where(col("_again")), firsts, few)
    # In the events' own column order, whichever joins were made.
    return (marked.where(~col("_again")).select(*identified.columns).localCheckpoint(),
            duplicates.select(*identified.columns, *_COPY_COLUMNS).localCheckpoint())


# Columns of the parts that only :func:`prepare` reads.
_WORKING = ("_numbered_rows", "_seq_mask", "_first_ts")


def _parts(events: DataFrame) -> DataFrame:
    is_end, is_row = col("kind") == "end", col("kind") == "row"
    masked = is_row & col("seq").between(0, _MASKED_SEQ)
    return events.where(_framed()).groupBy("topic", "partition", "segment", "commit_lsn").agg(
        F.min("offset").alias("offset"),
        F.min("timestamp").alias("first_seen"),
        F.max(F.when(is_end, col("offset"))).alias("end_offset"),
        F.sum(is_end.cast("int")).alias("ends"),
        F.sum((col("kind") == "begin").cast("int")).alias("begins"),
        # The END's gxid and flag: row events of a part streamed before its end carry no flag.
        F.coalesce(F.max(F.when(is_end, col("gxid"))), F.max("gxid")).alias("gxid"),
        F.max(F.when(is_end, col("one_phase").cast("int"))).alias("one_phase"),
        # Legacy: no one-phase flag, or no gxid on a part that is not one-phase (a
        # one-phase part needs none: Citus's single-node commits have none).
        F.max(F.when(is_end & (col("one_phase").isNull() | (col("gxid").isNull() & ~col("one_phase"))),
                     lit(1))).alias("legacy"),
        F.max(F.when(is_end, col("event_count"))).alias("event_count"),
        F.sum((col("kind") == "row").cast("int")).alias("rows"),
        F.min("seq").alias("min_seq"),
        F.max("seq").alias("max_seq"),
        F.max("commit_ts").alias("commit_ts"),
        F.max("end_lsn").alias("end_lsn"),
        F.max(F.when(is_end, col("number"))).alias("number"),
        # Whether its rows' identities are distinct (:func:`_unproven`): the rows with a
        # sequence number, and a bit for each number from 0 to 63.
        F.count(F.when(is_row, col("seq"))).alias("_numbered_rows"),
        F.bit_or(F.when(masked, F.expr("shiftleft(CAST(1 AS BIGINT), seq)"))).alias("_seq_mask"),
        F.min(F.coalesce("commit_ts", "resolved_ts")).alias("_first_ts"),
    )


def _records(events: DataFrame) -> DataFrame:
    return events.where(col("kind") == "commit").select(
        "gxid", "segments", "commit_lsn", "commit_ts", "ddl_count", "topic", "partition", "offset",
        col("timestamp").alias("first_seen"))


def _part_offsets() -> Column:
    """Where a part begins and ends: a scheduled run reports a part once its END is new."""
    return F.array_compact(F.array(col("offset"), col("end_offset")))


def _cut(stream: Stream) -> DataFrame:
    """Partitions read from partway (no pipeline marker): what came before is unknown."""
    return stream.starts.where(col("from_start") == 0)


def _two_phase(parts: DataFrame) -> DataFrame:
    return parts.where(col("gxid").isNotNull() & (col("one_phase") == 0))


def _counts(stream: Stream) -> DataFrame:
    """Watermarks and pipeline markers of numbered segment streams: the number of the
    last part before each."""
    columns = ["segment", "topic", "partition", "offset", "number"]
    marks = stream.watermarks.select(*columns).unionByName(stream.marks.where(col("kind") == "pipeline").select(*columns))
    return marks.where(col("number").isNotNull() & (col("segment") >= 0))


def _gaps(stream: Stream) -> DataFrame:
    """Gaps in numbered segments' streams: in offset order, each part's number follows
    the number before it (a part's, or a watermark's count of the parts before it), and
    each watermark's count equals it. (segment, topic, partition, offset where noticed,
    first and last number that never arrived.)"""
    counted = (stream.parts.where(col("number").isNotNull() & (col("segment") >= 0))
               .select("segment", "topic", "partition", "offset", "number", lit(True).alias("is_part"))
               .unionByName(_counts(stream).select("segment", "topic", "partition", "offset", "number",
                                                   lit(False).alias("is_part"))))
    order = Window.partitionBy("topic", "partition").orderBy("offset")
    previous = F.lag("number").over(order)
    expected = F.when(col("is_part"), previous + 1).otherwise(previous)
    return (counted.withColumn("expected", expected)
            .where(col("expected").isNotNull() & (col("number") != col("expected")))
            .select("segment", "topic", "partition", "offset", col("expected").alias("first"),
                    F.when(col("is_part"), col("number") - 1).otherwise(col("number")).alias("last")))


def _empty_proof(stream: Stream) -> DataFrame:
    """Segments whose streams are numbered with no gap: a listed part proven absent
    there changed nothing (it was never decoded), rather than lost."""
    numbered = _counts(stream).select("segment").distinct()
    return numbered.join(_gaps(stream).select("segment").distinct(), "segment", "left_anti").withColumn(
        "gap_free", lit(True))


def _latest_watermarks(stream: Stream) -> DataFrame:
    """Per node: its latest resolved time, and its latest prepared list with the time it was read."""
    return stream.watermarks.groupBy("segment").agg(
        F.max("resolved_ts").alias("resolved_ts"),
        F.max_by("prepared", "prepared_ts").alias("prepared"),
        F.max("prepared_ts").alias("prepared_ts"))


def _no_findings(stream: Stream) -> DataFrame:
    """An empty DataFrame of the findings schema: for a rule that finds it has nothing to look at."""
    return stream.events.sparkSession.createDataFrame([], FINDINGS_DDL)


# -- rules ------------------------------------------------------------------------------

def corrupt_messages(stream: Stream, t: Thresholds) -> DataFrame:
    bad = stream.unframed.where(col("_corrupt_record").isNotNull() | col("kind").isNull())
    return bad.select(finding(
        "corrupt_message", "error",
        F.concat(lit("not a protocol message: "), F.substring(F.coalesce(col("_corrupt_record"), lit("")), 1, 120)),
        segments=F.array(F.when(col("topic").endswith(".dtx"), lit(-1)).otherwise(col("partition"))),
        topic=col("topic"), partition=col("partition"), offsets=F.array(col("offset")),
        first_seen=col("timestamp")))


def lost_nodes(stream: Stream, t: Thresholds) -> DataFrame:
    """A node whose capture stopped for good because it changed under the pipeline (a
    mirror promoted, its slot dropped or invalidated): what it committed after its slot's
    acknowledged position is not in the stream."""
    lost = stream.marks.where(col("kind") == "lost").join(
        _repairs(stream).select("segment", "repair", "repaired_at"), "segment", "left")
    repaired = col("repair").isNotNull() & (col("repaired_at") > col("offset"))
    return lost.select(finding(
        "lost_node", F.when(repaired, lit("warning")).otherwise(lit("error")),
        F.concat(lit("node "), col("segment").cast("string"), lit(" is lost to the pipeline: its capture stopped for "
                                                                  "good at this mark, and what it committed later was "
                                                                  "never captured"),
                 F.when(repaired, F.concat(lit("; repair "), _text("repair"), lit(" (offset "), _text("repaired_at"),
                                           lit(") captures it again: its part of every transaction the repair's cut "
                                               "saw is in the repair's copy of its rows, not in the stream")))
                 .otherwise(lit(""))),
        segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("offset")), first_seen=col("timestamp")))


def damaged_parts(stream: Stream, t: Thresholds) -> DataFrame:
    """A part whose rows do not match its END (count, sequence 1..count), or with no END
    although a later transaction follows it in its partition (and no lost or repaired
    mark between them)."""
    order = Window.partitionBy("topic", "partition").orderBy("offset")
    parts = (stream.parts.withColumn("next_offset", F.lead("offset").over(order))
             .withColumn("previous_offset", F.lag("offset").over(order))
             .join(stream.starts.select("topic", "partition", "from_start"), ["topic", "partition"]))
    # The first part of a window read from partway may have begun before it: its rows
    # are not all here, which proves nothing.
    parts = parts.where(~((col("from_start") == 0) & col("previous_offset").isNull() & (col("begins") == 0)))
    parts = parts.join(F.broadcast(_cut_off(stream)), ["topic", "partition", "offset"], "left")
    unended = (col("ends") == 0) & col("next_offset").isNotNull() & col("cut_off").isNull()
    uncounted = (col("ends") > 0) & col("event_count").isNull()
    short = (col("ends") > 0) & col("event_count").isNotNull() & (
        (col("rows") != col("event_count")) | ((col("rows") > 0) & (
            (col("min_seq") != 1) | (col("max_seq") != col("event_count")))))
    what = (F.when(unended, F.concat(lit("has no END before the next transaction at offset "), _text("next_offset")))
            .when(uncounted, lit("its END carries no event count"))
            .otherwise(F.concat(lit("holds "), _text("rows"), lit(" of its "), _text("event_count"),
                                lit(" row events (sequence numbers "), _text("min_seq"), lit(".."), _text("max_seq"),
                                lit(")"))))
    return parts.where(unended | uncounted | short).select(finding(
        "damaged_part", "error",
        F.concat(lit("segment "), _text("segment"), lit("'s transaction at offset "), _text("offset"),
                 lit(" (commit LSN "), _text("commit_lsn"), lit(", gxid "), _text("gxid"), lit(") "), what),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.when(unended, F.array(col("offset"), col("next_offset"))).otherwise(_part_offsets()),
        commit_ts=col("commit_ts"), first_seen=col("first_seen")))


def _cut_off(stream: Stream) -> DataFrame:
    """Parts a lost or repaired mark cut off before their END (``cut_off``; a few, if
    any): a mark ends what came before it in its partition, so the part just before it
    never gets its END (a worker killed after the rows). The replayer drops such rows
    at the mark; they are the node's loss (lost_node), not damage."""
    marks = F.broadcast(stream.marks.where(col("kind").isin("lost", "repaired"))
                        .select("topic", "partition", col("offset").alias("mark_offset")))
    last_before = (stream.parts.select("topic", "partition", "offset", "ends").join(marks, ["topic", "partition"])
                   .where(col("offset") < col("mark_offset"))
                   .groupBy("topic", "partition", "mark_offset").agg(F.max(F.struct("offset", "ends")).alias("last")))
    return (last_before.where(col("last.ends") == 0)
            .select("topic", "partition", col("last.offset").alias("offset")).distinct()
            .withColumn("cut_off", lit(True)))


def missing_parts(stream: Stream, t: Thresholds) -> DataFrame:
    """Parts a commit record lists that have not arrived: missing when proven, else late."""
    expected = stream.records.where(col("segments").isNotNull()).select(
        "gxid", "segments", "commit_ts", "topic", "partition", "offset", "first_seen",
        F.explode("segments").alias("segment"))
    present = _two_phase(stream.parts)
    absent = expected.join(present.select("gxid", "segment"), ["gxid", "segment"], "left_anti").localCheckpoint()
    if absent.isEmpty():  # the usual window: every listed part arrived, nothing more to ask
        return _no_findings(stream)
    # What is said of an absent part's transaction is looked up for those transactions
    # alone (usually none), not computed for every transaction and joined.
    concerned = absent.select("gxid").distinct()
    arrived = (present.join(concerned, "gxid", "left_semi").groupBy("gxid")
               .agg(F.array_sort(F.collect_list("segment")).alias("arrived")))
    latest = _latest_watermarks(stream)
    # A part commits after its record; on a segment read from partway, one whose record
    # is not clear of the window's start may lie before it.
    cut = _cut(stream).where(~col("topic").endswith(".dtx")).select(
        col("partition").alias("segment"), col("first_ts").alias("segment_from"))
    # A part that is there but not as a two-phase part (flagged one-phase) changed something.
    flagged = (stream.parts.join(concerned, "gxid", "left_semi").select("gxid", "segment").distinct()
               .withColumn("flagged", lit(True)))
    rows = (absent.join(arrived, "gxid", "left").join(latest, "segment", "left").join(cut, "segment", "left")
            .join(_empty_proof(stream), "segment", "left").join(flagged, ["gxid", "segment"], "left")
            .join(_lost(stream), "segment", "left")
            .join(_repairs(stream).select("segment", "repair", "repaired_at", "cut_xmax", "cut_running"), "segment",
                  "left"))
    before_window = col("segment_from").isNotNull() & (
        _ms("commit_ts") - t.clock_skew_ms < _ms("segment_from"))
    # A repair's copy holds the segment's part of every transaction its cut saw.
    covered = col("repair").isNotNull() & (col("gxid") < col("cut_xmax")) & ~F.array_contains(
        F.coalesce(col("cut_running"), F.array()), col("gxid"))
    # A lost mark ends its segment's partition: a part not before it never comes (unless
    # a repair captures the segment again).
    lost = col("lost_at").isNotNull() & (col("repair").isNull() | (col("repaired_at") < col("lost_at"))) & ~before_window
    proven = lost | (col("prepared_ts").isNotNull()
                     & ~F.array_contains(F.coalesce(col("prepared"), F.array()), col("gxid"))
                     & (_ms("prepared_ts") >= _ms("commit_ts") + t.clock_skew_ms) & ~before_window)
    still_prepared = F.array_contains(F.coalesce(col("prepared"), F.array()), col("gxid"))
    head = F.concat(lit("gxid "), _text("gxid"), lit("'s commit record lists segments "), F.to_json("segments"),
                    lit("; the part of segment "), _text("segment"), lit(" has not arrived (arrived: "),
                    F.coalesce(F.to_json("arrived"), lit("[]")), lit(")"))
    why = (F.when(lost, F.concat(lit(", and segment "), _text("segment"), lit(" is lost to the pipeline: it never "
                                                                               "comes")))
           .when(proven, F.concat(lit(", and segment "), _text("segment"), lit("'s prepared list of "),
                                   _text("prepared_ts"), lit(" no longer holds it")))
           .when(before_window, F.concat(lit("; segment "), _text("segment"), lit("'s part may lie before the "
                                                                                  "window read, which starts at "),
                                         _text("segment_from")))
           .when(still_prepared, F.concat(lit("; segment "), _text("segment"), lit(" still held it prepared at "),
                                          _text("prepared_ts")))
           .otherwise(F.concat(lit("; late by "), _text(_ms("resolved_ts") - _ms("commit_ts")),
                               lit(" ms of segment "), _text("segment"), lit("'s watermark, no prepared list "
                                                                             "after the commit yet"))))
    changed_nothing = proven & ~lost & F.coalesce(col("gap_free"), lit(False)) & col("flagged").isNull()
    missing = rows.where(~changed_nothing & ~covered).select(finding(
        "missing_part", F.when(proven, lit("error")).otherwise(lit("info")), F.concat(head, why),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("offset")), commit_ts=col("commit_ts"), first_seen=col("first_seen"))
    ).withColumn("rule", F.when(col("severity") == "error", lit("missing_part")).otherwise(lit("late_part")))
    in_copy = rows.where(covered).select(finding(
        "covered_part", "info", F.concat(head, lit("; it is in repair "), _text("repair"), lit("'s copy of segment "),
                                         _text("segment"), lit("'s rows")),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("offset")), commit_ts=col("commit_ts"), first_seen=col("first_seen")))
    return missing.unionByName(in_copy)


def _repairs(stream: Stream) -> DataFrame:
    """The latest repaired mark of each repaired segment: ``repair`` (its number), the
    cut's xmax (``cut_xmax``) and running gxids (``cut_running``), ``repaired_at`` (its offset)."""
    marks = stream.marks.where(col("kind") == "repaired")
    latest = Window.partitionBy("segment").orderBy(col("number").desc())
    return (marks.withColumn("rank", F.row_number().over(latest)).where(col("rank") == 1)
            .select("segment", col("number").alias("repair"), col("gxid").alias("cut_xmax"),
                    col("prepared").alias("cut_running"), col("offset").alias("repaired_at")))


def _lost(stream: Stream) -> DataFrame:
    """The segments whose capture stopped for good (a lost mark): ``lost_at``, the latest
    mark's offset."""
    return stream.marks.where(col("kind") == "lost").groupBy("segment").agg(F.max("offset").alias("lost_at"))


def orphan_parts(stream: Stream, t: Thresholds) -> DataFrame:
    """Two-phase parts with no commit record: lost once the coordinator's watermark has
    passed the part's commit (the record is written before any segment commits), else
    waiting for it."""
    orphans = _two_phase(stream.parts).join(stream.records.select("gxid"), "gxid", "left_anti")
    # An aggregate with no grouping has one row, null when the coordinator sent no watermark.
    coordinator = stream.watermarks.where(col("segment") == -1).agg(F.max("resolved_ts").alias("coordinator_ts"))
    # Read from partway, the coordinator's window may lack any part's record: a record
    # is written before its parts commit, but how long before has no bound (a part can
    # stay prepared).
    cut = _cut(stream).where(col("topic").endswith(".dtx")).agg(F.count(lit(1)).alias("coordinator_cut"))
    rows = orphans.crossJoin(coordinator).crossJoin(cut)
    before_window = col("coordinator_cut") > 0
    proven = (col("coordinator_ts").isNotNull() & (_ms("coordinator_ts") >= _ms("commit_ts") + t.clock_skew_ms)
              & ~before_window)
    return rows.select(finding(
        "orphan_part", F.when(proven, lit("error")).otherwise(lit("info")),
        F.concat(lit("segment "), _text("segment"), lit("'s two-phase part of gxid "), _text("gxid"),
                 lit(" at offset "), _text("offset"), lit(" has no commit record"),
                 F.when(proven, F.concat(lit(", and the coordinator's watermark of "), _text("coordinator_ts"),
                                         lit(" has passed its commit")))
                 .when(before_window, lit(" in the window read; it may lie before it"))
                 .otherwise(lit(" yet"))),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=_part_offsets(), commit_ts=col("commit_ts"), first_seen=col("first_seen"))
    ).withColumn("rule", F.when(col("severity") == "error", lit("orphan_part")).otherwise(lit("awaiting_record")))


def unlisted_parts(stream: Stream, t: Thresholds) -> DataFrame:
    records = stream.records.where(col("segments").isNotNull()).select(
        "gxid", "segments", col("offset").alias("record_offset"))
    rows = _two_phase(stream.parts).join(records, "gxid").where(~F.array_contains("segments", col("segment")))
    return rows.select(finding(
        "unlisted_part", "error",
        F.concat(lit("gxid "), _text("gxid"), lit(" has a part on segment "), _text("segment"), lit(" at offset "),
                 _text("offset"), lit(", but its commit record at offset "), _text("record_offset"),
                 lit(" lists segments "), F.to_json("segments")),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=_part_offsets(), commit_ts=col("commit_ts"), first_seen=col("first_seen")))


def one_phase_contradictions(stream: Stream, t: Thresholds) -> DataFrame:
    """A part flagged one-phase whose transaction has a commit record anyway."""
    records = stream.records.select("gxid", "segments", col("offset").alias("record_offset"))
    rows = stream.parts.where(col("one_phase") == 1).join(records, "gxid")
    return rows.select(finding(
        "one_phase_contradiction", "error",
        F.concat(lit("segment "), _text("segment"), lit("'s part of gxid "), _text("gxid"), lit(" at offset "),
                 _text("offset"), lit(" is flagged one-phase, but the transaction has a commit record at offset "),
                 _text("record_offset"), lit(" listing segments "), F.coalesce(F.to_json("segments"), lit("null"))),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=_part_offsets(), commit_ts=col("commit_ts"), first_seen=col("first_seen")))


def lost_ddl_records(stream: Stream, t: Thresholds) -> DataFrame:
    counts = stream.ddl.groupBy("gxid").agg(F.count(lit(1)).alias("arrived"))
    # A transaction's DDL records come right before its commit record: read from partway,
    # those of a record near the start may lie before the window.
    cut = _cut(stream).select("topic", "partition", "first_offset")
    rows = (stream.records.where(col("ddl_count").isNotNull()).join(counts, "gxid", "left")
            .join(cut, ["topic", "partition"], "left")
            .where(col("first_offset").isNull() | (col("offset") - col("ddl_count") >= col("first_offset")))
            .where(F.coalesce(col("arrived"), lit(0)) != col("ddl_count")))
    return rows.select(finding(
        "lost_ddl_record", "error",
        F.concat(lit("the commit record of gxid "), _text("gxid"), lit(" at offset "), _text("offset"),
                 lit(" announces "), _text("ddl_count"), lit(" DDL records, and "),
                 _text(F.coalesce(col("arrived"), lit(0))), lit(" arrived")),
        gxid=col("gxid"), segments=F.array(lit(-1)), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("offset")), commit_ts=col("commit_ts"), first_seen=col("first_seen")))


def legacy_markers(stream: Stream, t: Thresholds) -> DataFrame:
    """A stream written without the markers that tell a one-phase transaction from a part
    whose record is lost: one warning per node (legacy_share: how many of its parts or
    records lack which marker, and their share), and each such part and record as a detail
    (legacy_part, legacy_record: info), so that the findings list the same truth once per
    node rather than once per transaction."""
    legacy = stream.parts.where(col("legacy") == 1)
    marker = F.when(col("gxid").isNull(), lit("no gxid (the segment wrote no gpcdc.gxid marker)")).otherwise(
        lit("no one-phase flag (the segment wrote no gpcdc.one_phase marker)"))
    parts = legacy.select(finding(
        "legacy_part", "info",
        F.concat(lit("segment "), _text("segment"), lit("'s transaction at offset "), _text("offset"),
                 lit(" (commit LSN "), _text("commit_lsn"), lit(") has "), marker,
                 lit(": it cannot be told from a part whose commit record is lost, nor ordered")),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=_part_offsets(), commit_ts=col("commit_ts"), first_seen=col("first_seen")))
    is_legacy = F.coalesce(col("legacy"), lit(0)) == 1
    share = stream.parts.groupBy("topic", "partition", "segment").agg(
        F.sum(is_legacy.cast("int")).alias("legacy"), F.count(lit(1)).alias("parts"),
        F.sum((is_legacy & col("gxid").isNull()).cast("int")).alias("no_gxid"),
        F.min(F.when(is_legacy, col("offset"))).alias("offset"),
        F.min(F.when(is_legacy, col("first_seen"))).alias("first_seen")).where(col("legacy") > 0)
    shares = share.select(finding(
        "legacy_share", "warning",
        F.concat(lit("segment "), _text("segment"), lit(": "), _text("legacy"), lit(" of its "), _text("parts"),
                 lit(" transactions ("), F.format_number(col("legacy") * 100.0 / col("parts"), 1),
                 lit("%) cannot be ordered or proven whole: "), _text("no_gxid"),
                 lit(" carry no gxid (no gpcdc.gxid marker), "), _text(col("legacy") - col("no_gxid")),
                 lit(" no one-phase flag (no gpcdc.one_phase marker); the first at offset "), _text("offset"),
                 lit(", each listed as legacy_part")),
        segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("offset")), first_seen=col("first_seen")))
    unlisted = stream.records.where(col("segments").isNull())
    records = unlisted.select(finding(
        "legacy_record", "info",
        F.concat(lit("the commit record of gxid "), _text("gxid"), lit(" at offset "), _text("offset"),
                 lit(" lists no segments (written without the segment list): its parts cannot be proven whole")),
        gxid=col("gxid"), segments=F.array(lit(-1)), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("offset")), commit_ts=col("commit_ts"), first_seen=col("first_seen")))
    record_share = stream.records.groupBy("topic", "partition").agg(
        F.sum(col("segments").isNull().cast("int")).alias("legacy"), F.count(lit(1)).alias("records"),
        F.min(F.when(col("segments").isNull(), col("offset"))).alias("offset"),
        F.min(F.when(col("segments").isNull(), col("first_seen"))).alias("first_seen")).where(col("legacy") > 0)
    record_shares = record_share.select(finding(
        "legacy_share", "warning",
        F.concat(lit("the coordinator: "), _text("legacy"), lit(" of its "), _text("records"),
                 lit(" commit records list no segments (no segment list in the gpcdc.commit marker): their "
                     "transactions cannot be proven whole; the first at offset "), _text("offset"),
                 lit(", each listed as legacy_record")),
        segments=F.array(lit(-1)), topic=col("topic"), partition=col("partition"), offsets=F.array(col("offset")),
        first_seen=col("first_seen")))
    return parts.unionByName(shares).unionByName(records).unionByName(record_shares)


def commit_order(stream: Stream, t: Thresholds) -> DataFrame:
    """A commit LSN lower than the one before it in its partition: a partition holds its
    node's commits in commit order (resends were set apart as duplicates)."""
    parts = stream.parts.select("topic", "partition", "segment", "gxid", "commit_lsn", "commit_ts", "offset",
                                "first_seen")
    records = stream.records.select("topic", "partition", lit(-1).alias("segment"), "gxid", "commit_lsn",
                                    "commit_ts", "offset", "first_seen")
    order = Window.partitionBy("topic", "partition").orderBy("offset")
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    rows = (parts.unionByName(records).withColumn("prev_lsn", F.lag("commit_lsn").over(order))
            .withColumn("prev_offset", F.lag("offset").over(order))
            .withColumn("lowest_before", F.min("commit_lsn").over(before))
            .where(col("prev_lsn") > col("commit_lsn"))
            .join(stream.starts.select("topic", "partition", "from_start"), ["topic", "partition"]))
    # Read from partway, a commit below every one before it in the window may be a
    # capture's resend of one before the window: that cannot be told without it.
    unknowable = (col("from_start") == 0) & (col("commit_lsn") < col("lowest_before"))
    return rows.select(finding(
        "commit_lsn_backwards", F.when(unknowable, lit("info")).otherwise(lit("error")),
        F.concat(lit("node "), _text("segment"), lit("'s commit at offset "), _text("offset"), lit(" (commit LSN "),
                 _text("commit_lsn"), lit(", gxid "), _text("gxid"), lit(") comes after one with commit LSN "),
                 _text("prev_lsn"), lit(" at offset "), _text("prev_offset"),
                 F.when(unknowable, lit(", and below every commit before it in the window: perhaps a resend of "
                                        "one before the window (read the partition from its start to tell)"))
                 .otherwise(lit(""))),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("prev_offset"), col("offset")), commit_ts=col("commit_ts"), first_seen=col("first_seen"))
    ).withColumn("rule", F.when(col("severity") == "info", lit("resend_before_window"))
                 .otherwise(lit("commit_lsn_backwards")))


def after_watermark(stream: Stream, t: Thresholds) -> DataFrame:
    """A transaction after a watermark of its segment that had passed its commit."""
    marks = stream.watermarks.where(col("segment") >= 0).select(
        "topic", "partition", "offset", col("resolved_lsn").alias("passed"))
    parts = stream.parts.where(col("end_lsn").isNotNull()).select(
        "topic", "partition", "offset", "end_offset", "segment", "gxid", "commit_lsn", "end_lsn", "commit_ts",
        "first_seen")
    before = Window.partitionBy("topic", "partition").orderBy("offset").rowsBetween(Window.unboundedPreceding, -1)
    rows = (parts.unionByName(marks, allowMissingColumns=True)
            .withColumn("passed_before", F.max("passed").over(before))
            .where(col("end_lsn").isNotNull() & (col("passed_before") >= col("end_lsn"))))
    return rows.select(finding(
        "after_watermark", "error",
        F.concat(lit("segment "), _text("segment"), lit("'s transaction at offset "), _text("offset"),
                 lit(" (gxid "), _text("gxid"), lit(", commit ending at LSN "), _text("end_lsn"),
                 lit(") comes after a watermark that had resolved LSN "), _text("passed_before")),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=_part_offsets(), commit_ts=col("commit_ts"), first_seen=col("first_seen")))


def _positions(stream: Stream) -> DataFrame:
    """Each two-phase transaction's place in coordinator order: its record's offset."""
    return stream.records.select("gxid", col("offset").alias("position"))


def key_order(stream: Stream, t: Thresholds) -> DataFrame:
    """Two two-phase transactions writing one key on one segment, in the opposite of their
    coordinator order (invariant 4); one finding per pair and segment."""
    rows = (stream.events.where((col("kind") == "row") & col("key").isNotNull() & col("gxid").isNotNull())
            .select("topic", "partition", "segment", "table_schema", "table_name", "key", "gxid", "offset",
                    "commit_ts", "timestamp")
            .join(_positions(stream), "gxid"))
    versions = Window.partitionBy("segment", "table_schema", "table_name", "key").orderBy("offset")
    pairs = (rows.withColumn("prev_gxid", F.lag("gxid").over(versions))
             .withColumn("prev_position", F.lag("position").over(versions))
             .withColumn("prev_offset", F.lag("offset").over(versions))
             .where((col("prev_gxid") != col("gxid")) & (col("prev_position") > col("position"))))
    grouped = pairs.groupBy("topic", "partition", "segment", "prev_gxid", "gxid").agg(
        F.count(lit(1)).alias("keys"), F.min("prev_offset").alias("prev_offset"), F.min("offset").alias("offset"),
        F.first(F.concat_ws(".", "table_schema", "table_name")).alias("table"), F.first("key").alias("key"),
        F.min("prev_position").alias("prev_position"), F.min("position").alias("position"),
        F.min("commit_ts").alias("commit_ts"), F.min("timestamp").alias("first_seen"))
    return grouped.select(finding(
        "key_order", "error",
        F.concat(lit("on segment "), _text("segment"), lit(", gxid "), _text("prev_gxid"), lit(" wrote key "),
                 col("key"), lit(" of "), col("table"), lit(" (offset "), _text("prev_offset"), lit(") before gxid "),
                 _text("gxid"), lit(" (offset "), _text("offset"), lit("), but the coordinator committed gxid "),
                 _text("gxid"), lit(" first (records at offsets "), _text("position"), lit(" and "),
                 _text("prev_position"), lit("); "), _text("keys"), lit(" key(s) in all")),
        gxid=col("gxid"), segments=F.array(col("segment")), table=col("table"), topic=col("topic"),
        partition=col("partition"), offsets=F.array(col("prev_offset"), col("offset")), commit_ts=col("commit_ts"),
        first_seen=col("first_seen")))


def ddl_barriers(stream: Stream, t: Thresholds) -> DataFrame:
    """A two-phase transaction writing a table on the other side of a DDL of that table
    on a segment from where the coordinator put it (a DDL locks its table, so every
    writer of it is ordered with it the same way on every segment)."""
    spark = stream.events.sparkSession
    statements = stream.ddl.select("gxid", "statement").collect()  # few: one per DDL statement
    named = [(r["gxid"], schema or "public", name) for r in statements for schema, name in locked_relations(r["statement"])]
    if not named:  # the usual window: no table's DDL, so no writer to place against one
        return _no_findings(stream)
    ddl = spark.createDataFrame(named, "ddl_gxid bigint, table_schema string, table_name string").distinct()
    positions = _positions(stream)
    ddl_parts = (ddl.join(stream.parts.select(col("gxid").alias("ddl_gxid"), "segment",
                                              col("offset").alias("ddl_offset")), "ddl_gxid")
                 .join(positions.select(col("gxid").alias("ddl_gxid"), col("position").alias("ddl_position")),
                       "ddl_gxid"))
    writers = (stream.events.where(col("kind") == "row").join(F.broadcast(ddl.select("table_schema", "table_name")
                                                                           .distinct()), ["table_schema", "table_name"])
               .groupBy("topic", "partition", "segment", "gxid", "table_schema", "table_name")
               .agg(F.min("offset").alias("offset"), F.min("commit_ts").alias("commit_ts"),
                    F.min("timestamp").alias("first_seen"))
               .join(positions, "gxid"))
    rows = (writers.join(ddl_parts, ["segment", "table_schema", "table_name"])
            .where((col("gxid") != col("ddl_gxid"))
                   & ((col("offset") < col("ddl_offset")) != (col("position") < col("ddl_position")))))
    return rows.select(finding(
        "ddl_barrier", "error",
        F.concat(lit("on segment "), _text("segment"), lit(", gxid "), _text("gxid"), lit(" writes "),
                 F.concat_ws(".", "table_schema", "table_name"), lit(" at offset "), _text("offset"),
                 F.when(col("offset") < col("ddl_offset"), lit(" before")).otherwise(lit(" after")),
                 lit(" the DDL of gxid "), _text("ddl_gxid"), lit(" (offset "), _text("ddl_offset"),
                 lit("), but the coordinator committed it "),
                 F.when(col("position") < col("ddl_position"), lit("before")).otherwise(lit("after")), lit(" it")),
        gxid=col("gxid"), segments=F.array(col("segment")), table=F.concat_ws(".", "table_schema", "table_name"),
        topic=col("topic"), partition=col("partition"), offsets=F.array(col("ddl_offset"), col("offset")),
        commit_ts=col("commit_ts"), first_seen=col("first_seen")))


def duplicates(stream: Stream, t: Thresholds) -> DataFrame:
    """Events delivered more than once: counted per partition (info, as after a capture
    restart); an error when a copy's content differs from the first copy's."""
    copies = stream.duplicates
    counted = copies.groupBy("topic", "partition", "segment").agg(
        F.count(lit(1)).alias("copies"), F.min("offset").alias("first"), F.max("offset").alias("last"),
        F.min("timestamp").alias("first_seen"))
    info = counted.select(finding(
        "duplicate_events", "info",
        F.concat(_text("copies"), lit(" events of node "), _text("segment"), lit(" delivered again (offsets "),
                 _text("first"), lit(".."), _text("last"), lit("), each with an identity seen before")),
        segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("first"), col("last")), first_seen=col("first_seen")))
    conflicting = copies.where(col("_hash") != col("_first_hash")).select(finding(
        "conflicting_duplicate", "error",
        F.concat(lit("the "), col("kind"), lit(" event at offset "), _text("offset"), lit(" has the identity of the one "
                                                                                           "at offset "),
                 _text("_first_offset"), lit(" (node "), _text("segment"), lit(", commit LSN "), _text("commit_lsn"),
                 lit(", sequence "), _text("seq"), lit(") but different content")),
        gxid=col("gxid"), segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("_first_offset"), col("offset")), commit_ts=col("commit_ts"),
        first_seen=col("timestamp")))
    return info.unionByName(conflicting)


def silence(stream: Stream, t: Thresholds) -> DataFrame:
    """A node with no resolved watermark for longer than ``silence_ms`` by its own clock:
    between two of its watermarks (``watermark_gap``: it was silent), or at the end,
    behind the latest of any node (``silent_node``: it is silent now)."""
    marks = stream.watermarks.where(col("resolved_ts").isNotNull())
    order = Window.partitionBy("segment").orderBy("offset")
    gaps = (marks.withColumn("prev_ts", F.lag("resolved_ts").over(order))
            .withColumn("prev_offset", F.lag("offset").over(order))
            .where(_ms("resolved_ts") - _ms("prev_ts") > t.silence_ms))
    # Between a lost mark and a repair the node is silent by design: lost_node says so.
    marked = stream.marks.where(col("kind") == "lost").select("segment", col("offset").alias("lost_at"))
    gaps = gaps.join(marked, (gaps["segment"] == marked["segment"]) & (col("lost_at") > col("prev_offset"))
                     & (col("lost_at") < gaps["offset"]), "left_anti")
    inner = gaps.select(finding(
        "watermark_gap", "warning",
        F.concat(lit("node "), _text("segment"), lit(" sent no watermark for "),
                 _text(_ms("resolved_ts") - _ms("prev_ts")), lit(" ms (from "), _text("prev_ts"), lit(" to "),
                 _text("resolved_ts"), lit(")")),
        segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("prev_offset"), col("offset")), first_seen=col("timestamp")))
    last = marks.groupBy("topic", "partition", "segment").agg(
        F.max("resolved_ts").alias("last_ts"), F.max("offset").alias("offset"), F.max("timestamp").alias("seen"))
    latest = marks.agg(F.max("resolved_ts").alias("latest_ts"))
    # A lost node is silent for good: its lost mark is the finding (lost_node); a repaired
    # one speaks again.
    lost = _lost(stream).join(_repairs(stream), "segment", "left").where(
        col("repaired_at").isNull() | (col("repaired_at") < col("lost_at"))).select("segment")
    tail = last.join(lost, "segment", "left_anti").crossJoin(latest).where(
        _ms("latest_ts") - _ms("last_ts") > t.silence_ms).select(finding(
        "silent_node", "warning",
        F.concat(lit("node "), _text("segment"), lit(" has sent no watermark since "), _text("last_ts"),
                 lit(", "), _text(_ms("latest_ts") - _ms("last_ts")), lit(" ms before the latest of any node")),
        segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("offset")), first_seen=col("seen")))
    return inner.unionByName(tail)


def watermark_delay(stream: Stream) -> DataFrame:
    """Per node and watermark: how far its resolved time was behind Kafka's time of it."""
    return stream.watermarks.where(col("resolved_ts").isNotNull()).select(
        "segment", col("timestamp").alias("at"), "resolved_ts",
        (_ms("timestamp") - _ms("resolved_ts")).alias("delay_ms"))


def lost_parts(stream: Stream, t: Thresholds) -> DataFrame:
    """Numbers missing from a numbered segment's stream: parts lost, whatever their
    transactions (a one-phase part has no record that would miss it)."""
    return _gaps(stream).select(finding(
        "lost_parts", "error",
        F.concat(lit("segment "), _text("segment"), lit("'s parts numbered "), _text("first"),
                 F.when(col("last") > col("first"), F.concat(lit(" to "), _text("last"))).otherwise(lit("")),
                 lit(" never arrived (noticed at offset "), _text("offset"), lit(")")),
        segments=F.array(col("segment")), topic=col("topic"), partition=col("partition"),
        offsets=F.array(col("offset"))))


Rule = Callable[[Stream, Thresholds], DataFrame]
RULES: tuple[Rule, ...] = (corrupt_messages, lost_nodes, damaged_parts, missing_parts, lost_parts, orphan_parts, unlisted_parts,
                           one_phase_contradictions, lost_ddl_records, legacy_markers, commit_order,
                           after_watermark, key_order, ddl_barriers, duplicates, silence)
