from typing import Any

def row(topic: str, partition: int, offset: int, timestamp_ms: int | None, key: bytes | None, decoded: Any,
        /) -> tuple[Any, ...] | None:
    """``to_row``'s tuple for a row event of the usual form, or None: see _rowevent.c."""
