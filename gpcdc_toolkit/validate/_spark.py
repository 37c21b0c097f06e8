"""The Spark mode: both sides of a table read into Spark and diffed there, for whole
tables and large mismatches.

Each side is read over psycopg, one Spark task per segment, each importing the
segment's snapshot exported by a :class:`Snapshots` (a sync point's), so Spark's
executors read exactly what the checksum mode would. Why not the PostgreSQL JDBC
driver: a sandbox's or a cluster's segments are separate servers, each read at its own
exported snapshot, which must be imported as a transaction's first statement; and
values read as PostgreSQL's own text (the checksum mode's exactness: NULL versus '',
floats as printed) need no type mapping. Rows are diffed by primary key in a full outer
join (a table without one as a multiset of rows); the differing rows, and the target's
rows on a segment their key does not name, are then collected and turned into the same
differences and fix statements as the checksum mode's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .._spark_tasks import read_in_tasks
from ..cluster import Table
from ._checksum import ChecksumResult, Diff, MisplacedRow, _as_multiset, _by_key, _check_shapes, _misplaced, _row, _texts, finish
from ._snapshots import SESSION, Snapshots

ROW_TEXT = "_row"  # the row's text (ROW(...)::text), read for tables without a key
SEGMENT = "_segment"
BATCH_ROWS = 20_000  # rows per Arrow batch a reader hands Spark


@dataclass(frozen=True)
class SegmentSnapshot:
    """What one Spark task reads: a segment's rows at its exported snapshot."""

    content: int
    dsn: str
    snapshot: str
    query: str  # selects every column as text, then the row's text, from what the node stores


def read_slice(part: SegmentSnapshot) -> Iterator[Any]:
    """The segment's rows, as Arrow record batches (far cheaper into Spark than tuples)."""
    import psycopg
    import pyarrow as pa
    from psycopg import sql

    with psycopg.connect(part.dsn, autocommit=True) as conn:
        conn.execute(SESSION)
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(part.snapshot)))
        with conn.cursor(name="gpcdc_table") as rows:
            rows.execute(part.query.encode())  # composed and quoted by read_side, from the catalog
            while batch := rows.fetchmany(BATCH_ROWS):
                columns = list(zip(*batch))
                yield pa.RecordBatch.from_arrays(
                    [pa.array([part.content] * len(batch), pa.int32()),
                     *(pa.array(column, pa.string()) for column in columns)],
                    names=[SEGMENT, *(f"c{i}" for i in range(len(columns) - 1)), ROW_TEXT])


def _names(info: Table) -> list[str]:
    """Positional column names in Spark: any name a table has stays out of Spark's parser."""
    return [f"c{i}" for i in range(len(info.columns))]


def read_side(spark: Any, side: Snapshots, info: Table) -> DataFrame:
    """One side of a table in Spark: ``_segment``, ``c0``.. (each column as text), ``_row``.
    One task a segment, each reading its slice (planned here, so that Spark starts no
    Python worker to plan the read)."""
    if not side.names:
        side.pin()
    conn = side.connections()[0]
    from psycopg import sql

    columns = _texts(info)
    slices = [SegmentSnapshot(node.content, side.cluster.dsn(node), side.names[node.content],
                              sql.SQL("SELECT {}, {} FROM {} t").format(columns, _row(info), side.relation(node, info))
                              .as_string(conn)) for node in side.cluster.segments]
    schema = ", ".join([f"{SEGMENT} int", *(f"{c} string" for c in _names(info)), f"{ROW_TEXT} string"])
    frame: DataFrame = read_in_tasks(spark, slices, read_slice, schema)
    return frame


def spark_diff(source: DataFrame, target: DataFrame, info: Table) -> DataFrame:
    """Row by row: the key (``c<i>`` of the key columns), ``status`` (equal, missing,
    extra, changed) and ``changed`` (the names of the columns that differ). A table
    without a key is compared as a multiset: one row per distinct row, with how many
    copies each side has (``source_copies``, ``target_copies``)."""
    names = _names(info)
    if not info.primary_key:
        # Per distinct row: its copies, and (target) the segment of each copy and its text, for the fix.
        counted = [df.groupBy(*names).agg(F.count(F.lit(1)).alias(copies), F.collect_list(SEGMENT).alias("segments"),
                                          F.min(ROW_TEXT).alias("row"))
                   for df, copies in ((source, "source_copies"), (target, "target_copies"))]
        both = counted[0].alias("s").join(counted[1].alias("t"), [F.col(f"s.{c}").eqNullSafe(F.col(f"t.{c}"))
                                                                 for c in names], "full_outer")
        s_copies, t_copies = F.coalesce(F.col("s.source_copies"), F.lit(0)), F.coalesce(F.col("t.target_copies"), F.lit(0))
        return both.select(*(F.coalesce(F.col(f"s.{c}"), F.col(f"t.{c}")).alias(c) for c in names),
                           s_copies.alias("source_copies"), t_copies.alias("target_copies"),
                           F.col("t.segments").alias("t_segments"), F.col("t.row").alias("t_row"),
                           F.when(s_copies == t_copies, "equal").when(s_copies > t_copies, "missing")
                           .otherwise("extra").alias("status"))
    key = [names[info.columns.index(c)] for c in info.primary_key]
    s, t = source.withColumn("_here", F.lit(True)).alias("s"), target.withColumn("_here", F.lit(True)).alias("t")
    both = s.join(t, [F.col(f"s.{c}") == F.col(f"t.{c}") for c in key], "full_outer")
    changed = F.array_compact(F.array(*(F.when(~F.col(f"s.{c}").eqNullSafe(F.col(f"t.{c}")), F.lit(column))
                                        for c, column in zip(names, info.columns) if c not in key)))
    status = (F.when(F.col("t._here").isNull(), "missing").when(F.col("s._here").isNull(), "extra")
              .when(F.size(changed) > 0, "changed").otherwise("equal"))
    return both.select(*(F.coalesce(F.col(f"s.{c}"), F.col(f"t.{c}")).alias(c) for c in key),
                       status.alias("status"), F.when(status == "changed", changed).alias("changed"),
                       *(F.col(f"{side}.{c}").alias(f"{side}_{c}") for side in "st" for c in [SEGMENT, *names]),
                       F.col(f"s.{ROW_TEXT}").alias("s_row"), F.col(f"t.{ROW_TEXT}").alias("t_row"))


def compare_spark(spark: Any, source: Snapshots, target: Snapshots, info: Table, target_info: Table, *,
                  placement: bool = True) -> ChecksumResult:
    """One table compared in Spark; the result has the checksum mode's form (its
    ``chunks`` and ``rounds`` are 0: nothing is bisected)."""
    started = time.monotonic()
    _check_shapes(info, target_info)
    names = _names(info)
    # Each side is read from the databases once, then kept (memory, then disk) for the
    # counts, the diff and the placement check.
    src_df, tgt_df = read_side(spark, source, info).persist(), read_side(spark, target, target_info).persist()
    diff_df = spark_diff(src_df, tgt_df, info)
    try:
        totals = (src_df.count(), tgt_df.count())
        src: list[tuple[int, tuple[str | None, ...], str]] = []
        tgt: list[tuple[int, tuple[str | None, ...], str]] = []
        misplaced = _misplaced(target, target_info) if placement else []  # by the nodes themselves
        if info.primary_key:
            # Every row of each side under a key that differs, or that a side holds more
            # than once: each of its rows is joined, and a copy equal to the other side's
            # row would be left out (and the fix, by key, would reach it too), or, copies
            # alike, every joined row would be equal.
            key = [names[info.columns.index(c)] for c in info.primary_key]
            aliased = [F.col(c).alias(f"k_{c}") for c in key]
            differing = diff_df.where("status <> 'equal'").select(*aliased)
            for side in (src_df, tgt_df):
                differing = differing.union(side.groupBy(*key).count().where("count > 1").select(*aliased))
            differing = differing.distinct()
            for side, rows in ((src_df, src), (tgt_df, tgt)):
                under = side.join(differing, [F.col(c).eqNullSafe(F.col(f"k_{c}")) for c in key], "left_semi")
                rows += [(r[SEGMENT], tuple(r[c] for c in names), r[ROW_TEXT]) for r in under.collect()]
            diff, fixes = _by_key(target_info, target, src, tgt, misplaced)  # statements follow the target's description
        else:
            diff, fixes = _multiset_from(diff_df, target_info, target, src, tgt, misplaced)
        fetched = len(src) + len(tgt)
    finally:
        src_df.unpersist()
        tgt_df.unpersist()
    return finish(info, target, target_info, diff, fixes, misplaced, totals, rounds=0, chunks=0, fetched=fetched,
                  started=started)


def _multiset_from(diff_df: DataFrame, info: Table, target: Snapshots, src: list[Any], tgt: list[Any],
                   misplaced: Sequence[MisplacedRow]) -> Diff:
    """A keyless table's differing rows, each as many times as its copies on each side
    (the target's each on its segment)."""
    names = _names(info)
    for r in diff_df.where("status <> 'equal'").collect():
        row = tuple(r[c] for c in names)
        src += [(-1, row, r["t_row"])] * r["source_copies"]
        tgt += [(segment, row, r["t_row"]) for segment in r["t_segments"] or ()]
    return _as_multiset(info, target, src, tgt, misplaced)
