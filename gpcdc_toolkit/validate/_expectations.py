"""great-expectations suites run on the target's tables as validation read them.

Every table gets a suite derived from the catalog and the comparison: its primary key
unique and never null, and its row count equal to the source's at the sync point.
Suites in ``expectations/`` whose ``meta.gpcdc.frame`` is ``target`` add what the
workload guarantees of a table's values. Each table is read into Spark by the Spark
mode's data source, at the target's snapshots, with its real column names; values are
PostgreSQL's text of them (a domain is a regular expression or a set of strings).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._expect import Expectations, Outcome, Suite
from ..cluster import Table
from ._snapshots import Snapshots


def derived_suite(info: Table, source_rows: int) -> dict[str, Any]:
    """The suite every target table gets: key unique and not null, row count as the source's."""
    expectations: list[dict[str, Any]] = [
        {"type": "expect_table_row_count_to_equal", "kwargs": {"value": source_rows},
         "meta": {"why": "the source held this many rows at the same point"}}]
    key = list(info.primary_key)
    if len(key) == 1:
        expectations.append({"type": "expect_column_values_to_be_unique", "kwargs": {"column": key[0]}})
    elif key:
        expectations.append({"type": "expect_compound_columns_to_be_unique", "kwargs": {"column_list": key}})
    expectations += [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": c}} for c in key]
    return {"name": f"target {info.name}", "expectations": expectations}


def check_target(spark: Any, target: Snapshots, tables: Sequence[tuple[Table, int]],
                 suites: Sequence[Suite]) -> list[Outcome]:
    """Every target table's derived suite and its suites from ``expectations/``, given
    (the table, the source's row count)."""
    from ._spark import read_side

    expectations = Expectations()
    out: list[Outcome] = []
    for info, source_rows in tables:
        # Read from the target once for every suite of the table, and released after.
        frame = (read_side(spark, target, info).select(*(f"c{i}" for i in range(len(info.columns))))
                 .toDF(*info.columns).persist())
        try:
            out += expectations.evaluate(f"target {info.name}", derived_suite(info, source_rows), frame)
            for suite in suites:
                if suite.frame == "target" and suite.table == info.name:
                    out += expectations.evaluate(suite.name, suite.body, frame)
        finally:
            frame.unpersist()
    return out
