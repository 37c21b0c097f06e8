"""Differences between two sets of rows, free of I/O.

A table's rows are compared as a multiset (a table without a key may hold a row
twice), or by key when the caller knows the key (``diff_by_key``): then a changed row
counts once, as changed, not as one missing and one extra."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Row = tuple[Any, ...]

EXAMPLES = 5  # rows quoted per kind of difference


Text = tuple[str | None, ...]  # a row's values as PostgreSQL prints them (None: NULL)


@dataclass(frozen=True)
class DifferingRow:
    """One row that differs, as data: ``kind`` missing (on the source, not the target),
    extra (on the target, not the source), changed (under the same primary key, other
    values in ``columns``) or misplaced (on a target segment its distribution key does
    not name); ``key`` its primary key's values (every column's for a table without
    one); each side's whole row and segment, where the row is on that side."""

    kind: str
    key: Text
    columns: tuple[str, ...] = ()
    source: Text | None = None
    target: Text | None = None
    source_segment: int | None = None
    target_segment: int | None = None


@dataclass(frozen=True)
class TableDiff:
    """How the rows of one table differ from what was expected."""

    table: str
    expected: int  # rows expected
    actual: int  # rows found
    missing: int = 0  # expected, not found
    extra: int = 0  # found, not expected
    changed: int = 0  # found under an expected key, with other values (by-key comparisons only)
    examples: tuple[str, ...] = ()
    misplaced: int = 0  # found on a segment other than the one its distribution key names
    rows: tuple[DifferingRow, ...] = ()  # every differing row (where the comparison fetched them)

    @property
    def equal(self) -> bool:
        # The counts too: rows a comparison counted but did not find apart are not equal.
        return not (self.missing or self.extra or self.changed or self.misplaced) and self.expected == self.actual

    @property
    def differing(self) -> int:
        return self.missing + self.extra + self.changed + self.misplaced

    def line(self) -> str:
        if self.equal:
            return f"{self.table}: {self.actual} rows, equal"
        parts = [f"{n} {what}" for n, what in ((self.missing, "missing"), (self.extra, "extra"),
                                                 (self.changed, "changed"), (self.misplaced, "misplaced")) if n]
        return f"{self.table}: {self.actual} rows where {self.expected} were expected; {', '.join(parts) or 'no row found apart'}"


def diff_rows(table: str, expected: Iterable[Row], actual: Iterable[Row]) -> TableDiff:
    """Compare two multisets of rows."""
    want, have = Counter(expected), Counter(actual)
    missing, extra = want - have, have - want
    examples = [f"missing {row!r}" for row in sorted(missing, key=repr)[:EXAMPLES]]
    examples += [f"extra {row!r}" for row in sorted(extra, key=repr)[:EXAMPLES]]
    return TableDiff(table, sum(want.values()), sum(have.values()), sum(missing.values()), sum(extra.values()),
                     examples=tuple(examples))


def diff_by_key(table: str, expected: Mapping[Row, Row], actual: Mapping[Row, Row]) -> TableDiff:
    """Compare two tables given as key -> non-key values."""
    missing = sorted((k for k in expected if k not in actual), key=repr)
    extra = sorted((k for k in actual if k not in expected), key=repr)
    changed = sorted((k for k in expected if k in actual and expected[k] != actual[k]), key=repr)
    examples = [f"missing key {k!r}" for k in missing[:EXAMPLES]]
    examples += [f"extra key {k!r}" for k in extra[:EXAMPLES]]
    examples += [f"key {k!r}: {actual[k]!r}, expected {expected[k]!r}" for k in changed[:EXAMPLES]]
    return TableDiff(table, len(expected), len(actual), len(missing), len(extra), len(changed), tuple(examples))
