def encode(payload: bytes, pos: int, names: tuple[bytes, ...], kinds: bytes, /) -> tuple[bytes, bytes | None, int] | None:
    """The tuple at ``payload[pos:]`` as (image, key, end), or None: see _rowjson.c."""
