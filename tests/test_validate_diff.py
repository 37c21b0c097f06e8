"""The row comparison every check shares, on generated tables (no servers)."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit.validate import TableDiff, diff_by_key, diff_rows

values = st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=3), st.booleans())
rows = st.lists(st.tuples(values, values), max_size=30)


@given(rows)
def test_a_table_equals_itself_in_any_order(table):
    diff = diff_rows("t", table, list(reversed(table)))
    assert diff.equal and diff.differing == 0 and diff.expected == diff.actual == len(table)
    assert diff.line() == f"t: {len(table)} rows, equal"


@given(rows, rows)
def test_multiset_differences_are_counted_exactly(expected, actual):
    diff = diff_rows("t", expected, actual)
    assert diff.missing == sum((Counter(expected) - Counter(actual)).values())
    assert diff.extra == sum((Counter(actual) - Counter(expected)).values())
    assert diff.equal == (Counter(expected) == Counter(actual))
    assert (diff.expected, diff.actual) == (len(expected), len(actual))
    assert len(diff.examples) <= 10


def test_counts_that_differ_with_no_row_found_apart_are_not_equal():
    diff = TableDiff("t", 3, 4)
    assert not diff.equal and diff.line() == "t: 4 rows where 3 were expected; no row found apart"


def test_a_duplicated_row_is_a_difference():
    diff = diff_rows("t", [(1, "a")], [(1, "a"), (1, "a")])
    assert not diff.equal and diff.extra == 1 and diff.missing == 0
    assert diff.line() == "t: 2 rows where 1 were expected; 1 extra"


@given(st.dictionaries(st.tuples(st.integers(0, 9)), st.tuples(values), max_size=10),
       st.dictionaries(st.tuples(st.integers(0, 9)), st.tuples(values), max_size=10))
def test_by_key_a_changed_row_counts_once(expected, actual):
    diff = diff_by_key("t", expected, actual)
    assert diff.missing == len(expected.keys() - actual.keys())
    assert diff.extra == len(actual.keys() - expected.keys())
    assert diff.changed == sum(1 for k in expected.keys() & actual.keys() if expected[k] != actual[k])
    assert diff.equal == (expected == actual)
