"""The WAL markers of distributed transactions (pure encode/decode).

They are transactional logical messages (``pg_logical_emit_message(true, ...)``), so
logical decoding delivers them inside the local transaction that wrote them:

==================  ==========  ==============================================  ============
prefix              node        content                                         legacy mode
==================  ==========  ==============================================  ============
``gpcdc.gxid``      segment     the gxid, first change of every local part       not written
``gpcdc.one_phase`` segment     the gxid, last change of a one-phase commit      not written
``gpcdc.commit``    coordinator ``{"gxid": n, "segments": [..]}`` (2PC only)     no segments
                               a sync point's adds ``"syncpoint": {node: LSN}``
``gpcdc.ddl``       coordinator ``{"gxid": n, "statement": "..."}``             same
==================  ==========  ==============================================  ============
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..errors import StreamError

GXID_PREFIX = "gpcdc.gxid"
ONE_PHASE_PREFIX = "gpcdc.one_phase"
COMMIT_PREFIX = "gpcdc.commit"
DDL_PREFIX = "gpcdc.ddl"
PREFIXES = (GXID_PREFIX, ONE_PHASE_PREFIX, COMMIT_PREFIX, DDL_PREFIX)


class MarkerError(StreamError, ValueError):
    """A logical message with a toolkit prefix whose content does not parse."""


@dataclass(frozen=True)
class GxidMarker:
    gxid: int


@dataclass(frozen=True)
class OnePhaseMarker:
    gxid: int


@dataclass(frozen=True)
class CommitRecord:
    gxid: int
    segments: tuple[int, ...] | None  # None: written in legacy mode, participants unknown
    # A sync point's record: each node's WAL position at the cut (content -> LSN).
    syncpoint: tuple[tuple[int, int], ...] | None = None


@dataclass(frozen=True)
class DdlRecord:
    gxid: int
    statement: str


Marker = GxidMarker | OnePhaseMarker | CommitRecord | DdlRecord


def encode(marker: Marker) -> tuple[str, str]:
    """The (prefix, content) pair to emit for a marker."""
    match marker:
        case GxidMarker(gxid):
            return GXID_PREFIX, str(gxid)
        case OnePhaseMarker(gxid):
            return ONE_PHASE_PREFIX, str(gxid)
        case CommitRecord(gxid, segments, syncpoint):
            body: dict[str, object] = {"gxid": gxid}
            if segments is not None:
                body["segments"] = list(segments)
            if syncpoint is not None:
                body["syncpoint"] = {str(node): lsn for node, lsn in syncpoint}
            return COMMIT_PREFIX, json.dumps(body, separators=(",", ":"))
        case DdlRecord(gxid, statement):
            return DDL_PREFIX, json.dumps({"gxid": gxid, "statement": statement}, separators=(",", ":"))
    raise TypeError(f"not a marker: {marker!r}")


def _gxid(value: object, prefix: str, content: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MarkerError(f"{prefix} message has no positive integer gxid: {content[:80]!r}")
    return value


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _syncpoint(body: dict[str, object], text: str) -> tuple[tuple[int, int], ...] | None:
    lsns = body.get("syncpoint")
    if lsns is None:
        return None
    if (not isinstance(lsns, dict) or not lsns
            or not all(re.fullmatch(r"-1|[0-9]+", n) and _natural(lsn) for n, lsn in lsns.items())):
        raise MarkerError(f"{COMMIT_PREFIX} message has a malformed sync point: {text[:80]!r}")
    return tuple(sorted((int(n), lsn) for n, lsn in lsns.items()))


def decode(prefix: str, content: str | bytes) -> Marker | None:
    """The marker in a logical message, or None when the prefix is not the toolkit's."""
    if prefix not in PREFIXES:
        return None
    text = content.decode() if isinstance(content, bytes) else content
    if prefix in (GXID_PREFIX, ONE_PHASE_PREFIX):
        if not text.isdigit():
            raise MarkerError(f"{prefix} message content is not a gxid: {text[:80]!r}")
        cls = GxidMarker if prefix == GXID_PREFIX else OnePhaseMarker
        return cls(_gxid(int(text), prefix, text))
    try:
        body = json.loads(text)
    except ValueError:
        raise MarkerError(f"{prefix} message content is not JSON: {text[:80]!r}") from None
    if not isinstance(body, dict):
        raise MarkerError(f"{prefix} message content is not a JSON object: {text[:80]!r}")
    gxid = _gxid(body.get("gxid"), prefix, text)
    if prefix == COMMIT_PREFIX:
        segments = body.get("segments")
        if segments is not None and (not isinstance(segments, list)
                                     or not all(_natural(s) for s in segments)):
            raise MarkerError(f"{prefix} message has a malformed segment list: {text[:80]!r}")
        return CommitRecord(gxid, None if segments is None else tuple(segments), _syncpoint(body, text))
    statement = body.get("statement")
    if not isinstance(statement, str):
        raise MarkerError(f"{prefix} message has no statement: {text[:80]!r}")
    return DdlRecord(gxid, statement)
