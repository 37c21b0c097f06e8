"""A suite's results on each store of a target, combined into the table's (pure).

Validation runs a target table's suites where its rows are: store by store (a
sandbox's segments, a Citus cluster's workers; a plain PostgreSQL server is one
store), each server computing the expectations inside its validation snapshot. Three
kinds of expectation combine exactly across stores:

- ``rows``: an expectation each row meets or fails on its own (a regular expression, a
  set, a range, not null; ``ROW_BY_ROW``): the counts of unexpected, missing and all
  values add up;
- ``unique``: uniqueness over columns that include the table's distribution key: equal
  values are routed to one store, so duplicates are within a store, once placement is
  checked (``validate.check_placement``);
- ``count``: the table's row count: the stores' counts add up.

Any other needs every row in one place: a mean, the set of distinct values, and the
map expectations that judge a row against the whole column (z-scores, outliers,
order). On a target of more than one store it is refused, in one line, before
anything is read.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._expect import Measured

ROW_COUNTS = frozenset({"expect_table_row_count_to_equal", "expect_table_row_count_to_be_between"})
UNIQUENESS = frozenset({"expect_column_values_to_be_unique", "expect_compound_columns_to_be_unique",
                        "expect_multicolumn_values_to_be_unique"})
# Map expectations whose verdict on a row reads that row alone (not the column's mean,
# quantiles or order): each store judges its rows as the whole table would.
ROW_BY_ROW = frozenset({
    "expect_column_values_to_not_be_null", "expect_column_values_to_be_null",
    "expect_column_values_to_be_in_set", "expect_column_values_to_not_be_in_set",
    "expect_column_values_to_be_between", "expect_column_value_lengths_to_be_between",
    "expect_column_value_lengths_to_equal", "expect_column_values_to_match_regex",
    "expect_column_values_to_not_match_regex", "expect_column_values_to_match_regex_list",
    "expect_column_values_to_not_match_regex_list", "expect_column_values_to_match_like_pattern",
    "expect_column_values_to_not_match_like_pattern", "expect_column_values_to_match_like_pattern_list",
    "expect_column_values_to_not_match_like_pattern_list", "expect_column_values_to_match_strftime_format",
    "expect_column_values_to_be_dateutil_parseable", "expect_column_values_to_be_json_parseable",
    "expect_column_values_to_match_json_schema", "expect_column_pair_values_a_to_be_greater_than_b",
    "expect_column_pair_values_to_be_equal", "expect_column_pair_values_to_be_in_set",
    "expect_multicolumn_sum_to_equal", "expect_select_column_values_to_be_unique_within_record",
})
_EXAMPLES = 20  # unexpected values kept in a combined result


def kind_of(expectation_type: str) -> str:
    """``count``, ``unique``, ``rows`` or ``whole`` (see the module)."""
    if expectation_type in ROW_COUNTS:
        return "count"
    if expectation_type in UNIQUENESS:
        return "unique"
    return "rows" if expectation_type in ROW_BY_ROW else "whole"


def refusal(suite: str, expectation_type: str, columns: Sequence[str], kind: str, *, table: str,
            distribution_key: Sequence[str], stores: int, placement_checked: bool) -> str | None:
    """Why the expectation cannot be computed store by store on this target (None: it can)."""
    if stores <= 1 or kind in ("rows", "count"):
        return None
    subject = f"suite {suite}: {expectation_type}({', '.join(columns)})"
    if kind == "whole":
        return (f"{subject} needs all of {table} in one place, and the target keeps it on {stores} stores: "
                "only expectations of each row alone, row counts and uniqueness over the distribution key are "
                "computed store by store")
    if not distribution_key or not set(distribution_key) <= set(columns):
        return (f"{subject}: the columns do not include {table}'s distribution key "
                f"({', '.join(distribution_key) or 'none'}), so equal values may sit on different stores")
    if not placement_checked:
        return f"{subject} holds across stores only when every row is on its store, and placement is not checked"
    return None


Identity = tuple[str, str, int]  # an expectation's type, its severity and arguments, which of its equals it is


def identities(expectations: Sequence[tuple[str, dict[str, object], str]]) -> list[Identity]:
    """Each (type, arguments, severity) with what tells it from the others, equals included."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for expectation_type, kwargs, severity in expectations:
        key = (expectation_type, repr((severity, sorted(kwargs.items()))))
        seen[key] = seen.get(key, 0) + 1
        out.append((*key, seen[key]))
    return out


def aligned(per_store: Sequence[Sequence[Measured]]) -> list[tuple[Identity, list[Measured]]]:
    """Each expectation's results on every store, from each store's results (in
    whatever order great-expectations gave them), matched by type and arguments."""
    by_store = [dict(zip(identities([(m.type, m.kwargs, m.severity) for m in results]), results))
                for results in per_store]
    first = list(by_store[0])
    if any(set(results) != set(first) for results in by_store):
        raise ValueError("the stores' results name different expectations")
    return [(identity, [results[identity] for results in by_store]) for identity in first]


def combine(per_store: Sequence[Measured], kind: str) -> Measured:
    """One expectation's results on every store, as the whole table's."""
    first = per_store[0]
    if len(per_store) == 1:
        return first
    kwargs = first.kwargs
    if kind == "count":
        observed = sum(int(m.result["observed_value"]) for m in per_store)
        return Measured(first.type, kwargs, first.severity, _count_met(first.type, kwargs, observed),
                        {"observed_value": observed})
    if not all("unexpected_count" in m.result for m in per_store):  # no counts to add up: each store's verdict
        return Measured(first.type, kwargs, first.severity, all(m.success for m in per_store),
                        {"observed_value": [m.result.get("observed_value") for m in per_store]})
    totals = {name: sum(int(m.result.get(name) or 0) for m in per_store)
              for name in ("element_count", "missing_count", "unexpected_count")}
    examples = [value for m in per_store for value in m.result.get("partial_unexpected_list") or []][:_EXAMPLES]
    mostly = kwargs.get("mostly")
    if mostly is None:
        success = all(m.success for m in per_store)
    else:  # as great-expectations judges it: among the values not missing
        considered = totals["element_count"] - totals["missing_count"]
        success = considered == 0 or (considered - totals["unexpected_count"]) / considered >= float(mostly)
    return Measured(first.type, kwargs, first.severity, success, {**totals, "partial_unexpected_list": examples})


def _count_met(expectation_type: str, kwargs: dict[str, object], observed: int) -> bool:
    if expectation_type == "expect_table_row_count_to_equal":
        return observed == kwargs["value"]
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    if low is not None and (observed <= low if kwargs.get("strict_min") else observed < low):  # type: ignore[operator]
        return False
    return high is None or (observed < high if kwargs.get("strict_max") else observed <= high)  # type: ignore[operator]
