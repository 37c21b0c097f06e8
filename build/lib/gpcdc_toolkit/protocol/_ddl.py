"""Greenplum's ``DISTRIBUTED BY`` clause, split off a ``CREATE TABLE`` (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import GpcdcError

_IDENT = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_CREATE = re.compile(
    rf"^\s*CREATE\s+(?:UNLOGGED\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<name>{_IDENT}(?:\.{_IDENT})?)",
    re.IGNORECASE,
)
_DISTRIBUTED = re.compile(
    r"\s+DISTRIBUTED\s+(?:BY\s*\((?P<cols>[^)]*)\)|(?P<other>RANDOMLY|REPLICATED))\s*;?\s*$",
    re.IGNORECASE,
)


class DdlError(GpcdcError, ValueError):
    """A DDL statement the toolkit cannot dispatch."""


@dataclass(frozen=True)
class CreateTable:
    statement: str  # the statement without its DISTRIBUTED BY clause
    table: str  # as written: possibly schema-qualified and quoted
    distribution_key: tuple[str, ...]  # column names, unquoted


def _unquote(identifier: str) -> str:
    identifier = identifier.strip()
    if identifier.startswith('"') and identifier.endswith('"'):
        return identifier[1:-1].replace('""', '"')
    return identifier.lower()


def parse_create_table(statement: str) -> CreateTable | None:
    """The table and distribution key of a ``CREATE TABLE``; None for other statements."""
    create = _CREATE.match(statement)
    if create is None:
        return None
    clause = _DISTRIBUTED.search(statement)
    if clause is None:
        raise DdlError(
            f"CREATE TABLE {create['name']} has no DISTRIBUTED BY clause: "
            "add DISTRIBUTED BY (column, ...) naming its distribution key"
        )
    if clause["other"]:
        raise DdlError(
            f"CREATE TABLE {create['name']} is DISTRIBUTED {clause['other'].upper()}: only "
            "DISTRIBUTED BY (column, ...) is supported, since change capture needs a key"
        )
    columns = tuple(_unquote(c) for c in clause["cols"].split(",") if c.strip())
    if not columns:
        raise DdlError(f"CREATE TABLE {create['name']} has an empty DISTRIBUTED BY ()")
    return CreateTable(statement[: clause.start()], create["name"], columns)
