"""The wire format: the kinds of message on a pipeline's topics, how a reader tells
them apart, and the constants they share (pure). Capture writes these shapes
(:mod:`._assembler`); every reader tells a message's kind with :func:`kind_of`.

See docs/protocol.md for the meaning of each field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

PROTOCOL_VERSION = 2  # 2: unchanged TOASTed values are listed in "unchanged", not written as a placeholder
COORDINATOR = -1  # the coordinator's content id; its messages go to the <prefix>.dtx topic
UNCHANGED = "unchanged"  # row event field: columns an update left out of "after" (TOASTed, not in the WAL)

Kind = Literal["row", "begin", "end", "resolved", "commit", "ddl", "pipeline"]
KINDS: tuple[Kind, ...] = ("row", "begin", "end", "resolved", "commit", "ddl", "pipeline")


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
    type: Literal["resolved"]  # on the coordinator's topic only


class CoordinatorRecord(TypedDict, total=False):
    """A distributed commit record, or a DDL record, from the coordinator."""

    type: Literal["commit", "ddl"]
    gxid: int
    segments: list[int] | None  # commit: the participants (None under legacy markers)
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
    if kind in ("commit", "ddl", "pipeline"):
        return kind  # type: ignore[no-any-return]
    return None
