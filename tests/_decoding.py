"""Read a node's WAL through a test_decoding slot, for tests that check markers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import psycopg

_MESSAGE = re.compile(r"^message: transactional: (\d) prefix: ([^,]*), sz: \d+ content:(.*)$", re.S)
_CHANGE = re.compile(r"^table ([^:]+): (INSERT|UPDATE|DELETE):")


@dataclass
class LocalTransaction:
    xid: int
    messages: list[tuple[str, str]] = field(default_factory=list)
    changes: list[tuple[str, str]] = field(default_factory=list)  # (table, operation)


def create_slot(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (name,))


def drop_slot(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))


def committed_transactions(conn: psycopg.Connection[Any], slot: str) -> list[LocalTransaction]:
    """Every transaction the slot decodes, in commit order, without consuming them."""
    out: list[LocalTransaction] = []
    current: LocalTransaction | None = None
    rows = conn.execute(
        "SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", (slot,)
    ).fetchall()
    for (data,) in rows:
        if data.startswith("BEGIN "):
            current = LocalTransaction(int(data.split()[1]))
        elif data.startswith("COMMIT "):
            assert current is not None
            if current.messages or current.changes:
                out.append(current)
            current = None
        elif (m := _MESSAGE.match(data)) is not None:
            assert current is not None and m[1] == "1", f"non-transactional message: {data}"
            current.messages.append((m[2], m[3]))
        elif (m := _CHANGE.match(data)) is not None:
            assert current is not None
            current.changes.append((m[1], m[2]))
    return out
