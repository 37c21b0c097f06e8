"""From one node's pgoutput stream to protocol events (pure: bytes in, messages out).

A :class:`TransactionAssembler` is fed the pgoutput payloads of one node in stream
order and returns the Kafka messages to produce, already encoded. On a segment each
committed local transaction becomes BEGIN, its row events and END; on the
coordinator, the distributed commit records and DDL records it carries.

Memory stays bounded: a transaction's events are held back only until
``max_buffered`` of them, so that small transactions can carry their one-phase flag
(which the WAL writes last) in every row event. A larger transaction is streamed:
its row events say ``one_phase: null``, and its END event carries the flag.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import ClusterChangedError, StreamError
from . import _markers as markers
from . import _pgoutput as pg
from ._events import COORDINATOR, PROTOCOL_VERSION, UNCHANGED, kind_of, problem_of
from ._startpoint import Repair, StartPoint

try:
    from ._rowjson import encode as _encode_tuple
except ImportError:  # built without a C compiler: every row takes the general path
    _encode_tuple = None  # type: ignore[assignment]


class ProtocolError(StreamError, ValueError):
    """The stream breaks the protocol: the message says where."""


class UnknownNodesError(ClusterChangedError, ValueError):
    """A commit decision lists nodes the pipeline's start point does not: they joined the
    cluster since the bootstrap (an expansion), and no slot of the pipeline decodes them."""

    def __init__(self, content: int, gxid: int, unknown: str, known: Iterable[int]) -> None:
        super().__init__(
            f"node {content}: gxid {gxid} has parts on {unknown}, which the pipeline's start point does not list "
            f"(it captures segments {sorted(known)}): nodes were added since the bootstrap",
            fix="extend the pipeline to the new segments (`gpcdc bootstrap extend`; a Citus source or the key "
                "dispatcher: bootstrap again), then start capture again (`gpcdc capture start`)")


def encoder_built() -> bool:
    """Whether row tuples are encoded by the compiled encoder (``_rowjson.c``); without
    it, every row takes the general path, about half capture's speed."""
    return _encode_tuple is not None


@dataclass(slots=True)
class Outbound:
    """One encoded Kafka message. ``kind``: row, begin, end, resolved, commit or ddl."""

    kind: str
    key: bytes | None
    value: bytes


def lost_marker(content: int, reason: str) -> Outbound:
    """The last message of a node's partition when its capture stops for good because
    the node changed under the pipeline (``reason``): nothing of the node comes after
    it, so a reader waits for none of its parts not arrived by then."""
    body = {"type": "lost", "segment": content, "reason": reason, "version": PROTOCOL_VERSION}
    return Outbound("lost", None, orjson.dumps(body))


def repaired_marker(repair: Repair) -> Outbound:
    """Written after a segment's lost mark by ``gpcdc bootstrap repair`` (or first after
    the pipeline's marker by ``gpcdc bootstrap extend``): the segment's stream goes on
    (or begins) from a new slot, and its part of every transaction the cut's
    snapshot sees is in the repair's copied rows (see :class:`Repair`)."""
    body = {"type": "repaired", "segment": repair.node.content, "number": repair.number,
            "xmax": repair.snapshot.xmax, "in_progress": sorted(repair.snapshot.in_progress),
            "coordinator_lsn": repair.coordinator_lsn, "version": PROTOCOL_VERSION}
    if repair.joined:
        body["joined"] = True
    return Outbound("repaired", None, orjson.dumps(body))


def pipeline_marker(identity: str, content: int, *, numbered: bool = False) -> Outbound:
    """The first message of each of a pipeline's partitions: which bootstrap wrote it,
    and for a numbered stream, that no part comes before it (``parts``: 0)."""
    body: dict[str, Any] = {"type": "pipeline", "pipeline": identity, "segment": content, "version": PROTOCOL_VERSION}
    if numbered:
        body["parts"] = 0
    return Outbound("pipeline", None, orjson.dumps(body))


def numbering_of(value: Mapping[str, Any]) -> tuple[int, int] | None:
    """What a message of a numbered partition says of the parts before it, as (LSN,
    number): every commit up to that LSN is in the partition, the last of them the
    part of that number. None: it says nothing of them (a malformed message says
    nothing). A restarted capture session numbers on from the latest such message and
    hands out nothing up to its LSN."""
    if problem_of(value) is not None:
        return None
    kind = kind_of(value)
    if kind == "end" and (number := value.get("number")) is not None:
        return value["commit_lsn"], number
    if kind == "resolved" and (parts := value.get("parts")) is not None and (lsn := value.get("resolved")) is not None:
        return lsn, parts
    if kind == "pipeline" and (parts := value.get("parts")) is not None:
        return -1, parts
    return None


# The field of each kind of message that carries its partition's numbering.
_NUMBER_FIELD = {"pipeline": "parts", "end": "number", "resolved": "parts"}


def shows_unnumbered(value: Mapping[str, Any]) -> bool:
    """Whether a message of a segment partition shows that its parts are not numbered
    (a pipeline bootstrapped before they were): a pipeline marker that counts no parts,
    or an END or a watermark that carries no number; every one of them carries one in
    a numbered partition. A malformed message shows nothing."""
    field = _NUMBER_FIELD.get(kind_of(value) or "")
    return field is not None and value.get(field) is None and problem_of(value) is None


def _qualified(schema: str, name: str) -> str:
    return f"{schema}.{name}"


@dataclass(slots=True)
class _Table:
    qualified: str
    columns: tuple[str, ...]
    typed: tuple[tuple[int, str, Callable[[str], Any]], ...]  # (position, name, converter) of non-text columns
    key_columns: tuple[str, ...]
    source: bytes  # its part of a row event's "source", encoded once
    # For the compiled encoder (None: every row of it takes the general path): each
    # column's name as JSON with its colon, and its JSON kind, upper case for a key column.
    layout: tuple[tuple[bytes, ...], bytes] | None

    @classmethod
    def of(cls, relation: pg.Relation, schema: str, name: str) -> _Table:
        columns = relation.columns
        names = tuple(c.name for c in columns)
        kinds = "".join(pg.json_kind(c.type_oid).upper() if c.is_key else pg.json_kind(c.type_oid) for c in columns)
        # A name said twice (no server sends it) makes an image whose last value wins: the general path's.
        layout = ((tuple(orjson.dumps(n) + b":" for n in names), kinds.encode())
                  if _encode_tuple is not None and len(set(names)) == len(names) else None)
        return cls(_qualified(schema, name), names,
                   tuple((i, c.name, to_json) for i, c in enumerate(columns)
                         if (to_json := pg.converter(c.type_oid)) is not None),
                   tuple(c.name for c in columns if c.is_key),
                   b'"schema":%b,"table":%b,' % (orjson.dumps(schema), orjson.dumps(name)), layout)

    def encoded(self, payload: bytes, pos: int) -> tuple[bytes, bytes | None, int] | None:
        """The tuple at ``payload[pos:]`` as (image, key, end), both as JSON, by the
        compiled encoder; None when it leaves the tuple to the general path."""
        if self.layout is None:
            return None
        return _encode_tuple(payload, pos, *self.layout)

    def image(self, values: tuple[str | None, ...]) -> dict[str, Any]:
        # Most columns stay text: only the others are converted (one row in every event).
        image = dict(zip(self.columns, values))
        for position, name, to_json in self.typed:
            value = values[position]
            if value is not None and value is not pg.UNCHANGED_TOAST:
                try:
                    image[name] = to_json(value)
                except ValueError:
                    raise ValueError(f"column {name!r} holds {value[:40]!r}, not a value of its type") from None
        return image

    def key(self, image: dict[str, Any]) -> bytes | None:
        if not self.key_columns:
            return None
        return orjson.dumps({column: image[column] for column in self.key_columns})


@dataclass(slots=True)
class _Row:
    """A row event's own parts, encoded, held until its transaction's are final (the
    gxid and one-phase flag a later marker gives, or for a Citus part merged with
    others, its place among them): see ``TransactionAssembler._encode``."""

    table: _Table
    op: bytes  # b"c", b"u", b"d" or b"t"
    before: bytes  # the row images as JSON (b"null": none)
    after: bytes
    key: bytes | None
    seq: int
    order: int  # its place among the transaction's changes of its table
    ts_ms: int  # when it was decoded
    unchanged: bytes = b""  # b',"unchanged":[...]' for the columns an update left out


# A row event, Debezium's envelope: the keys in this order, as documented in protocol.md.
_ROW_EVENT = (b'{"before":%b,"after":%b,"source":{%b%b%b"seq":%d,"one_phase":%b},"op":"%b","ts_ms":%d,'
              b'"transaction":{"id":%b,"total_order":%d,"data_collection_order":%d}%b}')
_ONE_PHASE = {None: b"null", True: b"true", False: b"false"}
_ROW_CHANGES = (b"I", b"U", b"D")


@dataclass(slots=True)
class _Txn:
    begin: pg.Begin
    gxid: int | None = None
    one_phase: bool = False
    decided: bool = False  # whether the start point's filter has judged it
    dropped: bool = False
    streaming: bool = False  # buffer overflowed: events go out as they come
    held: bool = False  # its fate comes later (a prepared part): never streamed before it
    resent: bool = False  # in Kafka already, before the point this session resumed numbering from
    number: int | None = None  # its place among the node's parts handed out (when numbered)
    seq: int = 0
    pending: list[_Row] | None = None  # row events held back
    records: list[dict[str, Any]] | None = None  # the coordinator's: its commit and DDL records
    counts: dict[str, int] | None = None


class TransactionAssembler:
    def __init__(
        self,
        content: int,
        *,
        source_name: str,
        database: str,
        start: StartPoint | None = None,
        max_buffered: int = 1000,
        clock: Callable[[], float] = time.time,
        numbered_after: tuple[int, int] | None = None,
    ) -> None:
        self.content = content
        self.source_name = source_name
        self.database = database
        self.start = start
        self.max_buffered = max_buffered
        self.clock = clock
        self._tables: dict[int, _Table] = {}
        self._ignored: set[int] = set()  # relations whose changes are not the stream's (see table_of)
        self._txn: _Txn | None = None
        self.completed_end_lsn: int | None = None  # end LSN of the last commit fully handled
        self.last_commit_ts_ms: int | None = None  # commit time of the last transaction handed out
        self.transactions = 0
        self.dropped_transactions = 0
        self.rolled_back_parts = 0  # prepared parts rolled back (two-phase decoding only)
        # Numbering: each part handed out gets the next number, and each watermark the
        # number of the last part before it, so that a reader finds a lost part by the
        # gap it leaves. ``numbered_after`` is (LSN, number) as the partition's tail
        # says: parts committed up to that LSN are there already (numbered up to that
        # number), and are not handed out again.
        self.numbered = numbered_after is not None
        self.resent_up_to, self.parts_handed_out = numbered_after or (-1, 0)
        self.row_events = 0
        self._source = b'"version":%d,"connector":"gpcdc","name":%b,"db":%b,' % (
            PROTOCOL_VERSION, orjson.dumps(source_name), orjson.dumps(database))

    @property
    def in_transaction(self) -> bool:
        return self._txn is not None

    @property
    def ack_limit(self) -> int | None:
        """The furthest LSN the slot may be acknowledged to while transactions decoded
        but not yet handed out are held (None: no limit beyond what was handed out)."""
        return None

    @property
    def held_from(self) -> int | None:
        """The commit LSN of the first commit decoded but held back (None: none is):
        a watermark must stay below it."""
        return None

    def table_of(self, schema: str, relation: str) -> tuple[str, str] | None:
        """The table whose changes a relation's are (schema, name), or None when its
        changes are not the stream's. Every relation is its own table here."""
        return schema, relation

    # -- the stream ------------------------------------------------------------------
    def feed(self, payload: bytes) -> list[Outbound]:
        if payload[:1] in _ROW_CHANGES and self._txn is not None and self.content != COORDINATOR:
            out = self._encoded_row(payload)
            if out is not None:
                return out
        return self._on(pg.parse(payload))

    def _on(self, message: pg.PgoutputMessage) -> list[Outbound]:
        if isinstance(message, (pg.Insert, pg.Update, pg.Delete)):
            return self._row(message)
        if isinstance(message, pg.Begin):
            if self._txn is not None:
                raise ProtocolError(f"node {self.content}: BEGIN of xid {message.xid} inside xid {self._txn.begin.xid}")
            self._txn = _Txn(message, pending=[], counts={}, records=[])
            return []
        if isinstance(message, pg.Commit):
            return self._commit(message)
        if isinstance(message, pg.Message):
            return self._message(message)
        if isinstance(message, pg.Relation):
            named = self.table_of(message.schema, message.table)
            if named is None:
                self._tables.pop(message.relid, None)
                self._ignored.add(message.relid)
                return []
            self._ignored.discard(message.relid)
            schema, name = named
            self._tables[message.relid] = _Table.of(message, schema, name)
            return []
        if isinstance(message, pg.Truncate):
            return self._truncate(message)
        return []

    def _current(self, what: str) -> _Txn:
        if self._txn is None:
            raise ProtocolError(f"node {self.content}: {what} outside a transaction")
        return self._txn

    def _decide(self, txn: _Txn) -> None:
        if not txn.decided and not txn.held:  # a prepared part is judged once it commits
            txn.decided = True
            if self.numbered and txn.begin.final_lsn <= self.resent_up_to and self.content != COORDINATOR:
                txn.dropped = txn.resent = True
                return
            if self.start is not None and not self.start.captures(self.content, txn.begin.final_lsn, txn.gxid,
                                                                  txn.begin.xid):
                txn.dropped = True

    def _message(self, message: pg.Message) -> list[Outbound]:
        if not message.transactional:
            return []
        try:
            marker = markers.decode(message.prefix, message.content)
        except markers.MarkerError as e:
            raise ProtocolError(f"node {self.content}, LSN {message.lsn}: {e}") from None
        if marker is None:
            return []
        txn = self._current(f"marker {message.prefix}")
        if isinstance(marker, markers.GxidMarker):
            txn.gxid = marker.gxid
        elif isinstance(marker, markers.OnePhaseMarker):
            txn.one_phase = True
            txn.gxid = txn.gxid or marker.gxid
        elif self.content == COORDINATOR:
            txn.gxid = marker.gxid
            self._decide(txn)
            if txn.dropped:
                return []
            body: dict[str, Any] = {"type": "commit" if isinstance(marker, markers.CommitRecord) else "ddl",
                                    "gxid": marker.gxid}
            if isinstance(marker, markers.CommitRecord):
                self._known_nodes(marker.gxid, marker.segments or ())
                body["segments"] = list(marker.segments) if marker.segments is not None else None
                # Each participant wrote its gxid marker in its part: every part listed is
                # decoded, so one that does not come is missing, never one that changed nothing.
                body["all_parts_decoded"] = True
                if marker.syncpoint is not None:
                    body["syncpoint"] = {str(node): lsn for node, lsn in marker.syncpoint}
            else:
                body["statement"] = marker.statement
            body.update(self._position(txn))
            txn.records.append(body)  # type: ignore[union-attr]
        return []

    def _known_nodes(self, gxid: int, segments: Iterable[int]) -> None:
        """A decision naming segments the start point does not (added since the
        bootstrap) stops capture: their parts are decoded by no slot of the pipeline."""
        if self.start is None:
            return
        known = {n.content for n in self.start.captured_nodes}
        unknown = set(segments) - known
        if unknown:
            raise UnknownNodesError(self.content, gxid, f"segments {sorted(unknown)}", known - {COORDINATOR})

    def _position(self, txn: _Txn) -> dict[str, Any]:
        return {"segment": self.content, "xid": txn.begin.xid, "commit_lsn": txn.begin.final_lsn,
                "commit_ts_ms": txn.begin.commit_ts_us // 1000}

    def _row(self, message: pg.Insert | pg.Update | pg.Delete) -> list[Outbound]:
        txn = self._current("a row change")
        if self.content == COORDINATOR:
            return []  # the coordinator stores no user rows
        if message.relid in self._ignored:
            return []
        self._decide(txn)
        if txn.dropped:
            return []
        table = self._tables.get(message.relid)
        if table is None:
            raise ProtocolError(f"node {self.content}: a change of relation {message.relid} before its RELATION message")
        if isinstance(message, pg.Insert):
            image = self._image(table, message.new)
            return self._emit_row(txn, table, b"c", b"null", orjson.dumps(image), table.key(image))
        if isinstance(message, pg.Delete):
            image = self._image(table, message.old)
            return self._emit_row(txn, table, b"d", orjson.dumps(image), b"null", table.key(image))
        after = self._image(table, message.new)
        before = self._image(table, message.old) if message.old is not None else None
        unchanged: list[str] | None = None
        if pg.UNCHANGED_TOAST in message.new:
            # Not in the WAL: listed apart, so that no value can pass for the marker.
            unchanged = [c for c, v in zip(table.columns, message.new) if v is pg.UNCHANGED_TOAST]
            for column in unchanged:
                del after[column]
            if before is not None:
                before = {c: v for c, v in before.items() if v is not pg.UNCHANGED_TOAST}
            for column in table.key_columns:  # an unchanged key the WAL left out: from the old row, if logged
                if column not in after:
                    if before is None or column not in before:
                        raise ProtocolError(
                            f"node {self.content}: an update of {table.qualified} leaves out its key column "
                            f"{column!r} (a TOASTed value the WAL does not carry), so the row cannot be named; "
                            f"run ALTER TABLE {table.qualified} REPLICA IDENTITY FULL on the source")
                    after[column] = before[column]
                    unchanged.remove(column)
        return self._emit_row(txn, table, b"u", orjson.dumps(before), orjson.dumps(after), table.key(after),
                              unchanged)

    def _image(self, table: _Table, values: tuple[str | None, ...]) -> dict[str, Any]:
        if len(values) != len(table.columns):
            raise ProtocolError(f"node {self.content}: a change of {table.qualified} has {len(values)} values, "
                                f"but its RELATION message {len(table.columns)} columns")
        try:
            return table.image(values)
        except ValueError as e:  # a number's or a float's text that is none
            raise ProtocolError(f"node {self.content}: a change of {table.qualified}: {e}") from None

    def _encoded_row(self, payload: bytes) -> list[Outbound] | None:
        """A row change the compiled encoder turns into JSON straight from the payload;
        None when it is not the usual case, left to the general path (``_row``), which
        decodes it or says what is wrong with it."""
        if len(payload) < 6:
            return None
        table = self._tables.get(int.from_bytes(payload[1:5]))
        if table is None:
            return None
        kind, tag = payload[0], payload[5]
        if tag == 0x4E and kind != 0x44:  # INSERT, or UPDATE with no old values: the new tuple
            if (new := table.encoded(payload, 6)) is None:
                return None
            return self._emit_encoded(table, b"c" if kind == 0x49 else b"u", b"null", new[0], new[1])
        if tag not in (0x4B, 0x4F):  # an old key or old row: DELETE's, or UPDATE's before its new tuple
            return None
        if (old := table.encoded(payload, 6)) is None:
            return None
        if kind == 0x44:  # DELETE
            return self._emit_encoded(table, b"d", old[0], b"null", old[1])
        end = old[2]
        if kind != 0x55 or end >= len(payload) or payload[end] != 0x4E or (new := table.encoded(payload, end + 1)) is None:
            return None
        return self._emit_encoded(table, b"u", old[0], new[0], new[1])

    def _emit_encoded(self, table: _Table, op: bytes, before: bytes, after: bytes, key: bytes | None) -> list[Outbound]:
        txn = self._txn
        assert txn is not None
        self._decide(txn)
        return self._emit_row(txn, table, op, before, after, key)

    def _truncate(self, message: pg.Truncate) -> list[Outbound]:
        txn = self._current("TRUNCATE")
        if self.content == COORDINATOR:
            return []
        self._decide(txn)
        out: list[Outbound] = []
        for relid in message.relids:
            if relid in self._ignored:
                continue
            table = self._tables.get(relid)
            if table is None:
                raise ProtocolError(f"node {self.content}: TRUNCATE of relation {relid} before its RELATION message")
            out += self._emit_row(txn, table, b"t", b"null", b"null", None)
        return out

    def _emit_row(self, txn: _Txn, table: _Table, op: bytes, before: bytes, after: bytes, key: bytes | None,
                  unchanged: list[str] | None = None) -> list[Outbound]:
        if txn.dropped:
            return []
        txn.seq += 1
        counts = txn.counts if txn.counts is not None else {}
        order = counts[table.qualified] = counts.get(table.qualified, 0) + 1
        row = _Row(table, op, before, after, key, txn.seq, order, int(self.clock() * 1000),
                   b",%b:%b" % (orjson.dumps(UNCHANGED), orjson.dumps(unchanged)) if unchanged else b"")
        self.row_events += 1
        if txn.streaming:
            return self._encode(txn, [row], None)
        txn.pending.append(row)  # type: ignore[union-attr]
        if txn.held or len(txn.pending) < self.max_buffered:  # type: ignore[arg-type]
            return []
        # Too large to hold back: send what is held, and stream the rest.
        txn.streaming = True
        out = [self._begin(txn)] + self._encode(txn, txn.pending, None)  # type: ignore[arg-type]
        txn.pending = None
        return out

    def _encode(self, txn: _Txn, rows: list[_Row], one_phase: bool | None) -> list[Outbound]:
        """Row events as Kafka messages, the transaction's fields as they are now."""
        begin = txn.begin
        position = b'"segment":%d,"txId":%d,"commit_lsn":%d,"ts_ms":%d,"gxid":%b,' % (
            self.content, begin.xid, begin.final_lsn, begin.commit_ts_us // 1000, orjson.dumps(txn.gxid))
        txid, flag, source = orjson.dumps(self._txid(txn)), _ONE_PHASE[one_phase], self._source
        return [Outbound("row", row.key, _ROW_EVENT % (
            row.before, row.after, source, row.table.source, position, row.seq, flag, row.op, row.ts_ms, txid,
            row.seq, row.order, row.unchanged)) for row in rows]

    def _txid(self, txn: _Txn) -> str:
        return f"{self.content}:{txn.begin.xid}"

    def _begin(self, txn: _Txn) -> Outbound:
        body = {"status": "BEGIN", "id": self._txid(txn), "ts_ms": txn.begin.commit_ts_us // 1000,
                "event_count": None, "data_collections": None, "gxid": txn.gxid, **self._position(txn),
                **self._number(txn)}
        return Outbound("begin", None, orjson.dumps(body))

    def _number(self, txn: _Txn) -> dict[str, int]:
        """The part's number, given when its BEGIN goes out (none when not numbered)."""
        if not self.numbered:
            return {}
        if txn.number is None:
            self.parts_handed_out += 1
            txn.number = self.parts_handed_out
        return {"number": txn.number}

    def _commit(self, commit: pg.Commit) -> list[Outbound]:
        return self._finish(self._closed(commit), commit.end_lsn)

    def _closed(self, commit: pg.Commit) -> _Txn:
        """The transaction a COMMIT ends, checked against its BEGIN."""
        txn = self._current("COMMIT")
        self._txn = None
        if commit.commit_lsn != txn.begin.final_lsn:
            raise ProtocolError(
                f"node {self.content}: xid {txn.begin.xid} commits at {commit.commit_lsn}, "
                f"but its BEGIN announced {txn.begin.final_lsn}"
            )
        self.completed_end_lsn = commit.end_lsn
        return txn

    def _finish(self, txn: _Txn, end_lsn: int) -> list[Outbound]:
        """The messages of a committed local transaction (none when the start point
        puts it in the initial snapshot)."""
        self._decide(txn)
        if txn.dropped:
            self.dropped_transactions += not txn.resent
            return []
        self.transactions += 1
        self.last_commit_ts_ms = txn.begin.commit_ts_us // 1000
        if self.content == COORDINATOR:
            bodies = txn.records or []
            ddl = sum(body["type"] == "ddl" for body in bodies)
            for body in bodies:
                if body["type"] == "commit":
                    body["ddl_count"] = ddl  # so that a reader knows none of them was lost
            return [Outbound(body["type"], None, orjson.dumps(body)) for body in bodies]
        if txn.seq == 0 and txn.gxid is None:
            return []  # nothing of ours: an empty or catalog-only local transaction
        # Unknown for a part without a gxid that is not marked one-phase (legacy markers).
        one_phase = True if txn.one_phase else (False if txn.gxid is not None else None)
        out = [] if txn.streaming else [self._begin(txn)]
        out += self._encode(txn, txn.pending or [], one_phase)
        end = {"status": "END", "id": self._txid(txn), "ts_ms": txn.begin.commit_ts_us // 1000,
               "event_count": txn.seq,
               "data_collections": [{"data_collection": t, "event_count": n} for t, n in (txn.counts or {}).items()],
               "gxid": txn.gxid, "one_phase": one_phase, "end_lsn": end_lsn, **self._position(txn),
               **self._number(txn)}
        out.append(Outbound("end", None, orjson.dumps(end)))
        return out

    def resolved(self, lsn: int, resolved_ts_ms: int | None = None, *, prepared: list[int] | None = None,
                 prepared_ts_ms: int | None = None) -> Outbound:
        """A watermark: every commit of this node below ``lsn`` has been handed out, and
        so has every commit made before ``resolved_ts_ms`` by the node's clock.

        ``prepared`` lists the gxids whose parts the node held prepared (not committed)
        when read, no earlier than ``prepared_ts_ms`` by its clock and no later than
        ``resolved_ts_ms``: a part prepared before then and not listed had committed, so
        it is before this watermark, or it was rolled back."""
        if self._txn is not None:
            raise ProtocolError(f"node {self.content}: a watermark inside xid {self._txn.begin.xid}")
        body: dict[str, Any] = {"resolved": lsn, "resolved_ts_ms": resolved_ts_ms, "segment": self.content,
                                "ts_ms": int(self.clock() * 1000)}
        if prepared is not None:
            body["prepared"] = sorted(prepared)
            body["prepared_ts_ms"] = prepared_ts_ms
        if self.numbered and self.content != COORDINATOR:
            body["parts"] = self.parts_handed_out  # the number of the last part before this watermark
            # The count and the LSN go together (see ``numbering_of``): a session restarted
            # below the partition's tail counts parts it has not read again yet, so its
            # watermark's LSN is the tail's until it reads past it. Were it lower, a session
            # restarted after this watermark would hand out those parts again, numbered anew.
            body["resolved"] = max(lsn, self.resent_up_to)
        if self.content == COORDINATOR:
            body["type"] = "resolved"
        return Outbound("resolved", None, orjson.dumps(body))
