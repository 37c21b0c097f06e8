"""What ``gpcdc status`` shows: per node, how far capture is behind the WAL."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass

import orjson

from ..cluster import Cluster
from ..errors import BrokerError, GpcdcError
from ..protocol import Topics, format_lsn, parse_lsn
from ._changes import added_nodes, node_change
from ._hosts import holder, latest_watermarks
from ._processes import CaptureGroup, other_worker


@dataclass(frozen=True)
class NodeStatus:
    node: int
    worker: str  # "pid 123" (this host's), "pid 123 on <host>" (another's, by its slot), or "stopped"
    alive: bool  # a worker runs here, or holds the node's slot from another host
    bytes_behind: int  # current WAL position minus the slot's confirmed flush position
    seconds_behind: float  # since the node's resolved commit time in Kafka, when behind
    events: int  # produced by this host's worker since it started (0 for another host's)
    megabytes: float
    acked_lsn: str
    last_commit: str
    state: str = ""  # the worker's own word: streaming, reconnecting in 4 s, waiting for Kafka, failed: ...
    last_error: str | None = None
    changed: str | None = None  # how the node changed under the pipeline, with the fix (see _changes)
    resolved_in_kafka: str = "-"  # the node's furthest watermark in Kafka: its commits up to then are all there
    held_by: str | None = None  # a client other than a capture worker holding the slot (pg_recvlogical, ...)


# Slot, holder and WAL of one node, read from the node itself. The timeline is the
# current WAL file's first eight hex digits.
_NODE_QUERY = (
    "SELECT pg_current_wal_lsn()::text, s.confirmed_flush_lsn::text, s.wal_status, s.slot_name IS NOT NULL, "
    "c.system_identifier::text, pg_walfile_name(pg_current_wal_lsn()), s.active, r.application_name "
    "FROM pg_control_system() c LEFT JOIN pg_replication_slots s ON s.slot_name = %s "
    "LEFT JOIN pg_stat_activity r ON r.pid = s.active_pid")  # a walsender, or a backend reading the slot by SQL


def capture_status(cluster: Cluster, group: CaptureGroup,
                   watermarks: Mapping[int, tuple[int, int | None]] | None = None) -> list[NodeStatus]:
    """Each node's capture, as any host sees it: the slot's position and holder from
    the node, how far Kafka has the node from ``watermarks`` (:func:`kafka_watermarks`),
    and this host's own workers from their pid and status files."""
    rows = []
    slot = group.pipeline.slot
    # Not bootstrapped: no start point to compare the nodes with.
    start = group.pipeline.start_point() if group.pipeline.start_point_file.is_file() else None
    started = {n.content: n for n in start.captured_nodes} if start else {}  # repaired: the new slot
    added = added_nodes((n.content for n in cluster.nodes), start.captured_nodes) if start else None
    in_kafka = watermarks or {}
    for node in cluster.nodes:
        with cluster.connect_node(node) as conn:
            current, confirmed, wal_status, found, system_identifier, walfile, active, application = conn.execute(
                _NODE_QUERY, (slot,)).fetchone()  # type: ignore[misc]
        change = None if start is None else added if node.content not in started else node_change(
            node, started[node.content], system_identifier=system_identifier, timeline=int(walfile[:8], 16),
            slot_found=found, wal_status=wal_status)
        behind = parse_lsn(current) - parse_lsn(confirmed) if confirmed else 0
        pid = group.pid(node.content)
        named = holder(application) if active and not pid else None
        remote = other_worker(application) if named else None
        status = (group.status(node.content) or {}) if remote is None else {}  # this host's worker's own word
        last_ms = status.get("last_commit_ts_ms")
        _lsn, resolved_ms = in_kafka.get(node.content, (0, None))
        resolved_ms = resolved_ms if resolved_ms is not None else status.get("resolved_ts_ms")
        seconds = round(max(0.0, time.time() - resolved_ms / 1000), 1) if behind and resolved_ms else 0.0
        rows.append(NodeStatus(
            node=node.content,
            worker=f"pid {pid}" if pid else f"pid {remote[1]} on {remote[0]}" if remote else "stopped",
            alive=pid is not None or remote is not None,
            bytes_behind=behind,
            seconds_behind=seconds,
            events=int(status.get("events", 0)),
            megabytes=status.get("bytes", 0) / 1e6,
            acked_lsn=format_lsn(parse_lsn(confirmed)) if confirmed else "no slot",
            last_commit=_time(last_ms) if last_ms else "-",
            state=str(status.get("state", "")) if pid or str(status.get("state", "")).startswith("failed") else "",
            last_error=status.get("last_error"),
            changed=str(change) if change else None,
            resolved_in_kafka=_time(resolved_ms) if node.content in in_kafka and resolved_ms else "-",
            held_by=(application or "an unnamed client") if active and not pid and named is None else None,
        ))
    return rows


def _time(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def kafka_watermarks(kafka: Mapping[str, str], topics: Topics, depth: int = 512) -> dict[int, tuple[int, int | None]]:
    """Per node, its furthest watermark among the last ``depth`` messages of each
    partition of the pipeline's topics (a worker sends one every heartbeat, so a
    running one's is near the end). A topic not made yet holds none. A broker that does
    not answer raises BrokerError."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from ..broker import check_reachable
    from ..ingest._consumer import end_offsets, read_to_end

    check_reachable(kafka)
    values = []
    try:
        made = AdminClient(dict(kafka)).list_topics(timeout=10).topics
    except KafkaException as e:
        raise BrokerError(f"cannot list Kafka's topics: {e.args[0].str()}",
                          fix="check the broker and kafka.bootstrap_servers") from None
    for topic in (t for t in (topics.dtx, topics.changes) if t in made):
        ends = end_offsets(kafka, topic)
        for message in read_to_end(kafka, topic, start={p: max(0, end - depth) for p, end in ends.items()}):
            try:
                values.append(orjson.loads(message.value() or b""))
            except orjson.JSONDecodeError:
                continue  # not the pipeline's: the audit reports it
    return latest_watermarks(values)


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
        where: dict[int, str] = {}  # each pending node's slot, as last read
        while True:
            for content in list(pending):
                row = conns[content].execute(
                    "SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,)).fetchone()
                if row and row[0] is not None and parse_lsn(row[0]) >= pending[content]:
                    del pending[content]
                else:
                    held = "no slot" if row is None else (
                        f"at {row[0]}, held by pid {row[1]}" if row[1] is not None else f"at {row[0]}, held by no worker")
                    where[content] = f"node {content}: {held}, {format_lsn(pending[content])} wanted"
            if not pending:
                return
            if time.monotonic() > deadline:
                raise GpcdcError(f"capture did not acknowledge nodes {sorted(pending)} within {timeout:g} s ("
                                 + "; ".join(where[c] for c in sorted(pending)) + ")",
                                 fix="check `gpcdc status` and the workers' logs")
            time.sleep(0.1)  # polling the slots' positions, the condition itself
