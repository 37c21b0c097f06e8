"""The net effect of a batch of row events, per table and primary key (pure).

A batch is applied as one target transaction, so only its net effect on each row is
visible: the last image of a row, or its absence. For a table with a primary key, the
events of a batch fold into, per key, a key to delete, a row to write, or (when an
update left a TOASTed value out and no full image is known) columns to update. Rows
with different keys do not interact (the primary key is the only uniqueness the
target is assumed to enforce), so each kind can go in bulk, deletes first, which also
frees any other unique value a new row takes over. A table without a primary key
keeps its events in order.

Writing a row's last image whatever the target holds would bring back a row the target
lost outside the pipeline, or write over one it gained, silently. So each folded key
also says whether the source held its row before the batch (its first event in the
batch tells: an insert, or an update that moves a row onto it, found none; an update
or a delete found one): the replayer checks that the target holds exactly those, as
applying each event in order would have found. A row to write is an *upsert* where the
source held its key and an *insert* where it did not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..protocol import UNCHANGED

Key = tuple[Any, ...]


@dataclass
class TableChanges:
    table: tuple[str, str]  # (schema, name) as the catalog has them
    key_columns: tuple[str, ...]
    # Each folded key, whether the source held its row before the batch, and what its first event was.
    before: list[tuple[dict[str, Any], bool, str]] = field(default_factory=list)
    deletes: list[dict[str, Any]] = field(default_factory=list)  # keys, each one of ``before``
    upserts: list[dict[str, Any]] = field(default_factory=list)  # whole rows whose key the source held
    inserts: list[dict[str, Any]] = field(default_factory=list)  # whole rows whose key the source did not hold
    updates: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)  # (held key, columns)
    ordered: list[Mapping[str, Any]] = field(default_factory=list)  # or all its events, in order, unfolded


def table_of(event: Mapping[str, Any]) -> tuple[str, str]:
    """The (schema, name) a row event changes, exactly as the source's catalog has them."""
    source = event["source"]
    return source["schema"], source["table"]


def compact(events: Iterable[Mapping[str, Any]],
            primary_keys: Mapping[tuple[str, str], Sequence[str]]) -> list[TableChanges]:
    """Fold row events (in source order) into each table's net changes.

    ``primary_keys`` maps each table to its primary-key columns (empty: none)."""
    tables: dict[tuple[str, str], TableChanges] = {}
    # Per table and key: ("row", image) | ("gone", None) | ("patch", columns)
    state: dict[tuple[str, str], dict[Key, tuple[str, dict[str, Any] | None]]] = {}
    first: dict[tuple[str, str], dict[Key, tuple[bool, str]]] = {}  # per table and key: held before, first event
    unfoldable: set[tuple[str, str]] = set()
    for event in events:
        table = table_of(event)
        changes = tables.get(table)
        if changes is None:
            changes = tables[table] = TableChanges(table, tuple(primary_keys[table]))
            state[table] = {}
            first[table] = {}
        changes.ordered.append(event)  # kept in case the table cannot be folded
        if not changes.key_columns or event["op"] not in ("c", "u", "d"):
            unfoldable.add(table)  # no key to fold by (or a TRUNCATE, refused when applied)
        if table in unfoldable:
            continue
        rows, seen = state[table], first[table]
        columns = changes.key_columns
        op, after, before = event["op"], event["after"], event["before"]
        if op == "d":
            gone = tuple(before[c] for c in columns)
            seen.setdefault(gone, (True, "a delete"))
            rows[gone] = ("gone", None)
            continue
        key = tuple(after[c] for c in columns)
        old = tuple(before[c] for c in columns) if op == "u" and before is not None else key
        if op == "c":
            seen.setdefault(key, (False, "an insert"))
        else:
            seen.setdefault(old, (True, "an update"))
            seen.setdefault(key, (False, "an update"))  # a row moved onto a key no row held (or the same key)
        partial = bool(event.get(UNCHANGED))  # some columns were not in the WAL
        if old != key:  # the key changed: the old row goes
            previous = rows.get(old)
            if partial:
                if previous is None or previous[0] != "row":
                    # The moved row takes a value only the target has: apply in order.
                    unfoldable.add(table)
                    continue
                after = {**previous[1], **after}  # type: ignore[dict-item]
                partial = False
            rows[old] = ("gone", None)
        if op == "c" or not partial:
            rows[key] = ("row", dict(after))
            continue
        kind, known = rows.get(key, ("patch", {}))
        if kind == "row":
            rows[key] = ("row", {**known, **after})  # type: ignore[dict-item]
        else:
            rows[key] = ("patch", {**(known or {}), **after})
    for table, rows in state.items():
        changes = tables[table]
        if table in unfoldable:
            continue
        changes.ordered = []
        for key, (kind, image) in rows.items():
            key_values = dict(zip(changes.key_columns, key))
            held, what = first[table][key]
            changes.before.append((key_values, held, what))
            if kind == "gone":
                changes.deletes.append(key_values)
            elif kind == "row":
                (changes.upserts if held else changes.inserts).append(image)  # type: ignore[arg-type]
            else:
                values = {c: v for c, v in image.items() if c not in key_values}  # type: ignore[union-attr]
                if values:
                    changes.updates.append((key_values, values))
    return list(tables.values())

