"""A capture worker: one node's logical decoding stream into Kafka, with no loss.

The loop reads pgoutput from the node's slot (psycopg2's replication stream), turns it
into protocol events (:class:`~gpcdc_toolkit.protocol.TransactionAssembler`) and
produces them with an idempotent producer. It does not wait for Kafka: every
``ack_interval`` it notes how far the events produced so far would let the slot's
flush position move, and moves it there once Kafka has confirmed them all
(``_confirmations``); so a crash at any moment loses nothing, and what is sent again
after a restart carries the same (segment, commit LSN, sequence) and is recognisable
as a duplicate.

Every ``heartbeat_interval`` it produces a resolved watermark: every commit of the
node below ``resolved`` is in Kafka, and so is every commit that happened on the
node's clock before ``resolved_ts_ms``. Idle nodes get watermarks too.

Lost connections, to the server or to Kafka, restart the session with backoff from the
slot's flush position; nothing is acknowledged meanwhile.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import psycopg2
import psycopg2.extras
from confluent_kafka import KafkaError, KafkaException, Producer

from .._runtime import StateWriter, read_json
from ..cluster import Cluster, Node
from ..config import CaptureSettings
from ..connect import METADATA_REFRESH, kafka_logger
from ..errors import BrokerError, ClusterChangedError, ConfigError, GpcdcError, StreamError, UnreachableError, first_line
from ..ingest import UNNUMBERED, end_offsets, first_message, json_value, last_message, last_numbering, located
from ..protocol import (
    COORDINATOR,
    DECODING_SETTINGS,
    Dispatcher,
    Outbound,
    ProtocolError,
    StartPoint,
    Topics,
    encoder_built,
    format_lsn,
    is_pipeline_marker,
    lost_marker,
    lost_reason,
    numbering_of,
    parse_lsn,
    pipeline_marker,
)
from ._changes import REBOOTSTRAP, added_nodes, node_change
from ._confirmations import Confirmations
from ._hosts import worker_application

log = logging.getLogger(__name__)

_ANY_PARTITION = [-1]  # the client's partitioner chooses, by key
_CLOCK_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"



def pin_decoding_settings(cursor: Any) -> None:
    """Set the replication session's settings of value text (:data:`DECODING_SETTINGS`)."""
    for name, value in DECODING_SETTINGS.items():
        cursor.execute(f"SET {name} = '{value}'")


class DeliveryFailed(RuntimeError):
    """Kafka refused a message, or the producer stopped at an error that could have left
    a gap: the session restarts from the slot."""


class StopRequested(Exception):
    """A stop asked for while the worker waited for Kafka: the session ends, and what
    was not acknowledged comes again from the slot."""


class HistoryLost(StreamError):
    """The node's partition no longer holds what capture acknowledged to the slot (a
    broker that lost its data, a topic deleted and created again), or holds another
    bootstrap's events: writing on would make the stream silently incomplete."""


class TailLost(StreamError):
    """Kafka confirmed an event of a partition at or before an offset it had confirmed
    before: it lost what came between (a leader elected without it), and capture
    would write on as if nothing had been lost."""


@dataclass(frozen=True)
class WorkerSettings:
    prefix: str
    kafka: dict[str, str]
    capture: CaptureSettings = CaptureSettings()
    replicas: int = 0  # of each topic capture creates; 0: the brokers' default


@dataclass
class WorkerStats:
    node: int
    slot: str
    pid: int = 0
    state: str = "starting"
    events: int = 0
    bytes: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # events by kind (row, begin, end, resolved, commit, ddl)
    transactions: int = 0
    dropped_transactions: int = 0
    rolled_back_parts: int = 0  # prepared parts rolled back: never committed, never sent
    acked_lsn: int = 0
    server_lsn: int = 0  # how far the server has sent WAL, from its keepalives
    resolved_lsn: int = 0
    resolved_ts_ms: int = 0
    last_commit_ts_ms: int | None = None
    restarts: int = 0
    last_error: str | None = None
    updated_ms: int = 0


# The settings each partition's order rests on; ``[kafka.client]`` may not change them.
DELIVERY_GUARANTEES: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    # A message that timed out locally leaves a gap: later ones of its partition may
    # already be written, and the slot sends it again after them. So none times out:
    # while Kafka does not answer, the worker waits for it, and a failure that could
    # still leave a gap stops the producer (a fatal error) instead.
    "message.timeout.ms": 0,
    "enable.gapless.guarantee": True,
}


def producer_config(settings: WorkerSettings) -> dict[str, Any]:
    return {
        # Batches compressed: the broker writes and replicates about a third of the bytes,
        # and producing takes 40% less time a row (docs/benchmarks.md). [kafka.client]
        # may choose another codec, or none.
        "compression.type": "lz4",
        **METADATA_REFRESH,  # a stalled partition's events, and the slot, wait seconds, not minutes
        **settings.kafka,
        **DELIVERY_GUARANTEES,
        "linger.ms": 5,
        # With five produce requests unanswered (idempotence's most, and librdkafka's
        # default for it), librdkafka 2.16's broker thread spins on a whole core until an
        # answer or a metadata refresh comes; with four it waits. Sixty workers spinning
        # take the CPU a broker on the same machine needs to answer them
        # (bench/bench_waiting_workers.py, docs/benchmarks.md).
        "max.in.flight.requests.per.connection": 4,
        "batch.num.messages": 10000,
        "queue.buffering.max.kbytes": settings.capture.producer_queue_kbytes,
        "queue.buffering.max.messages": 200000,
        "partitioner": "murmur2_random",
        # No callback by default: only the events that prove others ask for their
        # delivery reports (``_confirmations``).
        "logger": kafka_logger(),
    }


class CaptureWorker:
    """Streams one node's slot into Kafka. ``source`` finds the source cluster again
    at each session (default: through the coordinator ``cluster`` was found at): a
    coordinator whose standby took over is found where the configuration now leads."""

    def __init__(self, cluster: Cluster, node: Node, start: StartPoint, settings: WorkerSettings,
                 *, database: str, partitions: int, status_file: Path | None = None,
                 confirmed_file: Path | None = None, source: Callable[[], Cluster] | None = None) -> None:
        self.cluster = cluster
        self._source = source or (lambda: type(self.cluster).connect(self.cluster.coordinator_dsn))
        self.node = node
        self.start = start
        self.settings = settings
        self.database = database
        self.topics = Topics(settings.prefix)
        self.dispatcher = Dispatcher(settings.capture.dispatcher, partitions)
        self.slot = start.node(node.content).slot
        self.status_file = status_file
        # The offset of the last event of the node's own partition that Kafka confirmed,
        # kept across the worker's restarts, so that a session can tell a tail Kafka lost
        # (_check_tail).
        self.confirmed_file = confirmed_file
        self.stats = WorkerStats(node=node.content, slot=self.slot)
        self._confirmations = Confirmations()
        self._last_keepalive = 0.0  # when the worker last told the server it is there, waiting for Kafka
        self._status: StateWriter | None = None  # the status file's writer, while ``run`` runs
        self._confirmed: StateWriter | None = None  # the confirmed file's, likewise
        self._offset_recorded = -1  # the highest this process recorded (its write may not be done)
        repair = start.repair(node.content)
        self._repair = repair.number if repair is not None else 0  # a record counts for the slot it was made with

    # -- the outer loop: reconnect with backoff -------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self._status = StateWriter(self.status_file) if self.status_file is not None else None
        self._confirmed = StateWriter(self.confirmed_file) if self.confirmed_file is not None else None
        try:
            self._run(stop)
        finally:
            for writer in (self._status, self._confirmed):
                if writer is not None:
                    writer.close()

    def _run(self, stop: threading.Event) -> None:
        self.stats.pid = os.getpid()
        if not encoder_built():
            log.warning("%s: capture's row encoder is not built (the package was installed without a C compiler or "
                        "Python's headers): rows are encoded in Python, at about half the speed; reinstall the "
                        "package where gcc and python3-dev are", self.node)
        backoff = 0.5
        while not stop.is_set():
            began = time.monotonic()
            try:
                self._session(stop)
                self._set_state("stopped")
                return
            except StopRequested:
                break
            except (ProtocolError, HistoryLost, ClusterChangedError) as e:
                self.stats.last_error = str(e)
                self._set_state(f"failed: {e}")
                raise  # starting over would meet it again
            except Exception as e:  # servers, Kafka, and the Kafka client's own failures
                reason = first_line(e)
                if isinstance(e, GpcdcError) and not _retryable(e):
                    self.stats.last_error = reason
                    self._set_state(f"failed: {reason}")
                    raise
                self.stats.restarts += 1
                self.stats.last_error = reason
                self._set_state(f"reconnecting in {backoff:g} s")
                log.warning("%s: %s; reconnecting in %g s", self.node, reason, backoff)
            if time.monotonic() - began > 60:
                backoff = 0.5
            stop.wait(backoff)  # backoff, cut short by a stop request
            backoff = min(backoff * 2, self.settings.capture.max_backoff)
        self._set_state("stopped")

    def _set_state(self, state: str) -> None:
        self.stats.state = state
        self._write_status()

    def _write_status(self) -> None:
        self.stats.updated_ms = int(time.time() * 1000)
        if self._status is not None:
            self._status.write(self.stats.__dict__)

    # -- one session: from the slot's flush position until stopped or broken --------------
    def _session(self, stop: threading.Event) -> None:
        from ..broker import check_reachable

        check_reachable(self.settings.kafka)
        ensure_topics(self.settings.kafka, self.topics, self.dispatcher.partitions, self.settings.replicas)
        self._confirmations = Confirmations()
        producer = Producer(producer_config(self.settings))
        self.node = self._current_node()
        probe = self.cluster.connect_node(self.node)
        conn = None
        try:
            # Named, so that any host sees which worker holds the slot (``_hosts``).
            conn = psycopg2.connect(self.cluster.dsn(self.node),
                                    connection_factory=psycopg2.extras.LogicalReplicationConnection,
                                    connect_timeout=10,
                                    application_name=worker_application(socket.gethostname(), os.getpid()))
            cur = conn.cursor()
            pin_decoding_settings(cur)
            try:
                acked = self._slot_position(cur, probe)
            except ClusterChangedError as e:
                self._mark_lost(producer, e.message)
                raise
            numbered_after = self._numbered_after() if self._check_history(producer, acked) else None
            self._check_tail(producer)
            cur.start_replication(slot_name=self.slot, decode=False, options={
                **self.cluster.decoding_options(), "publication_names": self.start.publication})
            try:
                self._loop(stop, cur, conn, producer, probe, acked, numbered_after)
            except TailLost as e:
                self._mark_lost(producer, e.message)
                raise HistoryLost(e.message, fix=self._fix_for_lost()) from None
        finally:
            try:
                producer.purge()  # unacknowledged events come again from the slot
            except Exception as e:  # the session is over either way
                log.warning("%s: purging the producer failed: %s", self.node, e)
            if conn is not None:
                conn.close()
            probe.close()

    def _current_node(self) -> Node:
        """The server that answers for this node now, from the coordinator's catalog (a
        mirror promoted in place of a failed primary answers on another port)."""
        try:
            current = self._source()
        except UnreachableError:
            return self.node  # the session fails on it, and is retried
        self.cluster = current
        if added := added_nodes((n.content for n in current.nodes), self.start.captured_nodes):
            raise added
        for node in current.nodes:
            if node.content == self.node.content:
                return node
        raise ClusterChangedError(f"the source no longer lists {self.node}", fix=REBOOTSTRAP)

    def _slot_position(self, cur: Any, probe: psycopg.Connection[Any]) -> int:
        """Where the slot was acknowledged to, once the server is the one the slot was
        made on and the slot is still there and usable."""
        cur.execute("IDENTIFY_SYSTEM")
        system_identifier, timeline, _, _ = cur.fetchone()
        row = probe.execute("SELECT confirmed_flush_lsn::text, wal_status FROM pg_replication_slots "
                            "WHERE slot_name = %s", (self.slot,)).fetchone()
        if change := node_change(self.node, self.start.node(self.node.content), system_identifier=str(system_identifier),
                                 timeline=int(timeline), slot_found=row is not None, wal_status=row and row[1]):
            raise change
        assert row is not None
        return parse_lsn(row[0])

    def _mark_lost(self, producer: Producer, reason: str) -> None:
        """End the node's partition with a lost mark (see ``lost_marker``), so that readers
        stop waiting for its parts; where the partition is not the node's own, readers
        cannot be told, and wait."""
        if self.dispatcher.kind != "segment":
            return
        topic, partition = self._own_partition()
        if lost_reason(json_value(last_message(self.settings.kafka, topic, partition))) is not None:
            return  # marked by a session before: one mark ends the partition
        if not self._deliver(producer, topic, partition, lost_marker(self.node.content, reason).value):
            raise DeliveryFailed(f"Kafka did not take {self.node}'s lost mark; {reason}")

    def _check_history(self, producer: Producer, acked: int) -> bool:
        """Before streaming: the node's partition must begin with this bootstrap's
        pipeline marker. An empty one gets it, unless the slot was acknowledged past its
        start: then Kafka lost what it had acknowledged, and capture stops for good.
        Returns whether the partition's parts are numbered, as its marker says (a
        pipeline bootstrapped before parts were numbered goes on without numbers), or
        may be, where retention removed the marker (:meth:`_numbered_after` tells)."""
        if self.dispatcher.kind != "segment":
            return False  # partitions are shared by every node's worker: none of them owns one
        content = self.node.content
        topic, partition = self._own_partition()
        identity = self.start.identity
        first = first_message(self.settings.kafka, topic, partition)
        if first is None:
            if acked > self.start.node(content).consistent_lsn:
                raise HistoryLost(
                    f"{topic} partition {partition} is empty, but {self.node}'s slot was acknowledged to "
                    f"{format_lsn(acked)}, past the pipeline's start: Kafka lost events it had acknowledged "
                    "(a broker restarted without its data, or the topic was deleted)",
                    fix="bootstrap the pipeline again (`gpcdc bootstrap drop --delete-topics`, then "
                        "`gpcdc bootstrap create`) and replay into a fresh target")
            marker = pipeline_marker(identity, content, numbered=self._numbered)
            if not self._deliver(producer, topic, partition, marker.value):
                raise DeliveryFailed(f"Kafka did not take the pipeline marker of {topic} partition {partition}")
            return self._numbered
        if located(first)[1] > 0:
            return self._numbered  # retention removed the partition's head, marker included: nothing left to compare
        decoded = json_value(first)
        if not is_pipeline_marker(decoded, identity):
            owner = decoded["pipeline"] if isinstance(decoded, dict) and is_pipeline_marker(decoded) else None
            raise HistoryLost(
                f"{topic} partition {partition} begins with "
                + (f"the events of another bootstrap ({owner}, not {identity})" if owner else
                   "something other than this pipeline's marker") + ": the topics belong to another pipeline",
                fix="use another kafka.topic_prefix, or delete the old topics "
                    "(`gpcdc bootstrap drop --delete-topics`) and bootstrap again")
        return self._numbered and isinstance(decoded, dict) and numbering_of(decoded) is not None

    def _check_tail(self, producer: Producer) -> None:
        """Before streaming: the node's own partition must not end with a lost mark (its
        capture stopped for good), and must still hold the last event Kafka confirmed to
        this node's workers, as ``confirmed_file`` recorded it. Were Kafka to lose a tail
        it had confirmed (a broker back without what it had not written to disk, an
        unclean leader election), the slot would not send it again, and capture would
        number what comes next on from the tail that is left: a lost part that no gap
        shows. Then the partition ends with a lost mark, and capture stops for good."""
        if self.dispatcher.kind != "segment":
            return
        topic, partition = self._own_partition()
        end = end_offsets(self.settings.kafka, topic, [partition])[partition]
        stopped = lost_reason(json_value(last_message(self.settings.kafka, topic, partition, end=end)))
        if stopped is not None:
            raise HistoryLost(f"{self.node}'s capture stopped for good: {stopped}", fix=self._fix_for_lost())
        recorded = self._recorded_offset(topic, partition)
        if recorded is None or end > recorded:
            return
        reason = (f"{topic} partition {partition} ends before offset {recorded}, where Kafka had confirmed an event "
                  f"of {self.node}'s capture: Kafka lost events it had acknowledged")
        self._mark_lost(producer, reason)
        raise HistoryLost(reason, fix=self._fix_for_lost())

    def _fix_for_lost(self) -> str:
        if self.node.content != COORDINATOR and self.cluster.toolkit_routing:  # what a repair can capture again
            return f"capture the segment again (`gpcdc bootstrap repair --segment {self.node.content}`)"
        return ("bootstrap the pipeline again (`gpcdc bootstrap drop --delete-topics`, then `gpcdc bootstrap create`) "
                "and replay into a fresh target")

    def _own_partition(self) -> tuple[str, int]:
        content = self.node.content
        return (self.topics.dtx, 0) if content == COORDINATOR else (self.topics.changes, content)

    def _recorded_offset(self, topic: str, partition: int) -> int | None:
        """The offset of the last event of the node's partition that Kafka confirmed, as
        recorded for this pipeline and the node's slot (a repair's marks come after a
        lost mark, which a lost tail leaves before the offset recorded then), or by this
        process (None: none recorded)."""
        found = [self._offset_recorded] if self._offset_recorded >= 0 else []
        try:
            recorded = read_json(self.confirmed_file) if self.confirmed_file is not None else {}
        except (OSError, ValueError):
            recorded = {}  # none yet, or unreadable: nothing to compare with
        if (recorded.get("pipeline"), recorded.get("repair"), recorded.get("topic"), recorded.get("partition")) == (
                self.start.identity, self._repair, topic, partition) and isinstance(recorded.get("offset"), int):
            found.append(int(recorded["offset"]))
        return max(found, default=None)

    def _record_offset(self, topic: str, partition: int) -> None:
        """Record the offset of the last event of the node's partition Kafka confirmed,
        in a thread of its own (the worker does not wait for the disk)."""
        offset = self._confirmations.offsets.get((topic, partition))
        if self._confirmed is not None and offset is not None and offset > self._offset_recorded:
            self._confirmed.write({"pipeline": self.start.identity, "repair": self._repair, "topic": topic,
                                   "partition": partition, "offset": offset})
            self._offset_recorded = offset

    def _deliver(self, producer: Producer, topic: str, partition: int, value: bytes) -> bool:
        """Produce one reported event and wait until Kafka confirms it; False if Kafka
        did not within ``flush_timeout``."""
        producer.produce(topic, value, partition=partition, on_delivery=self._confirmations.on_delivery)
        self._confirmations.sent(topic, partition)
        return producer.flush(self.settings.capture.flush_timeout) == 0 and self._confirmations.error is None

    @property
    def _numbered(self) -> bool:
        """Whether this node's parts are numbered in a new partition: a segment's own
        partition, in the segment dispatcher's layout. A gap in the numbers proves parts
        lost, and stops the segment's order there: a lost part is not in its segment's
        log, so without the numbers a later part could go out before it is missed."""
        return self.dispatcher.kind == "segment" and self.node.content != COORDINATOR

    def _numbered_after(self) -> tuple[int, int] | None:
        """(LSN, number) from the partition's tail: the number of the last part handed
        out, and an LSN up to which every commit is in the partition (an END's commit
        LSN, a watermark's resolved position; the marker: nothing yet). None when the
        partition's parts are not numbered: retention removed its marker, and its last
        END or watermark carries no number (a pipeline bootstrapped before they were)."""
        topic, partition = self.topics.changes, self.node.content
        stop = end_offsets(self.settings.kafka, topic, [partition])[partition]
        found = last_numbering(self.settings.kafka, topic, partition, stop)
        if found == UNNUMBERED:
            return None
        if found is not None:
            return found
        raise HistoryLost(f"{topic} partition {partition} holds neither its pipeline's marker nor an END or a watermark "
                          "to say whether its parts are numbered",
                          fix="bootstrap the pipeline again (`gpcdc bootstrap drop --delete-topics`, then "
                              "`gpcdc bootstrap create`) and replay into a fresh target")

    def _loop(self, stop: threading.Event, cur: Any, conn: Any, producer: Producer,
              probe: psycopg.Connection[Any], acked: int, numbered_after: tuple[int, int] | None) -> None:
        settings, stats = self.settings, self.stats
        assembler = self.cluster.translator(self.node, source_name=settings.prefix, database=self.database,
                                            start=self.start, max_buffered=settings.capture.max_buffered,
                                            numbered_after=numbered_after)
        produced_end = acked  # end LSN of the last transaction whose events were all produced
        resolved = acked
        # (flush LSN, server ms, ms before the prepared list was read, gxids prepared), oldest first
        clock_probes: deque[tuple[int, int, int, list[int]]] = deque(maxlen=64)
        next_ack = next_beat = time.monotonic()
        self._set_state("streaming")
        produce = self._producer(producer, stop, cur)
        confirmations = self._confirmations
        while not stop.is_set():
            message = cur.read_message()
            caught_up = message is None
            if message is not None:
                produce(assembler.feed(message.payload))
                if not assembler.in_transaction and assembler.completed_end_lsn is not None:
                    produced_end = max(produced_end, assembler.completed_end_lsn)
            now = time.monotonic()
            if now >= next_beat and not assembler.in_transaction:
                next_beat = now + settings.capture.heartbeat_interval
                clock_probes.append(self._probe(probe))
                candidate = max(produced_end, cur.wal_end if caught_up else 0)
                if (held := assembler.held_from) is not None:
                    candidate = min(candidate, held - 1)  # commits decoded but held back are not in Kafka yet
                resolved = max(resolved, candidate)
                covered = [p for p in clock_probes if p[0] <= resolved]
                if covered and covered[-1][1] >= stats.resolved_ts_ms:
                    _lsn, stats.resolved_ts_ms, prepared_ms, prepared = covered[-1]
                    beat = assembler.resolved(resolved, stats.resolved_ts_ms, prepared=prepared,
                                              prepared_ts_ms=prepared_ms)
                else:
                    beat = assembler.resolved(resolved, stats.resolved_ts_ms or None)
                stats.resolved_lsn = resolved
                stats.server_lsn = max(stats.server_lsn, cur.wal_end)
                produce([beat])
                cur.send_feedback(reply=True)  # a keepalive tells how far the server has sent
                self._write_status()
            if now >= next_ack:
                next_ack = now + settings.capture.ack_interval
                confirmations.checkpoint(self._ack_target(assembler, produced_end, resolved), now)
                producer.poll(0)  # serves delivery reports
                acked = self._acknowledge(cur, acked, now)
                stats.transactions = assembler.transactions
                stats.last_commit_ts_ms = assembler.last_commit_ts_ms
                stats.dropped_transactions = assembler.dropped_transactions
                stats.rolled_back_parts = assembler.rolled_back_parts
            if caught_up:
                producer.poll(0)
                acked = self._acknowledge(cur, acked, now)
                wait = max(0.0, min(next_ack, next_beat) - time.monotonic())
                if (look := confirmations.look_again_in(now)) is not None:
                    wait = min(wait, look)
                select.select([conn], [], [], wait)
        # Stopping: what Kafka confirms within flush_timeout is not sent again.
        confirmations.checkpoint(self._ack_target(assembler, produced_end, resolved), time.monotonic())
        producer.flush(settings.capture.flush_timeout)
        self._acknowledge(cur, acked, time.monotonic())

    @staticmethod
    def _ack_target(assembler: Any, produced_end: int, resolved: int) -> int:
        target = max(produced_end, resolved)
        limit = assembler.ack_limit  # parts decoded but not handed out must be decoded again after a restart
        return target if limit is None else min(target, limit)

    def _probe(self, probe: psycopg.Connection[Any]) -> tuple[int, int, int, list[int]]:
        """The node's clock, then the parts it holds prepared, then its flush LSN and
        clock: three statements, so that the list is read after the first clock reading
        and before the second."""
        prepared_ms = probe.execute(f"SELECT {_CLOCK_MS}").fetchone()[0]  # type: ignore[index]
        gxids = [g for (name,) in probe.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
            if (g := self.cluster.gxid_of(name)) is not None]
        lsn, server_ms = probe.execute(f"SELECT pg_current_wal_flush_lsn()::text, {_CLOCK_MS}").fetchone()  # type: ignore[misc]
        return parse_lsn(lsn), int(server_ms), int(prepared_ms), gxids

    def _producer(self, producer: Producer, stop: threading.Event, cur: Any) -> Callable[[list[Outbound]], None]:
        content = self.node.content
        stats = self.stats
        fixed: list[int] | None  # every event's partition, when the dispatcher fixes one for all
        if content == COORDINATOR:
            topic, fixed = self.topics.dtx, [0]
        else:
            topic, fixed = self.topics.changes, self.dispatcher.partitions_for("row", content)
        partitions_for = self.dispatcher.partitions_for
        kinds = stats.kinds
        send = producer.produce
        confirmations = self._confirmations
        reported = confirmations.on_delivery

        def produce(outs: list[Outbound]) -> None:
            for out in outs:
                row = out.kind == "row"
                for partition in fixed or partitions_for(out.kind, content) or _ANY_PARTITION:
                    while True:
                        try:
                            if row:  # proven by the reported event that follows it (``_confirmations``)
                                send(topic, out.value, out.key, partition=partition)
                            else:
                                send(topic, out.value, out.key, partition=partition, on_delivery=reported)
                                confirmations.sent(topic, partition)
                            break
                        except BufferError:  # the bounded queue is full: let deliveries drain it
                            self._wait_for_room(producer, stop, cur)
                    stats.events += 1
                    stats.bytes += len(out.value)
                    kinds[out.kind] = kinds.get(out.kind, 0) + 1

        return produce

    def _wait_for_room(self, producer: Producer, stop: threading.Event, cur: Any) -> None:
        """While Kafka does not take the queue's events, none of them times out (see
        ``DELIVERY_GUARANTEES``): the wait ends when room is made, a delivery fails or a
        stop is asked for."""
        self._raise_delivery_error()
        if stop.is_set():
            raise StopRequested()
        if not self.stats.state.startswith("waiting for Kafka"):
            self._set_state(f"waiting for Kafka ({len(producer)} events unacknowledged, the queue full)")
        # The slot is not read meanwhile: a status message, at the positions already
        # sent, keeps the server from ending the connection at wal_sender_timeout.
        if time.monotonic() - self._last_keepalive > 5:
            cur.send_feedback(force=True)
            self._last_keepalive = time.monotonic()
        producer.poll(0.05)

    def _acknowledge(self, cur: Any, acked: int, now: float) -> int:
        """Move the slot as far as the delivery reports served so far allow."""
        self._raise_delivery_error()
        confirmations = self._confirmations
        position = confirmations.confirmed()
        if position is not None and position > acked:
            if self.dispatcher.kind == "segment":
                self._record_offset(*self._own_partition())
            cur.send_feedback(write_lsn=position, flush_lsn=position, apply_lsn=position, force=True)
            self.stats.acked_lsn = acked = position
        since = confirmations.waiting_since()
        if since is not None and now - since > self.settings.capture.flush_timeout:
            if not self.stats.state.startswith("waiting for Kafka"):
                self._set_state(f"waiting for Kafka ({confirmations.unconfirmed()} events unconfirmed "
                                f"for {now - since:.0f} s)")
        elif self.stats.state != "streaming":
            self._set_state("streaming")
        return acked

    def _raise_delivery_error(self) -> None:
        if (error := self._confirmations.error) is not None:
            raise DeliveryFailed(f"Kafka did not take an event: {error.str()}")
        if (went_back := self._confirmations.went_back) is not None:
            (topic, partition), before, offset = went_back
            raise TailLost(f"{topic} partition {partition} confirmed an event of {self.node}'s capture at offset "
                           f"{offset}, after one at offset {before}: Kafka lost events it had acknowledged")


def tune_for_capture() -> None:
    """For a process whose main work is a capture loop: its collector and its allocator.

    Each row event is a few dicts that live until its transaction is produced. At
    Python's default thresholds the cyclic collector runs every 700 allocations and its
    older generations rescan all the process set up. Freezing what exists and collecting
    less often made capture 1.2x faster (``bench/bench_capture.py``); the events hold no
    cycles, so little waits.

    A transaction's events are freed together once produced, at the top of the heap.
    glibc's malloc gives that memory back to the kernel whenever more than 128 KB is free
    there, and the next transaction faults the same pages in again, zeroed: 244,000
    page faults for 200,000 rows, half of decoding's time on a virtual machine
    (docs/benchmarks.md). Keeping up to ``_KEPT_FREE`` free at the top ends that; what
    the process holds at its peak is bounded as before (``max_buffered`` events)."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    _keep_freed_memory()


_KEPT_FREE = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters, from glibc's malloc.h


def _keep_freed_memory() -> None:
    """Fixing the trim threshold also fixes the size from which blocks are mapped apart
    (glibc stops adapting both): set as glibc's adaptation would end, at its largest, so
    that only blocks of more than 32 MB (an oversized value) are mapped and returned."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except AttributeError:
        return  # not glibc's allocator: left as it is
    mallopt(_M_MMAP_THRESHOLD, _KEPT_FREE // 2)
    mallopt(_M_TRIM_THRESHOLD, _KEPT_FREE)


def ensure_topics(kafka: Mapping[str, Any], topics: Topics, partitions: int, replicas: int = 0) -> None:
    """Create the pipeline's topics unless they exist (the changes topic with one
    partition per segment, the coordinator's with one), each with ``replicas``
    replicas (0: the brokers' default.replication.factor)."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # C module, no __all__

    admin = AdminClient(dict(kafka))
    existing = admin.list_topics(timeout=10).topics
    replication = replicas or -1  # -1: Kafka's for "the broker's default"
    wanted = [NewTopic(topics.changes, partitions, replication), NewTopic(topics.dtx, 1, replication)]
    missing = [t for t in wanted if t.topic not in existing]
    if not missing:
        return
    for topic, future in admin.create_topics(missing).items():
        try:
            future.result(15)
        except KafkaException as e:
            code = e.args[0].code()
            if code == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            if code in _REFUSED_TOPICS:  # retrying would meet the same answer
                fix = _REFUSED_TOPICS[code]
                if code == KafkaError.INVALID_REPLICATION_FACTOR:
                    with contextlib.suppress(KafkaException):  # the count is a help, the refusal the point
                        fix += f" ({len(admin.list_topics(timeout=10).brokers)})"
                raise ConfigError(f"Kafka refused to create topic {topic}: {e.args[0].str()}", fix=fix) from None
            raise


# Why Kafka may refuse a topic for good, with what to change.
_REFUSED_TOPICS = {
    KafkaError.INVALID_REPLICATION_FACTOR: "set kafka.replication_factor to at most the brokers' count",
    KafkaError.INVALID_PARTITIONS: "correct the partition count",
    KafkaError.INVALID_CONFIG: "correct the topic settings",
    KafkaError.POLICY_VIOLATION: "create the topics as the brokers' policy allows, before capture starts",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "grant the client CREATE on the topics, or create them before capture starts",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "grant the client CREATE on the cluster, or create the topics first",
}


def delete_topics(kafka: Mapping[str, Any], topics: Topics) -> list[str]:
    """Delete the pipeline's topics where they exist; returns those deleted."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(dict(kafka))
    existing = admin.list_topics(timeout=10).topics
    names = [t for t in (topics.changes, topics.dtx) if t in existing]
    for future in (admin.delete_topics(names).values() if names else ()):
        future.result(15)
    return names


def _retryable(error: GpcdcError) -> bool:
    return isinstance(error, (BrokerError, UnreachableError))
