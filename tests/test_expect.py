"""great-expectations' results as the toolkit reads them: examples looked up only for
what failed with unexpected values, and matched back to their expectations."""

from __future__ import annotations

import pandas as pd
import psycopg
import pytest
from sqlalchemy import event

from gpcdc_toolkit._expect import Expectations


@pytest.fixture(scope="module")
def expectations():
    return Expectations()


def batch_of(expectations, frame, name):
    source = expectations._context.data_sources.add_pandas(name)
    return source.add_dataframe_asset("rows").add_batch_definition_whole_dataframe("all").get_batch(
        batch_parameters={"dataframe": frame})


class Counting:
    """A batch whose validations are counted, with the expectations each one ran."""

    def __init__(self, batch):
        self.batch, self.passes = batch, []

    def validate(self, suite, **kwargs):
        self.passes.append(sorted(e.expectation_type for e in suite.expectations))
        return self.batch.validate(suite, **kwargs)


def test_examples_are_looked_up_only_for_expectations_that_failed_with_unexpected_values(expectations):
    frame = pd.DataFrame({"k": [1, 2, 2, 3], "v": ["a", "b", "zz", None]})
    batch = Counting(batch_of(expectations, frame, "examples"))
    in_set = {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "v", "value_set": ["a", "b"]}}
    body = {"name": "s", "expectations": [
        {"type": "expect_table_row_count_to_equal", "kwargs": {"value": 9}},  # fails with no values to show
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "k"}, "severity": "warning"},
        in_set, dict(in_set),  # equal expectations: each gets its own result
        {"type": "expect_column_values_to_match_regex", "kwargs": {"column": "v", "regex": "^[a-z]+$"}},
    ]}
    for n, expectation in enumerate(body["expectations"]):  # as in a suite great-expectations saved
        expectation["id"] = f"00000000-0000-4000-8000-{n:012d}"
    measured = expectations._measure("s", body, batch)
    assert batch.passes == [sorted(e["type"] for e in body["expectations"]),
                            sorted(["expect_column_values_to_be_unique"] + 2 * ["expect_column_values_to_be_in_set"])]
    by_type: dict[str, list] = {}
    for m in measured:
        by_type.setdefault(m.type, []).append(m)
    (count,) = by_type["expect_table_row_count_to_equal"]
    assert not count.success and count.result["observed_value"] == 4
    (unique,) = by_type["expect_column_values_to_be_unique"]
    assert unique.severity == "warning" and sorted(unique.result["partial_unexpected_list"]) == [2, 2]
    assert [m.result["partial_unexpected_list"] for m in by_type["expect_column_values_to_be_in_set"]] == [["zz"]] * 2
    (regex,) = by_type["expect_column_values_to_match_regex"]
    assert regex.success and regex.result["unexpected_count"] == 0


def test_a_suite_that_passes_is_validated_once(expectations):
    batch = Counting(batch_of(expectations, pd.DataFrame({"k": [1, 2]}), "passes"))
    measured = expectations._measure("s", {"name": "s", "expectations": [
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "k"}}]}, batch)
    assert len(batch.passes) == 1 and all(m.success for m in measured)


def test_a_query_is_computed_by_its_server_no_query_bringing_its_rows_here(expectations, source, table_name):
    """great-expectations learns a query's columns by running it: only its columns may
    come back, never every row of the table (each statement's rows are counted)."""
    node, rows = source.segments[0], 5000
    quoted = f'"{table_name} ""Odd"" Name"'
    query = f"SELECT id, v FROM {quoted}"
    store = expectations.store(f"store {table_name}", lambda: psycopg.connect(source.dsn(node)), [query])
    returned: list[tuple[int, str]] = []
    event.listen(store.get_execution_engine().engine, "after_cursor_execute",
                 lambda conn, cursor, statement, *_: returned.append((cursor.rowcount, statement)))
    try:
        with source.connect_node(node) as conn:
            conn.execute(f"CREATE TABLE {quoted} (id int, v text)")
            conn.execute(f"INSERT INTO {quoted} SELECT i, CASE WHEN i % 1000 = 0 THEN 'bad' ELSE 'ok' END "
                         f"FROM generate_series(1, {rows}) i")
        measured = expectations.measure_query("s", {"name": "s", "expectations": [
            {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "v", "value_set": ["ok"]}},
            {"type": "expect_table_row_count_to_equal", "kwargs": {"value": rows}}]},
            store, query)
    finally:
        expectations.release(store)
        with source.connect_node(node) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {quoted}")
    by_type = {m.type: m for m in measured}
    in_set = by_type["expect_column_values_to_be_in_set"]
    assert not in_set.success and in_set.result["unexpected_count"] == rows // 1000
    assert in_set.result["partial_unexpected_list"] == ["bad"] * (rows // 1000)
    assert by_type["expect_table_row_count_to_equal"].success
    most, statement = max(returned)
    assert most <= rows // 1000, f"{most} rows came back for: {statement}"
