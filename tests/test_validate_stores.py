"""A suite's results on each store combined into the table's (pure): the combination
equals the result on the whole table, however the rows are split among the stores."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpcdc_toolkit._expect import Measured
from gpcdc_toolkit.validate._stores import aligned, combine, kind_of, refusal

IN_SET = "expect_column_values_to_be_in_set"
ALLOWED = {"a", "b"}


def in_set(values, mostly=None):
    """The expectation as great-expectations judges it on these values."""
    kwargs = {"column": "c", "value_set": sorted(ALLOWED), **({"mostly": mostly} if mostly is not None else {})}
    missing = sum(v is None for v in values)
    unexpected = [v for v in values if v is not None and v not in ALLOWED]
    considered = len(values) - missing
    success = (not unexpected if mostly is None
               else considered == 0 or (considered - len(unexpected)) / considered >= mostly)
    return Measured(IN_SET, kwargs, "error", success, {
        "element_count": len(values), "missing_count": missing, "unexpected_count": len(unexpected),
        "partial_unexpected_list": unexpected[:20]})


def split(values, stores, seed):
    """The values dealt among ``stores`` stores at random (some possibly empty)."""
    rng = random.Random(seed)
    parts = [[] for _ in range(stores)]
    for v in values:
        parts[rng.randrange(stores)].append(v)
    return parts


@given(st.lists(st.sampled_from(["a", "b", "c", "d'", None]), max_size=60), st.integers(1, 6),
       st.one_of(st.none(), st.sampled_from([0.0, 0.3, 0.5, 0.9, 1.0])), st.integers(0, 2**32))
def test_row_by_row_results_combine_to_the_whole_tables(values, stores, mostly, seed):
    whole = in_set(values, mostly)
    combined = combine([in_set(part, mostly) for part in split(values, stores, seed)], "rows")
    assert combined.success == whole.success
    for count in ("element_count", "missing_count", "unexpected_count"):
        assert combined.result[count] == whole.result[count]
    examples, unexpected = combined.result["partial_unexpected_list"], whole.result["unexpected_count"]
    assert len(examples) == min(20, unexpected) and all(v is not None and v not in ALLOWED for v in examples)


def row_count(rows, expectation, kwargs):
    observed = len(rows)
    if expectation == "expect_table_row_count_to_equal":
        met = observed == kwargs["value"]
    else:
        low, high = kwargs.get("min_value"), kwargs.get("max_value")
        met = ((low is None or (observed > low if kwargs.get("strict_min") else observed >= low))
               and (high is None or (observed < high if kwargs.get("strict_max") else observed <= high)))
    return Measured(expectation, kwargs, "error", met, {"observed_value": observed})


@given(st.integers(0, 40), st.integers(1, 6), st.integers(0, 2**32), st.one_of(
    st.builds(lambda v: ("expect_table_row_count_to_equal", {"value": v}), st.integers(0, 40)),
    st.builds(lambda lo, hi, smin, smax: ("expect_table_row_count_to_be_between",
                                          {"min_value": lo, "max_value": hi, "strict_min": smin, "strict_max": smax}),
              st.one_of(st.none(), st.integers(0, 40)), st.one_of(st.none(), st.integers(0, 40)),
              st.booleans(), st.booleans())))
def test_row_counts_add_up_across_stores(rows, stores, seed, expectation):
    kind, kwargs = expectation
    whole = row_count(range(rows), kind, kwargs)
    combined = combine([row_count(part, kind, kwargs) for part in split(range(rows), stores, seed)], "count")
    assert (combined.success, combined.result) == (whole.success, whole.result)


def test_what_cannot_be_computed_store_by_store_is_refused_before_reading():
    def why(kind, columns, stores=2, placement=True):
        return refusal("s", "expect_x", columns, kind, table='public."T t"', distribution_key=("Id",), stores=stores,
                       placement_checked=placement)

    assert why("whole", ["c"], stores=1) is None and why("unique", ["c"], stores=1) is None  # one store: all of it
    assert why("rows", ["c"]) is None and why("count", []) is None
    assert 'needs all of public."T t" in one place' in why("whole", ["c"])
    assert "do not include public.\"T t\"'s distribution key (Id)" in why("unique", ["c"])
    assert why("unique", ["Id", "c"]) is None
    assert "placement is not checked" in why("unique", ["Id"], placement=False)
    assert kind_of("expect_column_values_to_be_unique") == "unique"
    assert kind_of("expect_table_row_count_to_be_between") == "count"
    assert kind_of(IN_SET) == "rows"
    # Map expectations that judge a row against its whole column are not row by row.
    for whole in ("expect_column_mean_to_be_between", "expect_column_value_z_scores_to_be_less_than",
                  "expect_column_values_to_be_increasing", "expect_column_values_to_be_of_type"):
        assert kind_of(whole) == "whole", whole


def test_results_without_counts_combine_as_every_stores_verdict():
    failed = Measured(IN_SET, {"column": "c", "value_set": ["a"], "mostly": 0.5}, "error", False,
                      {"observed_value": "text"})
    passed = Measured(IN_SET, failed.kwargs, "error", True, {"observed_value": "text"})
    assert combine([passed, failed], "rows").success is False
    assert combine([passed, passed], "rows").success is True


@given(st.permutations(range(5)))
def test_results_are_matched_by_expectation_whatever_their_order(order):
    warning = in_set(["c"])
    warning = Measured(warning.type, warning.kwargs, "warning", warning.success, warning.result)
    first = [in_set(["a"]), in_set(["c"], 0.5), row_count([1], "expect_table_row_count_to_equal", {"value": 1}),
             in_set(["d'"], 0.9), warning]
    second = [first[i] for i in order]
    assert [group for _, group in aligned([first, second])] == [[m, m] for m in first]
    with pytest.raises(ValueError, match="different expectations"):
        aligned([first, second[:-1]])


def test_a_failed_query_under_an_expectation_is_named_not_counted_as_unmet():
    from gpcdc_toolkit._expect import _raised

    assert _raised(None) is None and _raised({}) is None
    assert _raised({"raised_exception": True, "exception_message": "column c9 not found\nmore"}) == "column c9 not found"
    # great-expectations reports a failed metric query per metric, not at the top.
    per_metric = {"MetricConfigurationID(table.row_count)": {"raised_exception": True,
                                                             "exception_message": "UndefinedColumn: co\"l"}}
    assert _raised(per_metric) == 'UndefinedColumn: co"l'
