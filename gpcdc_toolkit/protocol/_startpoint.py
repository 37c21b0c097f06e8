"""Where capture starts: the record a bootstrap writes and capture, the initial load
and the replayer read (pure)."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class DistributedSnapshot:
    """Which distributed transactions had committed at a consistent cut.

    A gxid is seen (committed before the cut) when it is below ``xmax`` and was not
    running at the cut. Aborted gxids are never decoded, so they need no entry.
    """

    xmax: int  # the first gxid not yet assigned at the cut
    in_progress: frozenset[int]

    def sees(self, gxid: int) -> bool:
        return gxid < self.xmax and gxid not in self.in_progress


@dataclass(frozen=True)
class LocalSnapshot:
    """Which local transactions of one node had committed when its initial snapshot
    was taken: PostgreSQL's own snapshot (``pg_current_snapshot()``, 64-bit xids)."""

    xmin: int
    xmax: int
    in_progress: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> LocalSnapshot:
        """From the text ``pg_current_snapshot()`` prints: ``xmin:xmax:xip,xip,...``."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def __str__(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(map(str, sorted(self.in_progress)))}"

    def sees(self, xid: int) -> bool:
        """Whether the local transaction ``xid`` (32 bits, as logical decoding gives it)
        had committed. Decoded transactions are close to the snapshot in xid order, so
        the 64-bit xid is the one within 2^31 of ``xmax``."""
        full = (self.xmax & ~0xFFFFFFFF) | (xid & 0xFFFFFFFF)
        if full > self.xmax + 0x7FFFFFFF:
            full -= 1 << 32
        elif full < self.xmax - 0x80000000:
            full += 1 << 32
        return full < self.xmin or (full < self.xmax and full not in self.in_progress)


@dataclass(frozen=True)
class NodeStart:
    content: int
    slot: str
    consistent_lsn: int  # the slot's consistent point
    snapshot_lsn: int  # the WAL position the initial snapshot corresponds to
    snapshot_name: str | None  # the exported snapshot, valid only while bootstrap runs
    # The initial snapshot's own visibility ("xmin:xmax:xip,..."), where the cut recorded it.
    local_snapshot: str | None = None
    # The server the slot was made on, as IDENTIFY_SYSTEM names it (None: not recorded):
    # a node answering with another is not the one whose WAL the slot follows.
    system_identifier: str | None = None
    timeline: int | None = None

    def replaced_by(self, system_identifier: str, timeline: int) -> str | None:
        """How the server now answering for this node differs from the one the slot was
        made on (None: it is the same, or the start point did not record it)."""
        if self.system_identifier is None or self.timeline is None:
            return None
        if system_identifier != self.system_identifier:
            return (f"is another server (system identifier {system_identifier}, not {self.system_identifier}): "
                    "it was rebuilt or replaced")
        if timeline != self.timeline:
            return (f"is on timeline {timeline}, not {self.timeline}: its mirror or standby was promoted in its "
                    "place (or it was restored from a backup)")
        return None


@dataclass(frozen=True)
class Repair:
    """A segment captured again from a new consistent cut after its capture was lost
    (``gpcdc bootstrap repair``): a new slot, the segment's rows copied as of the cut,
    and the cut's distributed snapshot. The part on this segment of a transaction the
    snapshot sees is in the copied rows; of one it does not see, in the new slot's
    stream."""

    number: int  # the segment's repairs, counted from 1
    node: NodeStart  # the new slot, as a bootstrap records a node
    snapshot: DistributedSnapshot
    # The coordinator's WAL position at the cut: every commit record of a transaction
    # the snapshot sees lies before it.
    coordinator_lsn: int
    created_at: str
    # The segment joined the cluster after the bootstrap (an expansion): it was never
    # captured before this cut, rather than lost (``gpcdc bootstrap extend``).
    joined: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"number": self.number, "node": asdict(self.node), "coordinator_lsn": self.coordinator_lsn,
                "snapshot": {"xmax": self.snapshot.xmax, "in_progress": sorted(self.snapshot.in_progress)},
                "created_at": self.created_at, "joined": self.joined}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Repair:
        snapshot = data["snapshot"]
        return cls(data["number"], NodeStart(**data["node"]),
                   DistributedSnapshot(snapshot["xmax"], frozenset(snapshot["in_progress"])),
                   data["coordinator_lsn"], data["created_at"], data.get("joined", False))


@dataclass(frozen=True)
class StartPoint:
    """The agreed start of a capture: one per pipeline (topic prefix)."""

    method: str  # "peaceful" or "snapshot"
    created_at: str  # ISO 8601
    nodes: tuple[NodeStart, ...]
    # Which gxids are before the start. The snapshot method filters by it; for the
    # peaceful method it only describes the start (its slots decode nothing earlier).
    snapshot: DistributedSnapshot | None = None
    lock_window_ms: float | None = None  # method "peaceful": how long new transactions waited
    publication: str = "gpcdc"
    extra: dict[str, Any] = field(default_factory=dict)
    # The latest repair of each repaired segment; kept beside the start point, not in it
    # (the bootstrap's identity stays the one its partitions begin with).
    repairs: tuple[Repair, ...] = ()

    def repair(self, content: int) -> Repair | None:
        return next((r for r in self.repairs if r.node.content == content), None)

    @property
    def captured_nodes(self) -> tuple[NodeStart, ...]:
        """Every node the pipeline captures, as capture uses it now (a repaired one's new
        slot), by content: the bootstrap's, then the segments it was extended to."""
        joined = tuple(r.node for r in self.repairs if r.joined)
        return tuple(sorted((*(self.node(n.content) for n in self.nodes), *joined), key=lambda n: n.content))

    def node(self, content: int) -> NodeStart:
        """The node's slot as capture uses it now: the latest repair's, if any."""
        if (repair := self.repair(content)) is not None:
            return repair.node
        for n in self.nodes:
            if n.content == content:
                return n
        raise KeyError(f"the start point has no node with content {content}")

    def captures(self, content: int, commit_lsn: int, gxid: int | None, xid: int | None = None) -> bool:
        """Whether a local transaction belongs to the stream (False: it is in the
        initial snapshot already).

        Peaceful slots start where no distributed transaction ran, so every transaction
        they decode belongs. Snapshot-filter slots started before the cut: a part is
        dropped when the distributed snapshot sees its gxid. Without a gxid (legacy
        markers, or a cluster with no distributed snapshot) it is dropped when the node's
        own snapshot at the cut saw its local ``xid``: exact, because no commit phase of
        a distributed transaction ran during the cut, so every such transaction is seen
        on all its nodes or on none. Without a recorded local snapshot, by the node's WAL
        position at the cut; a local transaction outside any distributed one (a
        utility-mode write) takes no commit lock, so one committing during the cut
        itself may then land on the wrong side.
        """
        repair = self.repair(content)
        if self.method != "snapshot" and repair is None:
            return True
        snapshot = repair.snapshot if repair is not None else self.snapshot
        if gxid is not None and snapshot is not None:
            return not snapshot.sees(gxid)
        node = self.node(content)
        if xid is not None and node.local_snapshot is not None:
            return not _local_snapshot(node.local_snapshot).sees(xid)
        if snapshot is None:
            return True
        return commit_lsn > node.snapshot_lsn

    @property
    def identity(self) -> str:
        """Names this bootstrap of the pipeline: stamped first on each of its partitions,
        so that topics that lost their history, or hold another bootstrap's events, are
        recognised."""
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["repairs"]
        if self.snapshot is not None:
            data["snapshot"] = {"xmax": self.snapshot.xmax, "in_progress": sorted(self.snapshot.in_progress)}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StartPoint:
        snapshot = data.get("snapshot")
        return cls(
            method=data["method"],
            created_at=data["created_at"],
            nodes=tuple(NodeStart(**n) for n in data["nodes"]),
            snapshot=DistributedSnapshot(snapshot["xmax"], frozenset(snapshot["in_progress"])) if snapshot else None,
            lock_window_ms=data.get("lock_window_ms"),
            publication=data.get("publication", "gpcdc"),
            extra=data.get("extra", {}),
        )


@functools.lru_cache(maxsize=256)
def _local_snapshot(text: str) -> LocalSnapshot:
    return LocalSnapshot.parse(text)


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, _, low = text.partition("/")
    if not low:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(high, 16) << 32) | int(low, 16)
