"""Table contents compared: a target against its source, a cluster against a workload's
ground truth."""

from __future__ import annotations

from pathlib import Path

from ..cluster import Cluster
from ..workload import ACCOUNTS, EVENTS, expected_state, read_ground_truth
from ._diff import Row, TableDiff, diff_by_key, diff_rows


def table_rows(cluster: Cluster, table: str) -> list[Row]:
    """Every row of a table, from every segment, in one order for equal contents (by
    their text: rows may mix None and values where Python cannot order them)."""
    return sorted((row for rows in cluster.rows_by_segment(table).values() for row in rows), key=repr)


def compare_tables(source: Cluster, target: Cluster, tables: list[str]) -> list[TableDiff]:
    """Each table's rows on the target against the source's (read one after the other:
    equal only when neither changes meanwhile)."""
    return [diff_rows(table, table_rows(source, table), table_rows(target, table)) for table in tables]


def check_workload(cluster: Cluster, ground_truth: Path, hot_keys: int) -> list[TableDiff]:
    """The workload's tables against what its ground-truth log implies."""
    expected = expected_state(read_ground_truth(ground_truth), hot_keys)
    out = []
    for table, key_len in ((ACCOUNTS, 1), (EVENTS, 2)):
        actual = {row[:key_len]: row[key_len:] for row in table_rows(cluster, table)}
        out.append(diff_by_key(table, expected[table], actual))
    return out
