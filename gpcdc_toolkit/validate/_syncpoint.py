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

import contextlib
import json
import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from ..bootstrap import distributed_tables
from ..cluster import Cluster, Table, syncpoint_lock
from ..errors import SyncPointError as SyncPointError  # re-exported by the package
from ._snapshots import Snapshots

WAIT_POLL = 0.01  # seconds between looks at the target for the replayer at the sync point


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
    _lock_keys: tuple[int, int] = (0, 0)  # of the target lock (``syncpoint_lock``)
    _tables: tuple[sql.Composable, ...] = ()  # locked in the target's snapshots too

    def wait_for_replay(self, timeout: float) -> Snapshots:
        """Wait until the replayer has applied everything up to the sync point and
        waits there; pin the target's snapshots; let it go on."""
        if self.target is not None:
            return self.target
        if self._target_lock is None or self.target_cluster is None:
            raise SyncPointError(f"sync point {self.gxid} was taken without holding a target")
        lock = self._target_lock
        deadline = time.monotonic() + timeout
        # The replayer, in this database, waiting (shared) for this very lock.
        waiting = ("SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s "
                   "AND objsubid = 2 AND mode = 'ShareLock' AND NOT granted "
                   "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))")
        while not lock.execute(waiting, self._lock_keys).fetchone()[0]:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise SyncPointError(f"the replayer did not reach sync point {self.gxid} within {timeout:g} s",
                                     fix="run `gpcdc replay` (it follows the stream) and capture while validating, or raise "
                                         "validate.replay_timeout")
            time.sleep(WAIT_POLL)
        reached = time.monotonic()
        target = Snapshots(self.target_cluster)
        try:
            target.begin(self._tables)
            target.pin()
        except BaseException:
            target.close()
            raise
        finally:
            lock.execute("SELECT pg_advisory_unlock(%s, %s)", self._lock_keys)
        self.replay_hold_ms = round((time.monotonic() - reached) * 1000, 1)
        self.target = target
        return target

    def close(self) -> None:
        self.source.close()
        if self.target is not None:
            self.target.close()
        if self._target_lock is not None:
            # Released before closing: a closed session's locks go only once its server
            # process has ended, a moment after the client has.
            with contextlib.suppress(psycopg.Error):
                self._target_lock.execute("SELECT pg_advisory_unlock_all()")
            self._target_lock.close()

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


def take_syncpoint(source: Cluster, target: Cluster | None = None, *, pipeline: str = "",
                   tables: Sequence[Table] | None = None, lock_timeout: float = 10.0) -> SyncPoint:
    """Cut the source now and mark the cut in the stream (``Cluster.mark_syncpoint``;
    see the module docstring).

    ``tables`` (default: every distributed table of the source) are locked in the
    snapshots against TRUNCATE and rewrites, where the cluster can (``snapshot_locks``).
    With ``target``, the replayer of ``pipeline`` into it is held at the sync point until
    :meth:`SyncPoint.wait_for_replay` has read the target there (or the sync point is
    closed). Raises :class:`SyncPointError` when a lock is not granted within
    ``lock_timeout`` seconds: the source's commit pause (a commit phase that does not
    end) or the target's (another validation holds this sync point)."""
    if tables is None:
        tables = distributed_tables(source)
    locked = source.snapshot_locks(tables)
    with source.syncpoint_gxid() as gxid, ExitStack() as undo:
        keys = syncpoint_lock(pipeline, gxid)
        target_lock = None
        if target is not None:
            target_lock = target.connect_node(target.coordinator)
            undo.callback(target_lock.close)  # its session lock goes with it
            _set_lock_timeout(target_lock, lock_timeout)
            try:
                target_lock.execute("SELECT pg_advisory_lock(%s, %s)", keys)
            except psycopg.errors.LockNotAvailable:
                raise SyncPointError(f"another validation holds sync point {gxid} of pipeline {pipeline!r} on "
                                     "the target", fix="wait for it to end") from None
        snapshots = Snapshots(source)
        undo.callback(snapshots.close)
        snapshots.begin(locked)  # before the cut: DDL holding these tables may need the cut's locks to end
        stall_ms, lsns = source.mark_syncpoint(gxid, snapshots.pin, lock_timeout)
        undo.pop_all()  # only now: a failure releases the snapshots and the target's lock
    return SyncPoint(gxid, lsns, stall_ms, datetime.now(UTC).isoformat(timespec="milliseconds"), snapshots, target,
                     _target_lock=target_lock, _lock_keys=keys, _tables=locked)


def _set_lock_timeout(conn: psycopg.Connection[Any], seconds: float) -> None:
    conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{int(seconds * 1000)}ms")))
