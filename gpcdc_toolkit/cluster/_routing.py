"""Routing rows to segments by their distribution key (pure).

A key is hashed from the text form PostgreSQL prints for each value, so that a
value given in Python (``42``) and the same value decoded from the WAL (``"42"``)
land on the same segment. The hash is mapped to a segment with jump consistent
hashing (as Greenplum 6+ does), so that a cluster with a different number of
segments re-routes rows deterministically.

The sandbox's servers compute the same routing in SQL (``gp_dist.segment_of``, a C
function from ``sandbox/gp_dist.c``), so that a placement check runs where the rows
are: the two forms must agree on every key, and are given the same text
(:func:`output_text` in SQL).
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
import zlib
from collections.abc import Sequence

from psycopg import sql

_UNIT_SEPARATOR = "\x1f"
_NULL = "\x00"


def key_text(value: object) -> str:
    """The text PostgreSQL's output function gives for a distribution-key value."""
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, (int, str, decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    raise TypeError(f"unsupported distribution-key type {type(value).__name__}; use int, str, Decimal, UUID, date or timestamp")


# Types whose cast to text is their output function's (an I/O conversion, or the same
# bytes): read by the cast, which is cheaper than concat() (a placement check's routing
# of 3M rows by a two-column key: 0.53 s against 0.64 s). Any other type, domains among
# them, is read through its output function.
_CAST_IS_OUTPUT = frozenset({"smallint", "integer", "bigint", "numeric", "text", "character varying", "uuid", "date",
                             "timestamp without time zone", "timestamp with time zone"})


def output_text(value: sql.Composable, type_name: str) -> sql.Composable:
    """SQL for ``value``'s text as its type (named as the catalog prints it) prints it:
    as :func:`key_text` and the WAL give it; NULL stays NULL. A cast to text is not
    always that text: ``true::text`` is 'true' where a boolean prints 't', an inet's
    cast adds its mask length, a character(n)'s drops its padding."""
    if type_name in _CAST_IS_OUTPUT or type_name.startswith("character varying("):
        return sql.SQL("{}::text").format(value)
    return sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE concat({0}) END").format(value)


def key_hash(values: Sequence[object]) -> int:
    """A stable unsigned 32-bit hash of a distribution key (its values in key order)."""
    text = _UNIT_SEPARATOR.join(key_text(v) for v in values)
    # CRC-32: it spreads keys evenly, and is cheap here and in the servers' C function.
    return zlib.crc32(text.encode())


def jump_consistent_hash(key: int, buckets: int) -> int:
    """Lamping and Veach's jump consistent hash: a bucket in [0, buckets)."""
    if buckets < 1:
        raise ValueError(f"a cluster needs at least 1 segment, got {buckets}")
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def segment_for(values: Sequence[object], segments: int) -> int:
    """The segment (content id) that stores a row with these distribution-key values."""
    return jump_consistent_hash(key_hash(values), segments)
