"""What ``gpcdc status`` shows: per node, how far capture is behind the WAL."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass

from ..cluster import Cluster
from ..errors import GpcdcError
from ..protocol import format_lsn, parse_lsn
from ._changes import added_nodes, node_change
from ._processes import CaptureGroup


@dataclass(frozen=True)
class NodeStatus:
    node: int
    worker: str  # "pid 123" or "stopped"
    alive: bool
    bytes_behind: int  # current WAL position minus the slot's confirmed flush position
    seconds_behind: float  # since the oldest commit not yet acknowledged, when behind
    events: int
    megabytes: float
    acked_lsn: str
    last_commit: str
    state: str = ""  # the worker's own word: streaming, reconnecting in 4 s, waiting for Kafka, failed: ...
    last_error: str | None = None
    changed: str | None = None  # how the node changed under the pipeline, with the fix (see _changes)


def capture_status(cluster: Cluster, group: CaptureGroup) -> list[NodeStatus]:
    rows = []
    slot = group.pipeline.slot
    # Not bootstrapped: no start point to compare the nodes with.
    start = group.pipeline.start_point() if group.pipeline.start_point_file.is_file() else None
    started = {n.content: n for n in start.captured_nodes} if start else {}  # repaired: the new slot
    added = added_nodes((n.content for n in cluster.nodes), start.captured_nodes) if start else None
    for node in cluster.nodes:
        with cluster.connect_node(node) as conn:
            # The timeline is the current WAL file's first eight hex digits.
            current, confirmed, wal_status, found, system_identifier, walfile = conn.execute(
                "SELECT pg_current_wal_lsn()::text, s.confirmed_flush_lsn::text, s.wal_status, s.slot_name IS NOT NULL, "
                "c.system_identifier::text, pg_walfile_name(pg_current_wal_lsn()) FROM pg_control_system() c "
                "LEFT JOIN pg_replication_slots s ON s.slot_name = %s", (slot,)).fetchone()  # type: ignore[misc]
        change = None if start is None else added if node.content not in started else node_change(
            node, started[node.content], system_identifier=system_identifier, timeline=int(walfile[:8], 16),
            slot_found=found, wal_status=wal_status)
        behind = parse_lsn(current) - parse_lsn(confirmed) if confirmed else 0
        pid = group.pid(node.content)
        status = group.status(node.content) or {}
        last_ms = status.get("last_commit_ts_ms")
        resolved_ms = status.get("resolved_ts_ms") or 0
        seconds = round(max(0.0, time.time() - resolved_ms / 1000), 1) if behind and resolved_ms else 0.0
        rows.append(NodeStatus(
            node=node.content,
            worker=f"pid {pid}" if pid else "stopped",
            alive=pid is not None,
            bytes_behind=behind,
            seconds_behind=seconds,
            events=int(status.get("events", 0)),
            megabytes=status.get("bytes", 0) / 1e6,
            acked_lsn=format_lsn(parse_lsn(confirmed)) if confirmed else "no slot",
            last_commit=dt.datetime.fromtimestamp(last_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
            if last_ms else "-",
            state=str(status.get("state", "")) if pid or str(status.get("state", "")).startswith("failed") else "",
            last_error=status.get("last_error"),
            changed=str(change) if change else None,
        ))
    return rows


def wait_until_acknowledged(cluster: Cluster, slot: str, timeout: float = 60.0,
                            contents: Iterable[int] | None = None) -> None:
    """Wait until every node's slot (or only those of ``contents``) is acknowledged past
    the WAL flushed now, that is, until capture has in Kafka everything committed there
    before the call."""
    wanted = None if contents is None else set(contents)
    with ExitStack() as stack:
        conns = {node.content: stack.enter_context(cluster.connect_node(node)) for node in cluster.nodes
                 if wanted is None or node.content in wanted}
        pending = {content: parse_lsn(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])  # type: ignore[index]
                   for content, conn in conns.items()}
        deadline = time.monotonic() + timeout
        while True:
            for content in list(pending):
                row = conns[content].execute(
                    "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
                if row and parse_lsn(row[0]) >= pending[content]:
                    del pending[content]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise GpcdcError(f"capture did not acknowledge nodes {sorted(pending)} within {timeout:g} s",
                                 fix="check `gpcdc status` and the workers' logs")
            time.sleep(0.1)  # polling the slots' positions, the condition itself
