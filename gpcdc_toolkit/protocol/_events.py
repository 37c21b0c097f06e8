"""The wire format: the kinds of message on a pipeline's topics, how a reader tells
them apart, and the constants they share (pure). Capture writes these shapes
(:mod:`._assembler`); every reader tells a message's kind with :func:`kind_of`.

See docs/protocol.md for the meaning of each field.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

PROTOCOL_VERSION = 2  # 2: unchanged TOASTed values are listed in "unchanged", not written as a placeholder
COORDINATOR = -1  # the coordinator's content id; its messages go to the <prefix>.dtx topic
UNCHANGED = "unchanged"  # row event field: columns an update left out of "after" (TOASTed, not in the WAL)

Kind = Literal["row", "begin", "end", "resolved", "commit", "ddl", "pipeline", "lost", "repaired"]
KINDS: tuple[Kind, ...] = ("row", "begin", "end", "resolved", "commit", "ddl", "pipeline", "lost", "repaired")


class Source(TypedDict):
    version: int
    connector: str
    name: str
    db: str
    schema: str
    table: str
    segment: int
    txId: int
    commit_lsn: int
    ts_ms: int
    gxid: int | None
    seq: int
    one_phase: bool | None


class RowEvent(TypedDict, total=False):
    """A Debezium envelope; ``unchanged`` only on updates that left columns out."""

    before: dict[str, Any] | None
    after: dict[str, Any] | None
    source: Source
    op: Literal["c", "u", "d", "t"]
    ts_ms: int
    transaction: dict[str, Any]
    unchanged: list[str]


class TransactionEvent(TypedDict, total=False):
    """BEGIN or END of one segment's local transaction (END has the counts)."""

    status: Literal["BEGIN", "END"]
    id: str
    ts_ms: int
    event_count: int | None
    data_collections: list[dict[str, Any]] | None
    gxid: int | None
    one_phase: bool | None
    end_lsn: int
    segment: int
    xid: int
    commit_lsn: int
    commit_ts_ms: int


class Watermark(TypedDict, total=False):
    resolved: int
    resolved_ts_ms: int | None
    prepared: list[int]
    prepared_ts_ms: int | None
    segment: int
    ts_ms: int
    parts: int  # a numbered partition's: the number of the last part before it
    type: Literal["resolved"]  # on the coordinator's topic only


class CoordinatorRecord(TypedDict, total=False):
    """A distributed commit record, or a DDL record, from the coordinator."""

    type: Literal["commit", "ddl"]
    gxid: int
    segments: list[int] | None  # commit: the participants (None under legacy markers)
    all_parts_decoded: bool  # commit: every participant's part is in the stream (absent: one may have changed nothing)
    ddl_count: int  # commit: how many DDL records came before it in the same transaction
    syncpoint: dict[str, int]  # commit of a sync point only: each node's WAL position at the cut
    statement: str  # ddl
    segment: int
    xid: int
    commit_lsn: int
    commit_ts_ms: int


class PipelineMarker(TypedDict):
    type: Literal["pipeline"]
    pipeline: str  # the bootstrap's identity
    segment: int
    version: int


def is_pipeline_marker(value: Any, identity: str | None = None) -> bool:
    """Whether a decoded message is a pipeline marker (of ``identity``, when given)."""
    return (isinstance(value, dict) and kind_of(value) == "pipeline"
            and (identity is None or value.get("pipeline") == identity))


def kind_of(value: Mapping[str, Any]) -> Kind | None:
    """Which kind of message a decoded value is; None when it is none of them."""
    if "op" in value:
        return "row"
    status = value.get("status")
    if status == "BEGIN":
        return "begin"
    if status == "END":
        return "end"
    if value.get("resolved") is not None or value.get("type") == "resolved":
        return "resolved"
    kind = value.get("type")
    if kind in ("commit", "ddl", "pipeline", "lost", "repaired"):
        return kind  # type: ignore[no-any-return]
    return None


# Per kind: the fields readers cannot do without, and the type every known field must
# have when present. A message with a kind's markers that breaks these is malformed
# (another writer's, or damaged); a reader needing more fields says so itself.
_INT, _OPT_INT, _STR, _OPT_BOOL, _OPT_LIST = (int,), (int, type(None)), (str,), (bool, type(None)), (list, type(None))
_REQUIRED: dict[str, tuple[str, ...]] = {
    "row": ("op", "source"), "begin": ("segment", "commit_lsn"),
    "end": ("segment", "commit_lsn", "gxid", "one_phase", "commit_ts_ms"), "resolved": (),
    "commit": ("gxid", "segments", "commit_ts_ms", "commit_lsn"), "ddl": ("gxid", "statement"), "pipeline": (),
    "lost": ("segment", "reason"), "repaired": ("segment", "number", "xmax", "in_progress", "coordinator_lsn"),
}
_SOURCE_REQUIRED = ("segment", "commit_lsn", "seq")
_TYPES: dict[str, tuple[type, ...]] = {
    "op": _STR, "source": (dict,), "before": (dict, type(None)), "after": (dict, type(None)), "unchanged": (list,),
    "segment": _INT, "gxid": _OPT_INT, "xid": _OPT_INT, "commit_lsn": _INT, "commit_ts_ms": _INT, "one_phase": _OPT_BOOL,
    "event_count": _OPT_INT, "end_lsn": _OPT_INT, "resolved": _OPT_INT, "resolved_ts_ms": _OPT_INT,
    "prepared": _OPT_LIST, "prepared_ts_ms": _OPT_INT, "segments": _OPT_LIST, "ddl_count": _OPT_INT,
    "syncpoint": (dict, type(None)), "all_parts_decoded": _OPT_BOOL, "statement": _STR, "pipeline": _STR,
    "number": _OPT_INT, "parts": _OPT_INT,
    "reason": _STR, "xmax": _INT, "in_progress": (list,), "coordinator_lsn": _INT,
}
_SOURCE_TYPES: dict[str, tuple[type, ...]] = {
    "segment": _INT, "gxid": _OPT_INT, "txId": _OPT_INT, "commit_lsn": _INT, "ts_ms": _OPT_INT, "schema": _STR,
    "table": _STR, "seq": _INT, "one_phase": _OPT_BOOL,
}
_ITEMS = {"segments": int, "prepared": int, "unchanged": str}
# Readers keep these in 32-bit columns, every other integer in 64-bit ones.
_INT32 = frozenset({"segment", "seq", "event_count", "ddl_count", "segments"})


# Per field of a message, and of a row event's source: the exact types it may have (bool
# is an int to Python, never to the protocol), and the range of its integers.
_BOUND = {name: 1 << (31 if name in _INT32 else 63) for name in (*_TYPES, *_SOURCE_TYPES)}
_FIELDS = {name: (frozenset(allowed), _BOUND[name]) for name, allowed in _TYPES.items()}
_SOURCE_FIELDS = {name: (frozenset(allowed), _BOUND[name]) for name, allowed in _SOURCE_TYPES.items()}


def _out_of_range(name: str, value: Any) -> bool:
    bound = _BOUND.get(name, 1 << 63)
    values = value if isinstance(value, list) else [value]
    return any(type(v) is int and not -bound <= v < bound for v in values)


# The start of a value for a message's reason: bounded in depth (a str() of JSON nested a
# thousand deep would recurse past Python's limit) and in length.
_PREVIEW = reprlib.Repr()
_PREVIEW.maxlevel, _PREVIEW.maxlist, _PREVIEW.maxdict = 3, 4, 4


def _preview(value: Any) -> str:
    return (value if isinstance(value, str) else _PREVIEW.repr(value))[:40]


def _field_problem(holder: Mapping[str, Any], fields: Mapping[str, tuple[frozenset[type], int]]) -> str | None:
    """What is wrong with the first field of ``holder`` of a wrong type or out of range
    (checked in the order the message has them: a message has fewer fields than are
    known). Every message read passes here: one lookup per field."""
    for name, field in holder.items():
        spec = fields.get(name)
        if spec is None:
            continue
        kind = type(field)
        if kind not in spec[0]:
            return f"whose {name} is {kind.__name__} {_preview(field)!r}"
        if kind is int and not -spec[1] <= field < spec[1]:
            return f"whose {name} {str(field)[:40]} is out of range"
    return None


def lost_reason(value: Any) -> str | None:
    """Why a node's capture stopped for good, when ``value`` is a well-formed lost mark
    (None otherwise)."""
    if isinstance(value, dict) and kind_of(value) == "lost" and problem_of(value) is None:
        return str(value["reason"])
    return None


def problem_of(value: Any) -> str | None:
    """What makes a decoded message unreadable as the protocol's, or None when it is one
    of its kinds, with the fields readers cannot do without, every known field of its type."""
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    kind = kind_of(value)
    if kind is None:
        return "no kind of the protocol (no op, status, type or resolved field)"
    for name in _REQUIRED[kind]:
        if name not in value:
            return f"a {kind} message without {name}"
    problem = _field_problem(value, _FIELDS)
    if problem is not None:
        return f"a {kind} message {problem}"
    source = value.get("source") if kind == "row" else None
    if isinstance(source, dict):
        for name in _SOURCE_REQUIRED:
            if name not in source:
                return f"a row event's source without {name}"
        problem = _field_problem(source, _SOURCE_FIELDS)
        if problem is not None:
            return f"a row event's source {problem}"
    for name, wanted in _ITEMS.items():
        items = value.get(name)
        if isinstance(items, list) and not all(isinstance(i, wanted) and not isinstance(i, bool) for i in items):
            return f"a {kind} message whose {name} holds something other than {wanted.__name__}s"
        if isinstance(items, list) and _out_of_range(name, items):
            return f"a {kind} message whose {name} holds a number out of range"
    return None
