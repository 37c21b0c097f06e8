"""Fold captured row events into tables, for comparing snapshot + stream with the source."""

from __future__ import annotations

from typing import Any


def apply_rows(state: dict[tuple[Any, ...], dict[str, Any]], rows: list[dict[str, Any]], key: list[str]) -> None:
    """Fold row events into a keyed table, in order."""
    for v in rows:
        if v["op"] in ("c", "u", "r"):
            if v["op"] == "u" and v["before"] is not None:
                state.pop(tuple(v["before"][k] for k in key), None)
            state[tuple(v["after"][k] for k in key)] = v["after"]
        elif v["op"] == "d":
            state.pop(tuple(v["before"][k] for k in key), None)
