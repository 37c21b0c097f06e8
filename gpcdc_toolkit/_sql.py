"""Names as the toolkit writes them into SQL."""

from __future__ import annotations

import re

from psycopg import sql
from psycopg.abc import AdaptContext


class Name(sql.Identifier):
    """An identifier, quoted as psycopg quotes it, except that a name holding ``%`` is
    written with PostgreSQL's Unicode escapes (``U&"a\\0025b"``). psycopg takes every
    ``%`` of a statement run with parameters for a placeholder, inside quotes too: a
    table ``a%%b`` would be written into ``a%b``, and ``p%s`` would take a parameter.
    Written so, a statement's text holds no ``%`` but its placeholders, with parameters
    or without."""

    def as_bytes(self, context: AdaptContext | None = None) -> bytes:
        if not any("%" in part for part in self._obj):
            return super().as_bytes(context)
        connection = context.connection if context is not None else None
        encoding = connection.info.encoding if connection is not None else "utf-8"
        return b".".join(_escaped(part).encode(encoding) for part in self._obj)


def _escaped(name: str) -> str:
    return 'U&"' + name.replace("\\", "\\\\").replace('"', '""').replace("%", "\\0025") + '"'


_QUOTED = re.compile(r'"((?:[^"]|"")*)"')  # a quoted identifier, in a text that holds no string literal


class Quoted(sql.Composable):
    """A name as PostgreSQL quotes it itself (``quote_ident``, Citus's ``shard_name``):
    written into SQL with its quoted parts that hold ``%`` as :class:`Name` writes them;
    ``text`` as PostgreSQL wrote it (what a ``regclass`` parameter reads)."""

    _obj: str

    def __init__(self, text: str) -> None:
        super().__init__(text)

    @property
    def text(self) -> str:
        return self._obj

    def as_bytes(self, context: AdaptContext | None = None) -> bytes:
        connection = context.connection if context is not None else None
        encoding = connection.info.encoding if connection is not None else "utf-8"
        written = _QUOTED.sub(lambda m: _escaped(m.group(1).replace('""', '"')) if "%" in m.group(1) else m.group(0),
                              self._obj)
        return written.encode(encoding)
