"""Sync points: the source cut at a distributed-transaction-consistent moment while its
writers keep running, the cut marked in the stream, and the target read when the
replayer reaches the mark.

The cut takes the controller's commit lock exclusively. Every commit phase (a commit
record and its segments' ``COMMIT PREPARED``, or a one-phase commit) holds that lock
shared, so while the cut holds it every distributed transaction has committed on all
its segments or on none; writers wait only for the cut's few statements. Under the
lock the sync point, a distributed transaction of its own (gxid g), writes:

* on every segment, a local transaction holding only its gxid marker, and then pins and
  exports that segment's snapshot (the source as of the cut);
* on the coordinator, its commit record listing every segment, with each node's WAL
  position at the cut (``"syncpoint"``), which capture puts on the ``.dtx`` topic.

The replayer orders the sync point as any two-phase transaction: every transaction
before the cut is applied before it, none after (a one-phase transaction after the cut
follows the sync point's part in its segment's log, so it waits for it). Having
applied it, the replayer waits for the sync point's target lock, which a validator
took before the cut: so the validator sees the replayer waiting there, pins the
target's snapshots while nothing is applied, and lets it go on.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from ..cluster import SYNCPOINT_LOCK, Cluster, Session
from ..errors import GpcdcError
from ..protocol import COORDINATOR, CommitRecord, GxidMarker, parse_lsn
from ..protocol import _markers as markers
from ._snapshots import Snapshots

WAIT_POLL = 0.01  # seconds between looks at the target for the replayer at the sync point


class SyncPointError(GpcdcError):
    """A sync point could not be taken, or the replayer did not reach it."""

    exit_code = 2


@dataclass
class SyncPoint:
    """A cut of the source, held: ``source`` reads each segment as of the cut; once
    :meth:`wait_for_replay` returns, ``target`` reads the target as of the same point."""

    gxid: int
    lsns: dict[int, int]  # node content -> WAL position at the cut
    stall_ms: float  # commit phases held back: the commit lock requested until released
    taken_at: str
    source: Snapshots
    target_cluster: Cluster | None = None
    target: Snapshots | None = None
    replay_hold_ms: float | None = None  # the replayer held at the sync point
    _target_lock: psycopg.Connection[Any] | None = field(default=None, repr=False)

    @property
    def id(self) -> int:
        return self.gxid

    def wait_for_replay(self, timeout: float) -> Snapshots:
        """Wait until the replayer has applied everything up to the sync point and
        waits there; pin the target's snapshots; let it go on."""
        if self.target is not None:
            return self.target
        if self._target_lock is None or self.target_cluster is None:
            raise SyncPointError(f"sync point {self.gxid} was taken without holding a target")
        lock = self._target_lock
        deadline = time.monotonic() + timeout
        waiting = ("SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
                   "AND objid = %s AND objsubid = 2 AND NOT granted)")
        while not lock.execute(waiting, (SYNCPOINT_LOCK, self.gxid)).fetchone()[0]:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise SyncPointError(f"the replayer did not reach sync point {self.gxid} within {timeout:g} s",
                                     fix="run `gpcdc replay --follow` (and capture) while validating, or raise "
                                         "validate.replay_timeout")
            time.sleep(WAIT_POLL)
        reached = time.monotonic()
        target = Snapshots(self.target_cluster)
        try:
            target.pin()
        finally:
            lock.execute("SELECT pg_advisory_unlock(%s, %s)", (SYNCPOINT_LOCK, self.gxid))
        self.replay_hold_ms = round((time.monotonic() - reached) * 1000, 1)
        self.target = target
        return target

    def close(self) -> None:
        self.source.close()
        if self.target is not None:
            self.target.close()
        if self._target_lock is not None:
            self._target_lock.close()  # its session lock goes with it

    def __enter__(self) -> SyncPoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def summary(self) -> dict[str, Any]:
        return {"syncpoint": self.gxid, "taken_at": self.taken_at, "stall_ms": self.stall_ms,
                "replay_hold_ms": self.replay_hold_ms, "lsns": {str(n): lsn for n, lsn in sorted(self.lsns.items())}}


def held_file(work_dir: Path, prefix: str, gxid: int) -> Path:
    """Where a held sync point's snapshot names are published (see :func:`publish`)."""
    return Path(work_dir) / "validate" / prefix / "syncpoints" / f"{gxid}.json"


def publish(point: SyncPoint, path: Path) -> None:
    """Write a sync point's exported snapshot names, so that other processes read both
    sides at it (:func:`attach`) for as long as this process holds it open."""
    if point.target is None:
        raise SyncPointError(f"sync point {point.gxid} has not read the target yet")
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {**point.summary(), "holder": os.getpid(),
            "source": {str(c): n for c, n in point.source.names.items()},
            "target": {str(c): n for c, n in point.target.names.items()}}
    aside = path.with_suffix(".tmp")
    aside.write_text(json.dumps(body, indent=1) + "\n")
    aside.replace(path)


def attach(source: Cluster, target: Cluster, path: Path) -> SyncPoint:
    """Read both sides at a sync point another process holds (``gpcdc syncpoint --hold``)."""
    gxid = path.stem
    try:
        body = json.loads(path.read_text())
        os.kill(int(body["holder"]), 0)
    except (OSError, ValueError, KeyError):
        raise SyncPointError(f"sync point {gxid} is not held: no live `gpcdc syncpoint --hold` published {path}",
                             fix="take one with `gpcdc syncpoint --hold SECONDS`, or validate with --new-syncpoint") from None
    sides = []
    try:
        for cluster, names in ((source, body["source"]), (target, body["target"])):
            side = Snapshots(cluster)
            sides.append(side)
            side.pin({int(c): n for c, n in names.items()})
    except BaseException:
        for side in sides:
            side.close()
        raise
    return SyncPoint(int(body["syncpoint"]), {int(n): lsn for n, lsn in body["lsns"].items()}, body["stall_ms"],
                     body["taken_at"], sides[0], target, sides[1], body["replay_hold_ms"])


def take_syncpoint(source: Cluster, target: Cluster | None = None, *, lock_timeout: float = 10.0) -> SyncPoint:
    """Cut the source now and mark the cut in the stream (see the module docstring).

    With ``target``, the replayer into it is held at the sync point until
    :meth:`SyncPoint.wait_for_replay` has read the target there (or the sync point is
    closed). Raises :class:`SyncPointError` when the commit lock is not granted within
    ``lock_timeout`` seconds (a commit phase that does not end)."""
    with Session(source) as session:
        tx = session.transaction()  # the sync point's gxid, marked running like any other's
        gxid = tx.gxid
        target_lock = None
        snapshots = None
        try:
            if target is not None:
                target_lock = target.connect_node(target.coordinator)
                target_lock.execute("SELECT pg_advisory_lock(%s, %s)", (SYNCPOINT_LOCK, gxid))
            snapshots = Snapshots(source)
            with source.connect_node(source.coordinator) as controller:
                stall_ms, lsns = _cut(controller, snapshots, gxid, lock_timeout)
        except BaseException:
            if snapshots is not None:
                snapshots.close()
            if target_lock is not None:
                target_lock.close()
            raise
        finally:
            tx.rollback()  # it wrote nothing through the session; this ends its gxid
    return SyncPoint(gxid, lsns, stall_ms, datetime.now(UTC).isoformat(timespec="milliseconds"),
                     snapshots, target, _target_lock=target_lock)


def _cut(controller: psycopg.Connection[Any], snapshots: Snapshots, gxid: int,
         lock_timeout: float) -> tuple[float, dict[int, int]]:
    controller.execute(f"SET lock_timeout = {int(lock_timeout * 1000)}")
    marker = markers.encode(GxidMarker(gxid))
    requested = time.monotonic()
    try:
        controller.execute("SELECT gp_acquire_commit_lock()")
    except psycopg.errors.LockNotAvailable:
        raise SyncPointError(f"the commit lock was not granted within {lock_timeout:g} s: a commit phase is stuck",
                             fix="find the session holding advisory lock 1196450636 in pg_locks") from None
    try:
        for conn in snapshots.connections():
            conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", marker)
        lsns = snapshots.pin()
        lsns[COORDINATOR] = parse_lsn(controller.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])  # type: ignore[index]
        record = CommitRecord(gxid, tuple(sorted(c for c in lsns if c != COORDINATOR)), tuple(sorted(lsns.items())))
        controller.execute("SELECT pg_logical_emit_message(true, %s, %s)", markers.encode(record))
    finally:
        controller.execute("SELECT gp_release_commit_lock()")
    return round((time.monotonic() - requested) * 1000, 2), lsns
