"""The stream's invariants as great-expectations suites, kept as JSON in
``expectations/``, validated on the audit's DataFrames; a failed expectation is a
finding whose rule names it.

The audit's suites are those whose ``meta.gpcdc.frame`` is ``events`` (every message,
duplicates removed) or ``tables`` (one row per table, ``keys`` all, none or mixed);
``meta.gpcdc.when = "marked"`` keeps one to streams written with the gxid markers.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .._expect import Expectations, Outcome, Suite
from ._findings import FINDING_COLUMNS
from ._rules import Stream


def tables_frame(stream: Stream) -> DataFrame:
    rows = stream.events.where((F.col("kind") == "row") & (F.col("op") != "t"))  # a TRUNCATE has no key
    keyed = F.sum(F.col("key").isNotNull().cast("int"))
    return rows.groupBy("table_schema", "table_name").agg(
        F.when(keyed == F.count(F.lit(1)), "all").when(keyed == 0, "none").otherwise("mixed").alias("keys"))


def validate(stream: Stream, suites: list[Suite]) -> tuple[DataFrame, list[Outcome]]:
    """The failed expectations of ``suites`` on ``stream``, as findings; and the outcome
    of every expectation evaluated (a suite for marked streams is left out of others)."""
    expectations = Expectations()
    frames = {"events": stream.events, "tables": tables_frame(stream)}
    marked = stream.parts.where(F.col("gxid").isNotNull() & (F.col("ends") > 0)).limit(1).count() > 0
    outcomes = []
    for suite in suites:
        if suite.frame not in frames or (suite.marked_only and not marked):
            continue
        outcomes += expectations.evaluate(suite.name, suite.body, frames[suite.frame])
    rows = [(o.expectation, o.severity, f"{o.suite}: {o.evidence}") for o in outcomes if not o.success]
    spark = stream.events.sparkSession
    found = spark.createDataFrame(rows, "rule string, severity string, evidence string")
    return found.select(*[F.col(name).cast(kind) if name in ("rule", "severity", "evidence")
                          else F.lit(None).cast(kind).alias(name) for name, kind in FINDING_COLUMNS]), outcomes
