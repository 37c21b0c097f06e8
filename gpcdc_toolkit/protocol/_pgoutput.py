"""A decoder of PostgreSQL's pgoutput logical replication messages (pure, protocols 1 and 3).

Protocol 3 with ``two_phase`` adds the messages of prepared transactions: a
transaction is decoded at its PREPARE (``BeginPrepare``, its changes, ``Prepare``) and
its fate comes later, as ``CommitPrepared`` or ``RollbackPrepared``.

``parse(payload)`` turns the bytes of one CopyData ``XLogData`` payload into a
message object. Tuple values stay in PostgreSQL's text form, converted to Python
values by :func:`convert` for the types JSON has.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import StreamError

_U8 = struct.Struct(">B")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_BEGIN_PREPARE = struct.Struct(">QQqI")
_PREPARED = struct.Struct(">BQQqI")  # Prepare and CommitPrepared
_ROLLBACK_PREPARED = struct.Struct(">BQQqqI")

# Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
PG_EPOCH_US = 946_684_800_000_000

class _Unchanged:
    """The value of a TOASTed column an update did not change: the WAL does not carry it.
    A distinct object, never a string, so that no data can be mistaken for it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Any = _Unchanged()


class PgoutputError(StreamError, ValueError):
    """The bytes are not a pgoutput message this decoder knows."""


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the commit record's LSN
    commit_ts_us: int  # Unix epoch microseconds
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    is_key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    relid: int
    schema: str
    table: str
    replica_identity: str
    columns: tuple[Column, ...]

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True, slots=True)
class Insert:
    relid: int
    new: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Update:
    relid: int
    old: tuple[str | None, ...] | None  # the old key ('K') or old row ('O'), when sent
    old_is_key: bool
    new: tuple[str | None, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    relid: int
    old: tuple[str | None, ...]
    old_is_key: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    relids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: int  # the PREPARE record's LSN
    end_lsn: int
    prepare_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    prepare_lsn: int
    end_lsn: int
    prepare_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    commit_lsn: int  # the COMMIT PREPARED record's LSN
    end_lsn: int
    commit_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    prepare_end_lsn: int
    end_lsn: int  # of the ROLLBACK PREPARED record
    prepare_ts_us: int
    rollback_ts_us: int
    xid: int
    gid: str


@dataclass(frozen=True, slots=True)
class Other:
    """Origin and Type messages: carried, not used."""

    kind: str


PgoutputMessage = (Begin | Commit | Relation | Insert | Update | Delete | Truncate | Message | BeginPrepare | Prepare
                   | CommitPrepared | RollbackPrepared | Other)


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(0, pos)
    return buf[pos:end].decode(), end + 1


def _tuple(buf: bytes, pos: int) -> tuple[tuple[str | None, ...], int]:
    (count,) = _I16.unpack_from(buf, pos)
    pos += 2
    values: list[str | None] = []
    append = values.append
    for _ in range(count):
        kind = buf[pos]
        pos += 1
        if kind == 0x74:  # 't'
            (length,) = _U32.unpack_from(buf, pos)
            pos += 4
            if length > len(buf) - pos:
                raise PgoutputError(f"a column value of {length} bytes, but {len(buf) - pos} left in the message")
            append(buf[pos:pos + length].decode())
            pos += length
        elif kind == 0x6E:  # 'n'
            append(None)
        elif kind == 0x75:  # 'u'
            append(UNCHANGED_TOAST)
        else:
            raise PgoutputError(f"tuple column of kind {chr(kind)!r}: binary mode is not supported")
    return tuple(values), pos


def parse(buf: bytes) -> PgoutputMessage:
    if not buf:
        raise PgoutputError("empty pgoutput message")
    kind = buf[0]
    try:
        if kind == 0x49:  # 'I'
            (relid,) = _U32.unpack_from(buf, 1)
            if buf[5] != 0x4E:
                raise PgoutputError(f"INSERT without a new tuple (got {chr(buf[5])!r})")
            return Insert(relid, _tuple(buf, 6)[0])
        if kind == 0x42:  # 'B'
            final_lsn, ts, xid = _BEGIN.unpack_from(buf, 1)
            return Begin(final_lsn, ts + PG_EPOCH_US, xid)
        if kind == 0x43:  # 'C'
            _flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(buf, 1)
            return Commit(commit_lsn, end_lsn, ts + PG_EPOCH_US)
        if kind == 0x55:  # 'U'
            (relid,) = _U32.unpack_from(buf, 1)
            pos, old, old_is_key = 5, None, False
            if buf[pos] in (0x4B, 0x4F):  # 'K' old key, 'O' old row
                old_is_key = buf[pos] == 0x4B
                old, pos = _tuple(buf, pos + 1)
            if buf[pos] != 0x4E:
                raise PgoutputError(f"UPDATE without a new tuple (got {chr(buf[pos])!r})")
            return Update(relid, old, old_is_key, _tuple(buf, pos + 1)[0])
        if kind == 0x44:  # 'D'
            (relid,) = _U32.unpack_from(buf, 1)
            if buf[5] not in (0x4B, 0x4F):
                raise PgoutputError(f"DELETE without an old key (got {chr(buf[5])!r})")
            return Delete(relid, _tuple(buf, 6)[0], buf[5] == 0x4B)
        if kind == 0x4D:  # 'M'
            flags = buf[1]
            (lsn,) = _U64.unpack_from(buf, 2)
            prefix, pos = _string(buf, 10)
            (length,) = _U32.unpack_from(buf, pos)
            return Message(bool(flags & 1), lsn, prefix, bytes(buf[pos + 4:pos + 4 + length]))
        if kind == 0x52:  # 'R'
            (relid,) = _U32.unpack_from(buf, 1)
            schema, pos = _string(buf, 5)
            table, pos = _string(buf, pos)
            identity = chr(buf[pos])
            (count,) = _I16.unpack_from(buf, pos + 1)
            pos += 3
            columns = []
            for _ in range(count):
                flags = buf[pos]
                name, pos = _string(buf, pos + 1)
                (type_oid,) = _U32.unpack_from(buf, pos)
                pos += 8  # type oid and typmod
                columns.append(Column(name, type_oid, bool(flags & 1)))
            return Relation(relid, schema, table, identity, tuple(columns))
        if kind == 0x54:  # 'T'
            (count,) = _U32.unpack_from(buf, 1)
            options = buf[5]
            relids = struct.unpack_from(f">{count}I", buf, 6)
            return Truncate(tuple(relids), bool(options & 1), bool(options & 2))
        if kind == 0x62:  # 'b'
            lsn, end, ts, xid = _BEGIN_PREPARE.unpack_from(buf, 1)
            return BeginPrepare(lsn, end, ts + PG_EPOCH_US, xid, _string(buf, 1 + _BEGIN_PREPARE.size)[0])
        if kind in (0x50, 0x4B):  # 'P' prepare, 'K' commit prepared
            _flags, lsn, end, ts, xid = _PREPARED.unpack_from(buf, 1)
            gid = _string(buf, 1 + _PREPARED.size)[0]
            return (Prepare if kind == 0x50 else CommitPrepared)(lsn, end, ts + PG_EPOCH_US, xid, gid)
        if kind == 0x72:  # 'r'
            _flags, prepare_end, end, prepare_ts, ts, xid = _ROLLBACK_PREPARED.unpack_from(buf, 1)
            return RollbackPrepared(prepare_end, end, prepare_ts + PG_EPOCH_US, ts + PG_EPOCH_US, xid,
                                    _string(buf, 1 + _ROLLBACK_PREPARED.size)[0])
        if kind in (0x4F, 0x59):  # 'O' origin, 'Y' type
            return Other(chr(kind))
    except (struct.error, IndexError, ValueError) as e:
        if isinstance(e, PgoutputError):
            raise
        raise PgoutputError(f"truncated or malformed pgoutput {chr(kind)!r} message ({e})") from None
    raise PgoutputError(f"unknown pgoutput message type {chr(kind)!r}")


def _float(text: str) -> float | str:
    return text if text in ("NaN", "Infinity", "-Infinity") else float(text)  # JSON has no NaN or infinities


# The text of values in the stream and in the initial snapshot, whatever the server, the
# database, the role or the capture host (PGTZ, PGDATESTYLE, PGOPTIONS) would set: ISO
# dates that any target reads as the same day, times with their offset from UTC, floats
# written exactly, bytes in hex, money in the C locale's notation. The same WAL then
# always decodes to the same text, so that a row sent again after a restart is the same
# row, and a snapshot's row reads as the stream's would. Set in each session that writes
# such text: it overrides them all.
DECODING_SETTINGS = {"TimeZone": "UTC", "DateStyle": "ISO, MDY", "IntervalStyle": "postgres",
                     "extra_float_digits": "1", "bytea_output": "hex", "lc_monetary": "C"}

# The settings by which a server reads such text back, set in each session that writes
# it to a target: money in the notation it was printed in, an array's NULL elements as
# NULL (with array_nulls off, the text NULL), XML fragments taken (with xmloption
# document, refused). The ISO dates, the times with their offset and the intervals
# with every sign written read the same under any setting.
READING_SETTINGS = {"lc_monetary": DECODING_SETTINGS["lc_monetary"], "array_nulls": "on", "xmloption": "content"}


# The JSON form of a type's values (the others stay PostgreSQL's text): "b" a boolean,
# "i" an integer, "f" a float (NaN and the infinities as text). _rowjson.c knows them too.
_JSON_KINDS = {16: "b", 20: "i", 21: "i", 23: "i", 26: "i", 700: "f", 701: "f"}  # bool, int8/2/4, oid, float4/8
_CONVERTERS: dict[str, Callable[[str], Any]] = {"b": lambda text: text == "t", "i": int, "f": _float}


def json_kind(type_oid: int) -> str:
    """How a value of the type becomes JSON: "b", "i", "f", or "t" (it stays text)."""
    return _JSON_KINDS.get(type_oid, "t")


def converter(type_oid: int) -> Callable[[str], Any] | None:
    """How a value of the type becomes JSON's (None: it stays PostgreSQL's text)."""
    return _CONVERTERS.get(json_kind(type_oid))


def convert(type_oid: int, text: str | None) -> Any:
    """A JSON-friendly value: ints, floats and booleans as such, the rest as PostgreSQL's text."""
    to_json = converter(type_oid)
    if text is None or text is UNCHANGED_TOAST or to_json is None:
        return text
    return to_json(text)
