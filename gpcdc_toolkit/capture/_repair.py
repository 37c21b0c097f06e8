"""Capture of one segment again after it was lost (a failover, its slot dropped or
invalidated), without capturing the others again: ``gpcdc bootstrap repair``; and of
segments added to the source since the bootstrap (an expansion), in the same way:
``gpcdc bootstrap extend``.

A new slot on the segment, then a consistent cut as the snapshot method takes one (the
commit lock held while the segment's snapshot is exported and the distributed snapshot
read), the segment's rows copied under that snapshot, and two marks in the segment's
partition: the lost mark (unless capture wrote it) and the repaired mark carrying the
cut. The segment's worker then streams from the new slot, dropping what the cut's
snapshot sees; the replayer replaces the target's rows that the source places on the
segment with the copied ones, in the same target transaction as the transactions whose
part there the copy stands for (``replay/_order.py``).
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from psycopg import sql

from .._runtime import write_atomic, write_json
from ..bootstrap import BootstrapError, Pipeline
from ..bootstrap._bootstrap import _drop_when_released, _ensure_publications, _Slot, replication_connection
from ..bootstrap._snapshot import distributed_tables, export_tables, write_manifest
from ..cluster import COORDINATOR, START_LOCK, Cluster, Node
from ..ingest import end_offsets, json_value, last_message
from ..protocol import (
    NodeStart,
    Outbound,
    Repair,
    Topics,
    lost_marker,
    lost_reason,
    parse_lsn,
    pipeline_marker,
    repaired_marker,
)
from ._changes import node_change


def repair_segment(cluster: Cluster, pipeline: Pipeline, content: int, kafka: Mapping[str, str], *,
                   timeout: float = 60.0) -> Repair:
    """Capture segment ``content`` again from a new consistent cut; returns the repair
    (kept in ``<pipeline dir>/repairs/seg<N>-<number>/``). Its worker must not run."""
    start = pipeline.start_point()
    segments = {node.content: node for node in cluster.segments}
    if content == COORDINATOR:
        raise BootstrapError("the coordinator cannot be repaired: the commit records it wrote after its slot's "
                             "position are gone, and with them the order of what committed since",
                             fix="bootstrap the pipeline again (`gpcdc bootstrap drop --delete-topics`, then "
                                 "`gpcdc bootstrap create`) and replay into a fresh target")
    if content not in segments:
        raise BootstrapError(f"segment {content} is not a segment of the source (it has segments 0 to "
                             f"{len(segments) - 1})", fix="name a segment of the source")
    _refuse_own_placement(cluster)
    if content not in {n.content for n in start.captured_nodes}:
        raise BootstrapError(f"segment {content} was added to the source after the bootstrap: the pipeline never "
                             "captured it", fix="extend the pipeline to it (`gpcdc bootstrap extend`)")
    node = segments[content]
    lost = _why_lost(cluster, node, start.node(content)) or _marked_lost(kafka, Topics(pipeline.prefix), content)
    if lost is None:
        raise BootstrapError(f"segment {content}'s capture is not lost: {node} is the server its slot "
                             f"{pipeline.slot} was made on, and the slot is there and usable",
                             fix="nothing to repair; `gpcdc status` says how capture stands")
    previous = start.repair(content)
    return _capture_from_a_cut(cluster, pipeline, node, kafka, lost=lost, joined=bool(previous and previous.joined),
                               timeout=timeout)


def extend_pipeline(cluster: Cluster, pipeline: Pipeline, kafka: Mapping[str, str], *, dispatcher: str,
                    timeout: float = 60.0) -> list[Repair]:
    """Capture the segments added to the source since the bootstrap (an expansion), each
    from a consistent cut of its own with its rows copied, as a repair does: their
    partitions added to the changes topic, then for each a slot, the cut and the copy,
    the pipeline's marker and a repaired mark. Returns one repair per segment."""
    start = pipeline.start_point()
    added = [node for node in cluster.segments if node.content not in {n.content for n in start.captured_nodes}]
    if not added:
        raise BootstrapError(f"the pipeline captures every segment the source lists (0 to {cluster.segment_count - 1})",
                             fix="nothing to extend; `gpcdc status` says how capture stands")
    _refuse_own_placement(cluster)
    if dispatcher != "segment":
        raise BootstrapError(f"capture.dispatcher is {dispatcher!r}: the changes topic spreads keys over its "
                             "partitions by their number, so partitions added for new segments would move keys "
                             "between partitions and break their order",
                             fix="bootstrap the pipeline again (`gpcdc bootstrap drop --delete-topics`, then "
                                 "`gpcdc bootstrap create`) and replay into a fresh target")
    _refuse_unfinished_expansion(cluster)
    _grow_changes_topic(kafka, Topics(pipeline.prefix), cluster.segment_count)
    return [_capture_from_a_cut(cluster, pipeline, node, kafka, lost=None, joined=True, timeout=timeout)
            for node in added]


def _refuse_unfinished_expansion(cluster: Cluster) -> None:
    """A new segment's copy stands for every row the source places on it: refuse while
    an expansion still runs (it holds the transaction-start lock), or left rows where
    their distribution key no longer places them (its redistribution did not finish)."""
    with cluster.coordinator_connection() as conn:
        free = conn.execute("SELECT pg_try_advisory_lock_shared(%s, 0)", (START_LOCK,)).fetchone()[0]  # type: ignore[index]
        if free:
            conn.execute("SELECT pg_advisory_unlock_shared(%s, 0)", (START_LOCK,))
    if not free:
        raise BootstrapError("the source's transaction-start lock is held: an expansion (or a bootstrap) is running",
                             fix="wait for it to end, then extend")
    for info in distributed_tables(cluster):
        misplaced = 0
        for node in cluster.segments:
            with cluster.connect_node(node, autocommit=False) as conn:  # its keys are read by a cursor
                misplaced += len(cluster.misplaced_rows(node, conn, info, sql.SQL("t.ctid")))
                conn.rollback()
        if misplaced:
            raise BootstrapError(f"table {info.name} has {misplaced} rows on segments its distribution key does not "
                                 "place them on: the expansion's redistribution did not finish",
                                 fix="finish it (`gpcdc sandbox expand --finish` for a sandbox), then extend")


def _refuse_own_placement(cluster: Cluster) -> None:
    if not cluster.toolkit_routing:
        raise BootstrapError(f"a {cluster.kind} source places rows by its own shards, which capture of one node from "
                             "a cut cannot name on the target",
                             fix="bootstrap the pipeline again and replay into a fresh target")


def _capture_from_a_cut(cluster: Cluster, pipeline: Pipeline, node: Node, kafka: Mapping[str, str], *,
                        lost: str | None, joined: bool, timeout: float) -> Repair:
    """A new slot on ``node``, a consistent cut with its rows copied as of it, and the
    marks that tell readers (the lost mark, unless the node ``joined`` and was never
    captured or capture wrote it; for a joined node first the pipeline's marker)."""
    content = node.content
    start = pipeline.start_point()
    # Every attempt takes a new number, kept even when it fails: a mark it may have left
    # in the stream is never taken for a later repair's.
    attempts = pipeline.repairs_dir / f"seg{content}.attempts"
    previous = start.repair(content)
    number = max(int(attempts.read_text()) if attempts.is_file() else 0, previous.number if previous else 0) + 1
    attempts.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(attempts, str(number))
    directory = pipeline.repair_dir(content, number)
    _drop_slot(cluster, node, pipeline.slot)
    _ensure_publications(cluster, pipeline.publication)
    slot = _Slot(cluster, node, pipeline.slot)
    try:
        slot.create(export=False, timeout=timeout)
        slot.close()
        repair = _cut_and_copy(cluster, node, slot, number, directory, timeout, joined)
        topics = Topics(pipeline.prefix)
        if joined and lost is None:
            _mark_joined(kafka, topics, repair, start.identity)
        else:
            _mark(kafka, topics, repair, lost or "")
        # Last: from here on the segment's worker captures from the new slot. A repair
        # stopped before it leaves the old slot's record, so it can be run again.
        write_json(directory / "repair.json", repair.to_json())  # read by Pipeline.start_point
    except BaseException:
        slot.close()
        _drop_slot(cluster, node, pipeline.slot)
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return repair


def _why_lost(cluster: Cluster, node: Node, recorded: NodeStart) -> str | None:
    """Why the node's capture can no longer go on from its slot (None: it can)."""
    conn = replication_connection(cluster, node)
    try:
        with conn.cursor() as cur:
            cur.execute("IDENTIFY_SYSTEM")
            system_identifier, timeline, _, _ = cur.fetchone()
    finally:
        conn.close()
    with cluster.connect_node(node) as probe:
        row = probe.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                            (recorded.slot,)).fetchone()
    change = node_change(node, recorded, system_identifier=str(system_identifier), timeline=int(timeline),
                         slot_found=row is not None, wal_status=row[0] if row else None)
    return None if change is None else change.message


def _drop_slot(cluster: Cluster, node: Node, slot: str) -> None:
    with cluster.connect_node(node) as conn:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        if row is None:
            return
        if row[0]:
            conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
        _drop_when_released(conn, slot)


def _cut_and_copy(cluster: Cluster, node: Node, slot: _Slot, number: int, directory: Path, timeout: float,
                  joined: bool) -> Repair:
    with ExitStack() as stack:
        controller = stack.enter_context(cluster.coordinator_connection())
        holder = stack.enter_context(cluster.connect_node(node, autocommit=False))
        with cluster.commit_pause(controller, timeout) as snapshot:
            # No commit phase runs (DDL included): the segment's snapshot, the distributed
            # one and the tables as the catalog lists them agree.
            tables = distributed_tables(cluster)
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            name, lsn, visible = holder.execute(  # type: ignore[misc]
                "SELECT pg_export_snapshot(), pg_current_wal_lsn()::text, pg_current_snapshot()::text").fetchone()
            coordinator_lsn = controller.execute(  # type: ignore[index]
                "SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
        if snapshot is None:
            raise BootstrapError(f"a {cluster.kind} source has no distributed snapshot to cut at",
                                 fix="bootstrap the pipeline again and replay into a fresh target")
        copier = stack.enter_context(cluster.connect_node(node, autocommit=False))
        copier.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        copier.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(name)))
        # The placement: the replayer finds the target's rows of this segment by it.
        manifest: dict[str, Any] = {"tables": {}, "positions": {str(node.content): lsn},
                                    "placement": {"segment": node.content, "segments": cluster.segment_count},
                                    "cut": {"xmax": snapshot.xmax, "in_progress": sorted(snapshot.in_progress)}}
        export_tables(copier, node.content, [(t, cluster.relation(node, t)) for t in tables], directory, manifest)
        write_manifest(directory, manifest)
        copier.rollback()
    return Repair(number, NodeStart(node.content, slot.name, slot.consistent_lsn, parse_lsn(lsn), name, visible,
                                    **slot.identity),
                  snapshot, parse_lsn(coordinator_lsn), dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
                  joined)


def _mark(kafka: Mapping[str, str], topics: Topics, repair: Repair, lost: str) -> None:
    """The lost mark (unless the partition ends with one: capture wrote it when it
    stopped), then the repaired mark."""
    content = repair.node.content
    marks = [repaired_marker(repair)]
    if _marked_lost(kafka, topics, content) is None:
        marks.insert(0, lost_marker(content, lost))
    _produce(kafka, topics, content, marks)


def _marked_lost(kafka: Mapping[str, str], topics: Topics, content: int) -> str | None:
    """The reason of the lost mark the segment's partition ends with, if it ends with
    one: its capture stopped for good (say, Kafka lost what it had confirmed), although
    its server and slot are as they were."""
    return lost_reason(json_value(last_message(kafka, topics.changes, content)))


def _produce(kafka: Mapping[str, str], topics: Topics, content: int, marks: list[Outbound]) -> None:
    errors: list[str] = []
    producer = Producer({**kafka, "enable.idempotence": True, "acks": "all",
                         "on_delivery": lambda err, _msg: errors.append(str(err)) if err else None})
    for mark in marks:
        producer.produce(topics.changes, mark.value, partition=content)
    if producer.flush(30) or errors:
        raise BootstrapError(f"Kafka did not take the marks of {topics.changes} partition {content}"
                             + (f": {errors[0]}" if errors else ""), fix="check the broker, then run the command again")


def _mark_joined(kafka: Mapping[str, str], topics: Topics, repair: Repair, identity: str) -> None:
    """A joined segment's partition: the pipeline's marker (unless an earlier attempt
    wrote it), then the repaired mark."""
    content = repair.node.content
    marks = [repaired_marker(repair)]
    if end_offsets(kafka, topics.changes, [content])[content] == 0:
        marks.insert(0, pipeline_marker(identity, content, numbered=True))
    _produce(kafka, topics, content, marks)


def _grow_changes_topic(kafka: Mapping[str, str], topics: Topics, partitions: int) -> None:
    """One partition of the changes topic per segment (Kafka only ever adds partitions)."""
    from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]  # C module, no __all__

    admin = AdminClient(dict(kafka))
    metadata = admin.list_topics(topics.changes, timeout=10).topics.get(topics.changes)
    if metadata is None or metadata.error is not None:
        raise BootstrapError(f"topic {topics.changes} is not on the broker", fix="start capture once before extending")
    if len(metadata.partitions) >= partitions:
        return
    for future in admin.create_partitions([NewPartitions(topics.changes, partitions)]).values():
        future.result(30)


__all__ = ["extend_pipeline", "repair_segment"]
