"""From a Citus node's two-phase pgoutput stream to protocol events (pure).

A Citus write that spans workers commits with two-phase commit: each worker
connection's part is prepared with a gid ``citus_<group>_<pid>_<number>_<connection>``
(the initiating node's group, its backend pid, the distributed transaction number,
the connection), the coordinator's local transaction inserts one
``pg_dist_transaction`` row ``(groupid, gid)`` per prepared part and commits (the
decision), and the parts are then committed with ``COMMIT PREPARED``. A write on one
worker connection commits in one phase, with no gid.

So on a worker (:class:`CitusStream` with content >= 0):

* a part is decoded at its PREPARE and held until its fate comes: ``COMMIT PREPARED``
  hands it out as a committed local transaction whose gxid comes from the gid (parts
  rolled back are dropped and counted);
* the parts of one distributed transaction on one worker (one per connection) are
  handed out as one part, at the first one's commit, once all of them committed:
  they hold disjoint rows (a shard stays on its connection within a transaction),
  and until the last commits, what the worker commits after the first is held
  behind them, so the partition keeps the worker's commit order;
* a plain COMMIT is a one-phase transaction with no gxid;
* the slot is acknowledged only where no prepared transaction of the worker
  straddles it (PREPARE before it, a COMMIT PREPARED at or after it): a session
  restarted there is sent a transaction whole or not at all, never a COMMIT PREPARED
  whose PREPARE it did not see.

On the coordinator, each local transaction that inserts ``pg_dist_transaction`` rows
is a distributed commit decision: it becomes the commit record, listing the workers
of its parts. Rows arrive under shard names (``acct_102008``); ``table_of`` names the
distributed table, and changes of any other relation are not the stream's.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..protocol import COORDINATOR, Outbound, ProtocolError, TransactionAssembler
from ..protocol import _pgoutput as pg
from ..protocol._assembler import UnknownNodesError, _Txn

_GID = re.compile(r"citus_(\d+)_(\d+)_(\d+)_(\d+)")
DECISIONS = ("pg_catalog", "pg_dist_transaction")  # the coordinator's table of commit decisions
COORDINATOR_GROUP = 0
_PID_BITS = 22  # Linux's pid_max is at most 2^22


def _is_decisions(schema: str, relation: str) -> bool:
    # pgoutput names pg_catalog's relations with an empty schema.
    return relation == DECISIONS[1] and schema in ("", DECISIONS[0])


class CitusGidError(ProtocolError):
    """A prepared transaction's gid that capture cannot take as a coordinator's part."""


_SYNCPOINT_GID = re.compile(r"gpcdc_(\d+)")
_SYNCPOINT_BIT = 1 << 62  # above every gxid a Citus gid packs into


def syncpoint_gxid(number: int) -> int:
    """The gxid of a sync point (``number``: unique to it, below 2^62); its parts are
    prepared as ``gpcdc_<gxid>``."""
    return _SYNCPOINT_BIT | number % _SYNCPOINT_BIT


def gxid_of_gid(gid: str) -> int | None:
    """The gxid of a Citus part's distributed transaction, from its gid; None when
    the gid is not Citus's (or a sync point's). The parts of one transaction share it:
    the transaction number and the initiating backend's pid, packed into 62 bits.

    Only transactions the coordinator initiates are captured whole (their decision is
    in the coordinator's ``pg_dist_transaction``): a gid from another group is refused."""
    if (syncpoint := _SYNCPOINT_GID.fullmatch(gid)) is not None:
        gxid = int(syncpoint[1])
        return gxid if gxid & _SYNCPOINT_BIT and gxid < 1 << 63 else None
    match = _GID.fullmatch(gid)
    if match is None:
        return None
    group, pid, number = int(match[1]), int(match[2]), int(match[3])
    if group != COORDINATOR_GROUP:
        raise CitusGidError(
            f"prepared transaction {gid!r} was initiated by node group {group}, not the coordinator: its commit "
            "decision is in that node's pg_dist_transaction, which capture does not read")
    if pid >= 1 << _PID_BITS or number >= 1 << (62 - _PID_BITS):
        raise CitusGidError(f"prepared transaction {gid!r} has a pid or transaction number too large to pack into a gxid")
    return number << _PID_BITS | pid


@dataclass
class _Merge:
    """The parts of one distributed transaction on this worker, committed so far, and
    the gids of those still prepared."""

    gxid: int
    parts: list[_Txn] = field(default_factory=list)
    waiting: set[str] = field(default_factory=set)
    end_lsn: int = 0
    prepared_from: int = 0  # the earliest PREPARE LSN of the parts committed so far
    last_commit: int = 0  # the latest COMMIT PREPARED LSN of the parts committed so far


class CitusStream(TransactionAssembler):
    """A :class:`TransactionAssembler` for a Citus node; see the module docstring.

    ``shards(schema, relation)`` names the distributed table a shard belongs to, or
    None; ``groups`` maps worker node groups to contents."""

    def __init__(self, content: int, *, shards: Callable[[str, str], tuple[str, str] | None],
                 groups: Mapping[int, int], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.shards = shards
        self.groups = dict(groups)
        self._prepared: dict[str, tuple[_Txn, int]] = {}  # gid -> (part, its PREPARE's LSN)
        self._merges: dict[int, _Merge] = {}  # gxid -> parts committed while siblings are still prepared
        self._queue: deque[_Merge | Callable[[], list[Outbound]]] = deque()  # handed out in this order
        self._held_commits: deque[int] = deque()  # commit LSNs of what the queue holds back
        self._decision_columns: dict[int, tuple[int, int]] = {}  # relid -> positions of groupid, gid
        # (first PREPARE, last COMMIT PREPARED) of the prepared transactions committed whole,
        # those the acknowledgement may still fall inside; and where it may go (see _settle)
        self._spans: list[tuple[int, int]] = []
        self._ack_limit: int | None = None
        self._decisions: list[tuple[int, str]] = []  # (groupid, gid) rows of the coordinator's open transaction

    # -- what the worker may acknowledge ------------------------------------------------
    @property
    def ack_limit(self) -> int | None:
        return self._ack_limit

    def _settle(self) -> None:
        """Where the slot may be acknowledged to. A part decoded at its PREPARE is not
        decoded again once the slot is past that PREPARE: a restarted session would get
        its COMMIT PREPARED alone (a part it cannot hand out, or one already handed out it
        cannot tell apart), or a transaction's later parts without its earlier ones. So the
        limit is at or before the PREPARE of every part not yet handed out, then moved back
        to the start of any transaction committed whole that straddles it, until none does.
        A limit once found stays valid (what is prepared later is past it), so it never
        goes back, and spans ending before it can never straddle it again."""
        opened = [lsn for _txn, lsn in self._prepared.values()]
        opened += [held.prepared_from for held in self._queue if isinstance(held, _Merge)]
        if not opened:  # whatever comes next begins past every span decoded so far
            self._spans.clear()
            self._ack_limit = None
            return
        limit = min(opened)
        straddling = True
        while straddling:
            straddling = False
            for first, last in self._spans:
                if first < limit <= last:
                    limit, straddling = first, True
        if self._ack_limit is not None:
            limit = max(limit, self._ack_limit)
        self._ack_limit = limit
        self._spans = [span for span in self._spans if span[1] >= limit]

    @property
    def held_from(self) -> int | None:
        return self._held_commits[0] if self._held_commits else None

    def table_of(self, schema: str, relation: str) -> tuple[str, str] | None:
        if self.content == COORDINATOR:
            return DECISIONS if _is_decisions(schema, relation) else None
        return self.shards(schema, relation)

    # -- the stream ---------------------------------------------------------------------
    def _on(self, message: pg.PgoutputMessage) -> list[Outbound]:
        if isinstance(message, pg.BeginPrepare):
            if self._txn is not None:
                raise ProtocolError(f"node {self.content}: BEGIN PREPARE of {message.gid!r} inside xid {self._txn.begin.xid}")
            self._txn = _Txn(pg.Begin(message.prepare_lsn, message.prepare_ts_us, message.xid), pending=[], counts={},
                             records=[], held=True)
            return []
        if isinstance(message, pg.Prepare):
            txn = self._current(f"PREPARE of {message.gid!r}")
            self._txn = None
            if self.content == COORDINATOR:
                return []  # the coordinator's own prepared transactions carry no decision of its workers
            self._prepared[message.gid] = (txn, message.prepare_lsn)
            self._settle()
            return []
        if isinstance(message, pg.CommitPrepared):
            return self._commit_prepared(message)
        if isinstance(message, pg.RollbackPrepared):
            if self._prepared.pop(message.gid, None) is not None:
                self.rolled_back_parts += 1
                self._settle()
                gxid = gxid_of_gid(message.gid)
                if gxid is not None and gxid in self._merges:
                    raise ProtocolError(
                        f"node {self.content}: part {message.gid!r} was rolled back after another part of its "
                        "distributed transaction committed on this node: the source holds half of it")
            return []
        if self.content == COORDINATOR and isinstance(message, (pg.Insert, pg.Update, pg.Delete)):
            return self._decision_row(message)
        if isinstance(message, pg.Relation) and self.content == COORDINATOR and _is_decisions(message.schema,
                                                                                               message.table):
            names = [c.name for c in message.columns]
            if "groupid" not in names or "gid" not in names:
                raise ProtocolError(f"node {self.content}: pg_dist_transaction has no groupid or gid column ({names})")
            self._decision_columns[message.relid] = (names.index("groupid"), names.index("gid"))
        if isinstance(message, pg.Commit):
            return self._local_commit(message)
        if isinstance(message, pg.Begin):
            self._decisions = []
        return super()._on(message)

    def _local_commit(self, commit: pg.Commit) -> list[Outbound]:
        """A plain COMMIT: on a worker, a one-phase transaction (no gxid); on the
        coordinator, a commit decision when it wrote pg_dist_transaction rows."""
        closed = self._closed(commit)
        if self.content == COORDINATOR:
            return self._decision(closed, commit)
        closed.one_phase = True
        return self._in_order(lambda: self._finish(closed, commit.end_lsn), commit.commit_lsn)

    # -- worker parts ---------------------------------------------------------------------
    def _commit_prepared(self, message: pg.CommitPrepared) -> list[Outbound]:
        out = self._commit_part(message)
        self._settle()
        return out

    def _commit_part(self, message: pg.CommitPrepared) -> list[Outbound]:
        if self._txn is not None:
            raise ProtocolError(f"node {self.content}: COMMIT PREPARED of {message.gid!r} inside xid {self._txn.begin.xid}")
        if self.content == COORDINATOR:
            return []
        held = self._prepared.pop(message.gid, None)
        if held is None:
            raise ProtocolError(f"node {self.content}: COMMIT PREPARED of {message.gid!r} at LSN {message.commit_lsn}, "
                                "whose PREPARE was not decoded (the slot was acknowledged past it)")
        txn, prepared_lsn = held
        txn.begin = pg.Begin(message.commit_lsn, message.commit_ts_us, txn.begin.xid)
        txn.held = False
        gxid = gxid_of_gid(message.gid)
        if gxid is None:  # a prepared transaction of someone else's: one local transaction
            self._spans.append((prepared_lsn, message.commit_lsn))
            txn.one_phase = True
            self.completed_end_lsn = message.end_lsn
            return self._in_order(lambda: self._finish(txn, message.end_lsn), message.commit_lsn)
        self.completed_end_lsn = message.end_lsn
        merge = self._merges.get(gxid)
        if merge is None:
            merge = _Merge(gxid, waiting={g for g, (_t, _l) in self._prepared.items() if gxid_of_gid(g) == gxid})
            self._queue.append(merge)
            self._held_commits.append(message.commit_lsn)
            if merge.waiting:
                self._merges[gxid] = merge
        merge.prepared_from = min(merge.prepared_from, prepared_lsn) if merge.parts else prepared_lsn
        merge.last_commit = max(merge.last_commit, message.commit_lsn)
        merge.parts.append(txn)
        merge.waiting.discard(message.gid)
        merge.end_lsn = max(merge.end_lsn, message.end_lsn)
        if not merge.waiting:
            self._merges.pop(gxid, None)
            self._spans.append((merge.prepared_from, merge.last_commit))
        return self._drain()

    def _in_order(self, hand_out: Callable[[], list[Outbound]], commit_lsn: int) -> list[Outbound]:
        """A commit's messages now, or after the parts held before it (made when they go
        out: a part's number is its place in the partition)."""
        if not self._queue:
            return hand_out()
        self._queue.append(hand_out)
        self._held_commits.append(commit_lsn)
        return self._drain()

    def _drain(self) -> list[Outbound]:
        out: list[Outbound] = []
        while self._queue:
            head = self._queue[0]
            if isinstance(head, _Merge):
                if head.waiting:
                    break
                out += self._merged(head)
            else:
                out += head()
            self._queue.popleft()
            self._held_commits.popleft()
        return out

    def _merged(self, merge: _Merge) -> list[Outbound]:
        """One part of the distributed transaction on this node: its parts' rows,
        numbered afresh, at the first part's commit."""
        first = merge.parts[0]
        kept = {self.start.captures(self.content, p.begin.final_lsn, None, p.begin.xid) if self.start else True
                for p in merge.parts}
        if len(kept) > 1:
            raise ProtocolError(f"node {self.content}: the start point splits the parts of gxid {merge.gxid}")
        counts: dict[str, int] = {}
        txn = _Txn(first.begin, gxid=merge.gxid, pending=[], counts=counts)
        for part in merge.parts:
            for row in part.pending or []:  # the transaction's own fields are the first part's, at encoding
                txn.seq += 1
                row.seq = txn.seq
                row.order = counts[row.table.qualified] = counts.get(row.table.qualified, 0) + 1
                txn.pending.append(row)  # type: ignore[union-attr]
        return self._finish(txn, merge.end_lsn)

    # -- coordinator decisions --------------------------------------------------------------
    def _decision_row(self, message: pg.Insert | pg.Update | pg.Delete) -> list[Outbound]:
        self._current("a row change")
        columns = self._decision_columns.get(message.relid)
        if columns is None or not isinstance(message, pg.Insert):
            return []  # recovery deleting decisions it has carried out; nothing else is published
        group, gid = message.new[columns[0]], message.new[columns[1]]
        if group is None or gid is None:
            raise ProtocolError(f"node {self.content}: a pg_dist_transaction row without groupid or gid")
        self._decisions.append((int(group), gid))
        return []

    def _decision(self, txn: _Txn, commit: pg.Commit) -> list[Outbound]:
        decisions, self._decisions = self._decisions, []
        if not decisions:
            return self._finish(txn, commit.end_lsn)  # a sync point's record (its marker), or nothing
        gxids = {gxid_of_gid(gid) for _group, gid in decisions}
        gxid = gxids.pop()
        if gxids or gxid is None:
            raise ProtocolError(f"node {self.content}: xid {txn.begin.xid} records the parts of several distributed "
                                f"transactions, or gids that are not Citus's: {sorted(g for _, g in decisions)[:5]}")
        unknown = sorted({group for group, _gid in decisions if group not in self.groups})
        if unknown:
            raise UnknownNodesError(self.content, gxid, f"node groups {unknown}", self.groups.values())
        txn.gxid = gxid
        self._decide(txn)
        if txn.dropped:
            self.dropped_transactions += 1
            return []
        self.transactions += 1
        self.last_commit_ts_ms = txn.begin.commit_ts_us // 1000
        body = {"type": "commit", "gxid": txn.gxid,
                "segments": sorted({self.groups[group] for group, _gid in decisions}), "ddl_count": 0,
                **self._position(txn)}
        return [Outbound("commit", None, orjson.dumps(body))]
