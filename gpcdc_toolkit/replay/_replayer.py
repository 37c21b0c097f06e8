"""The replayer: the pipeline's topics in, whole transactions out to the target.

It reads every partition of the changes topic and the coordinator's topic (from Kafka
with one consumer, or from a Parquet archive of them: ``_feed``), frames messages into
parts and records (:class:`Framer`), orders them (:class:`Reassembler`) and applies
them in batches (:class:`Applier`), each batch with
the checkpoint that says where to read again after a crash. On a restart it reads
again from the checkpoint's resume offsets; up to its read offsets, the transactions it
meets may have been applied, so it asks the target which, and passes over those.
"""

from __future__ import annotations

import base64
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..bootstrap import InitialSnapshot, Pipeline
from ..cluster import Cluster, syncpoint_lock
from ..config import Config, ReplaySettings
from ..connect import kafka_client_settings, open_cluster
from ..errors import BrokerError, ClusterChangedError, GpcdcError, StreamError
from ..ingest import EndTracker
from ..protocol import COORDINATOR, Topics, is_pipeline_marker
from ._apply import Applier, Checkpoint, DdlRefusedError, commit_ts_ms
from ._feed import ArchiveFeed, Delivery, Feed, KafkaFeed
from ._legacy import SegmentOrder
from ._load import load_initial, prepare_target
from ._order import Missing, Part, Reassembler, Record, Whole, resume_point
from ._source import Framer, MalformedMessageError, Watermark
from ._spill import SpillDirectory, SqliteSpill
from ._until import syncpoints_in_kafka

log = logging.getLogger(__name__)


# Seconds without any message or end-of-partition event, while partitions still hold
# more, after which a run that must end gives up on the broker.
KAFKA_SILENCE = 60.0


class MissingPartError(StreamError):
    """A segment's part of a distributed transaction is proven never to arrive whole:
    missing, or damaged."""

    def __init__(self, missing: Missing, topics: Topics, read_to: int) -> None:
        present = ", ".join(f"segment {s} at offset {o}" for s, o in missing.offsets if s != COORDINATOR) or "none"
        record = dict(missing.offsets).get(COORDINATOR)
        what = f"gxid {missing.gxid}" if missing.gxid is not None else "a legacy part"
        where = (f"the commit record at offset {record} of {topics.dtx}" if record is not None
                 else "its one-phase commit")
        if missing.gxid is None and missing.damage is not None and missing.record_ts_ms < 0:  # a gap in the numbers
            what = f"segment {missing.segment}'s stream"
            offset = dict(missing.offsets).get(missing.segment)
            why = (f"{missing.damage} (before offset {offset} of {topics.changes} partition {missing.segment})"
                   if offset is not None else f"{missing.damage} (before its latest watermark)")
        elif missing.lost is not None and record is None:  # its record is what never came
            why = missing.lost
        elif missing.lost is not None:
            why = f"{missing.lost}; {where} lists segment {missing.segment}, whose part never came"
        elif missing.damage is not None:
            offset = dict(missing.offsets).get(missing.segment)
            why = (f"segment {missing.segment}'s part at offset {offset} of {topics.changes} partition "
                   f"{missing.segment} is damaged: {missing.damage}; {where}")
        else:
            why = (f"segment {missing.segment}'s part is missing (read to offset {read_to} of {topics.changes} "
                   f"partition {missing.segment}, whose watermark is {missing.watermark_ts_ms - missing.record_ts_ms} "
                   f"ms past {where}, and the segment no longer holds gxid {missing.gxid} prepared)")
            if missing.gap is not None:
                first, last = missing.gap
                numbers = f"{first}" if first == last else f"{first} to {last}"
                why += (f"; segment {missing.segment}'s parts numbered {numbers} never arrived, so that its part "
                        "changed nothing cannot be shown")
        lacking = f"the coordinator's events to {topics.dtx}" if missing.lost is not None and record is None else \
            f"segment {missing.segment}'s events to the topic"
        super().__init__(
            f"{what} cannot be replayed whole: {why}; parts present: {present}",
            fix=f"nothing of {what} was applied, nor anything that must follow it; restore {lacking}, or bootstrap "
                "the pipeline again")
        self.missing = missing


@dataclass(frozen=True)
class Progress:
    transactions: int  # applied in this run
    rows: int
    ddl: int
    pending: int  # arrived in part, or whole and not yet applied
    lag_ms: int  # now minus the source commit time of the oldest transaction not yet applied
    elapsed_s: float
    caught_up: bool  # every partition read to where it ended when the run began
    set_aside: int = 0  # malformed messages quarantined in this run
    batches: int = 0  # target transactions committed
    batch_seconds: float = 0.0  # the time they took, applied and committed
    empty: int = 0  # of the transactions, those with no row and no DDL (the bootstrap's cut, sync points)

    @property
    def rate(self) -> float:
        return self.transactions / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        return (f"applied {self.transactions} transactions ({self.ddl} DDL, {self.empty} without rows, "
                f"{self.rows} row changes), "
                f"{self.rate:,.0f} tx/s, {self.rows_per_s:,.0f} rows/s, {self.pending} pending, "
                f"lag {self.lag_ms / 1000:.1f} s"
                + (f"; {self.set_aside} malformed messages set aside (quarantine.jsonl)" if self.set_aside else ""))


class SyncPointNotReachedError(StreamError):
    """A replay asked to stop at a sync point read to the end without meeting it."""


class Replayer:
    """Replays one pipeline into the target; ``run`` once or following the stream.

    With ``archive``, the stream and the pipeline's record (start point, initial
    snapshot, repairs) are the archive's (``gpcdc archive``), and Kafka is not read."""

    def __init__(self, config: Config, *, target: Cluster | None = None, settings: ReplaySettings | None = None,
                 archive: Path | None = None) -> None:
        self.config = config
        self.settings = settings or config.replay
        self.topics = Topics(config.kafka.topic_prefix)
        self.pipeline = Pipeline(config.work_dir, config.kafka.topic_prefix)  # where this replay keeps its files
        self.archive = archive
        # Where the stream's own record is: the work directory's, or the archive's copy.
        self.record = Pipeline(archive, config.kafka.topic_prefix) if archive is not None else self.pipeline
        self.kafka = kafka_client_settings(config)
        self.target = target or open_cluster(config, "target")
        self.applier = Applier(self.target, config.kafka.topic_prefix, skip_ddl=self.settings.skip_ddl,
                               chunk_rows=self.settings.chunk_rows, repair_dir=self.record.repair_dir,
                               skipped_file=self.pipeline.skipped_ddl_file)
        self.initial_load: tuple[int, int] | None = None  # (rows, tables) when this replayer made the load
        self.latest: Progress | None = None  # the running run's progress, as last reported

    def close(self) -> None:
        self.applier.close()

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the run ------------------------------------------------------------------------
    def run(self, *, follow: bool = False, progress: Callable[[Progress], None] | None = None,
            should_stop: Callable[[], bool] = lambda: False, progress_interval: float = 0.5,
            until_syncpoint: int | None = None) -> Progress:
        """Apply what the topics hold; with ``follow``, keep applying what comes until
        ``should_stop()``; with ``until_syncpoint``, stop once that sync point is applied,
        with nothing after it (:class:`SyncPointNotReachedError` when the stream ends
        before it). Raises :class:`MissingPartError` rather than apply part of a
        transaction; everything before it is applied."""
        # Finds the topics before anything is written to the target; a following run
        # waits longer for a broker that is restarting. An archive does not grow: read once.
        follow = follow and self.archive is None
        feed: Feed = (ArchiveFeed(self.archive, self.topics) if self.archive is not None
                      else KafkaFeed(self.kafka, self.topics, 30.0 if follow else 10.0, follow=follow))
        try:
            run = _Run(self, feed, until_syncpoint)
        except BaseException:
            feed.close()
            raise
        last_report = 0.0
        try:
            if until_syncpoint is not None:
                self._check_stop(feed, until_syncpoint)
            identity = self._start_point_fingerprint()
            run.begin(self._start(identity), identity)
            if self.settings.legacy_per_segment:
                log.warning("replaying %s segment by segment (legacy markers): each row's history is replayed in "
                            "order and the target is exact once every segment is caught up, but until then it can "
                            "show part of a distributed transaction, and a missing part cannot be detected",
                            self.topics.prefix)
            for _ in run.steps():
                now = time.monotonic()
                if not follow:
                    run.check_heard(KAFKA_SILENCE)
                # Read to the end; what is in hand waits for a repair's copy, due once the
                # coordinator's stream passes the repair's cut, which a later run applies.
                done = run.reached or (run.caught_up and not follow and not run.ready_to_apply)
                if done or now - last_report >= progress_interval:
                    self._check_extended(run.segments)
                    self.latest = run.progress()
                    if progress is not None:
                        progress(self.latest)
                    last_report = now
                if done:
                    run.check_marked()
                    run.check_reached()
                if done or should_stop():
                    break
        finally:
            run.close()
        final = run.progress()
        if progress is not None:
            progress(final)
        return final

    def _check_stop(self, feed: Feed, gxid: int) -> None:
        """Refuse, before anything is applied, to stop at a sync point that this target
        has passed, or that the stream (when its whole is known) does not hold."""
        if self.applier.state() is not None and self.applier.applied_among({gxid}):
            raise GpcdcError(f"this target has applied sync point {gxid} already, and maybe more after it",
                             fix="rebuild into a fresh target to stop there")
        held = feed.syncpoints()
        if held is not None and gxid not in held:
            latest = ", ".join(map(str, held[-5:])) or "none"
            raise SyncPointNotReachedError(f"the archive holds no sync point {gxid} (its sync points, the latest: "
                                           f"{latest}); nothing was applied",
                                           fix="name one it holds (`gpcdc replay --archive PATH --list-syncpoints`)")
        if held is None:
            # Kafka: a sync point taken is in the stream, or on its way (recorded by the
            # command that took it). Any other would be looked for to the stream's end,
            # applying everything, past every point the target could have stopped at.
            in_kafka = [point for point, _ms in syncpoints_in_kafka(self.kafka, self.topics)]
            if gxid not in in_kafka and not (self.record.syncpoints_dir / f"{gxid}.json").is_file():
                latest = ", ".join(map(str, in_kafka[-5:])) or "none"
                raise SyncPointNotReachedError(f"sync point {gxid} is neither in the stream (its sync points, the "
                                               f"latest: {latest}) nor recorded by this pipeline; nothing was applied",
                                               fix="name one that `gpcdc replay --list-syncpoints` lists")

    def _check_extended(self, segments: int) -> None:
        """Stop when the pipeline captures more segments than this run reads partitions
        for (it was extended since the run began): a new segment's stream, and the copy
        its transactions wait for, are in a partition the run does not read."""
        if not self.record.start_point_file.is_file():
            return
        captured = [n.content for n in self.record.start_point().captured_nodes if n.content >= 0]
        if len(captured) > segments:
            raise ClusterChangedError(
                f"the pipeline captures segments {captured[segments:]}, beyond segments 0 to {segments - 1}, which "
                "this replay reads: it was extended to segments added to the source since the replay began",
                fix="run the replay again: it reads the new segments' partitions and goes on from its checkpoint")

    def _start_point_fingerprint(self) -> str:
        """Which bootstrap of the pipeline this is ("" where its start point is not here)."""
        return self.record.start_point().identity if self.record.start_point_file.is_file() else ""

    def _start(self, start_point: str) -> Checkpoint:
        # A replayer killed in a commit leaves prepared parts that hold row locks.
        self.target.resolve_in_doubt()
        state = self.applier.state()
        if state is not None:
            if state.start_point and start_point and state.start_point != start_point:
                raise GpcdcError(
                    f"this target holds the replay of an earlier bootstrap of pipeline {self.topics.prefix!r}; "
                    "the pipeline was bootstrapped again since, so its topics start over",
                    fix="replay into a fresh target (`gpcdc sandbox down --name <target> --remove`, then "
                        "`gpcdc sandbox up --name <target>`)")
            return state.checkpoint
        snapshot = self.record.snapshot_dir
        if not self.settings.initial_load:
            self.applier.start(start_point=start_point)
            return Checkpoint()
        if not (snapshot / "manifest.json").is_file():
            raise GpcdcError(f"pipeline {self.topics.prefix!r} has no initial snapshot in {snapshot} to load into "
                             "the target first",
                             fix=("archive again with the work_dir where `gpcdc bootstrap create` ran (it copies the "
                                  "snapshot), " if self.archive is not None else
                                  "replay with the work_dir where `gpcdc bootstrap create` ran, ")
                             + "or pass --no-replay-initial-load if the target already holds the data as of the "
                               "start point")
        loaded = InitialSnapshot(snapshot)
        prepare_target(self.applier.session, loaded)
        counted: list[int] = []
        self.applier.start(lambda tx: counted.append(load_initial(tx, loaded)), loaded_tables=len(loaded.tables),
                           start_point=start_point)
        self.initial_load = (sum(counted), len(loaded.tables))
        return Checkpoint()


class _Run:
    """One run's reading, ordering and applying: made (the topics found), then ``begin``
    from a checkpoint; ``steps`` yields after each poll."""

    def __init__(self, replayer: Replayer, feed: Feed, until_syncpoint: int | None = None) -> None:
        self.feed = feed
        self.until, self.reached = until_syncpoint, False  # stop once sync point ``until`` is applied
        self.syncpoints_read: list[int] = []  # the sync points' gxids met in the stream
        self.settings = replayer.settings
        self.applier = replayer.applier
        self.target = replayer.target
        self.topics = replayer.topics
        self.quarantine = replayer.pipeline.directory / "quarantine.jsonl"
        self.set_aside = 0  # malformed messages quarantined
        self.batches, self.batch_seconds = 0, 0.0  # target transactions committed, and their time
        self.spill_dir = SpillDirectory(self.settings.spill_dir, self.topics.prefix)
        self.partitions = feed.segments
        self.segments = len(self.partitions)

    def begin(self, checkpoint: Checkpoint, identity: str) -> None:
        """Start reading from ``checkpoint``; ``identity`` names the bootstrap whose
        marker the partitions must begin with ("": not known here)."""
        segments = self.partitions
        self.framer = Framer(self.topics.prefix, legacy=self.settings.legacy_per_segment,
                             read=checkpoint.read, lsn=checkpoint.lsn, spill_rows=self.settings.spill_rows,
                             spill=lambda: SqliteSpill(self.spill_dir.name))
        self.started = time.monotonic()
        self.stats_at_start = (self.applier.stats.transactions, self.applier.stats.rows, self.applier.stats.ddl,
                               self.applier.stats.empty)
        unknown = sorted(set(checkpoint.read) - {COORDINATOR, *segments})
        if unknown:
            raise StreamError(f"{self.topics.changes} has {len(segments)} partitions, but this target's replay read "
                              f"partitions {unknown} of it", fix="the topics were recreated: replay into a fresh target, "
                              "or bootstrap again")
        self.next = {p: checkpoint.resume.get(p, 0) for p in [COORDINATOR, *segments]}
        self.first_offsets_seen: set[int] = set()
        # Read from their very beginning: each partition must open with the pipeline's marker.
        self.identity = identity
        self.unmarked = {p for p, offset in self.next.items() if offset == 0 and not checkpoint.read}
        self.window_end = {p: o for p, o in checkpoint.read.items() if o > self.next.get(p, 0)}
        ends = self.feed.ends()
        for partition, read in sorted(self.window_end.items()):
            if ends[partition] < read:
                raise StreamError(f"{self._name(partition)} ends at offset {ends[partition]}, before offset {read} "
                                  "that this target's replay had read",
                                  fix="the topics were recreated: replay into a fresh target, or bootstrap again")
        self.ends = EndTracker(ends, self.next)
        self.heard = time.monotonic()  # when Kafka last delivered anything
        self.feed.start(self.next)
        self.reassembler: Reassembler | SegmentOrder | None = None
        self.applied_lsn = dict(checkpoint.applied_lsn)  # parts without a gxid up to these are applied
        self.repaired = dict(checkpoint.repaired)  # segment -> the latest repair whose rows are applied
        self.window: list[Part | Record | Watermark] = []  # framed while reading the window
        for segment in segments:
            # Where a segment is read from partway, the number of the part before its first
            # says whether a part right before it was lost (see Reassembler: numbered streams).
            if self.next[segment] > 0 and (count := self.feed.numbering_before(segment, self.next[segment])) is not None:
                self.window.append(Watermark(segment, -1, parts=count))
        self.in_hand: deque[Whole] = deque()  # handed out by the reassembler, not applied yet
        self.syncpoints: list[tuple[int, float]] = []  # (gxid, ms held there) of the sync points passed

    def close(self) -> None:
        self.feed.close()
        self.spill_dir.cleanup()

    @property
    def caught_up(self) -> bool:
        return self.reassembler is not None and len(self.ends.ended) == len(self.next)

    def check_heard(self, silence: float) -> None:
        """A run that must end (``--once``) does not wait forever for a broker that went
        away before it read to the end; a following one waits for it to come back."""
        if not self.caught_up and time.monotonic() - self.heard > silence:
            waiting = ", ".join(self._name(p) for p in sorted(set(self.next) - self.ends.ended))
            raise BrokerError(f"Kafka sent nothing for {silence:g} s while {waiting} had more to read",
                              fix="check the broker and kafka.bootstrap_servers, then replay again")

    def steps(self) -> Iterator[None]:
        while True:
            messages, ended = self.feed.poll()
            if messages:
                self.heard = time.monotonic()
            for message in messages:
                self._receive(message)
            for partition in ended:
                self.ends.end_of_partition(partition)
            if self.reassembler is None and not self.window_end:
                self._open_reassembler()
            if self.reassembler is not None:
                self._hand_out()
            yield

    def _hand_out(self) -> None:
        """Apply what the order allows, and stop on a part proven missing. A record named
        lost may be of a transaction the target applied without the part waiting for it
        (its record read before a restart, or its place forgotten): the target is asked,
        and the part refused as late (:meth:`Reassembler.went_out_without`)."""
        assert self.reassembler is not None
        self.in_hand.extend(self.reassembler.ready())
        self._apply_ready()
        missing = self.reassembler.missing()
        if not missing:
            return
        first = missing[0]
        if (isinstance(self.reassembler, Reassembler) and first.record_never_came and first.gxid is not None
                and self.applier.applied_among({first.gxid})):
            raise self.reassembler.went_out_without(first.gxid)
        raise MissingPartError(first, self.topics, self.next[first.segment])

    def _receive(self, message: Delivery) -> None:
        partition, offset = message.partition, message.offset
        self.ends.message(partition, offset)
        if partition not in self.first_offsets_seen:
            self.first_offsets_seen.add(partition)
            if offset != self.next[partition]:
                raise StreamError(f"{self._name(partition)} starts at offset {offset}, not at offset {self.next[partition]} where this "
                                  "replay resumes: events were deleted (retention) or the topic was recreated",
                                  fix="bootstrap the pipeline again and replay into a fresh target")
        self.next[partition] = offset + 1
        malformed: str | None = None
        try:
            value = orjson.loads(message.value or b"")
        except orjson.JSONDecodeError as e:
            value, malformed = None, f"not JSON ({e})"
        if partition in self.unmarked:
            if not is_pipeline_marker(value, self.identity or None):
                owner = value.get("pipeline") if is_pipeline_marker(value) else None
                raise StreamError(
                    f"{self._name(partition)} does not begin with this pipeline's marker ("
                    + (f"it holds bootstrap {owner}'s events, not {self.identity}'s" if owner else
                       "its history is lost, or another writer's events are in it") + ")",
                    fix="bootstrap the pipeline again and replay into a fresh target")
            self.unmarked.discard(partition)  # framed too: a numbered partition's marker starts its count
        try:
            framed = self.framer.feed(partition, offset, value) if malformed is None else None
        except MalformedMessageError as e:
            malformed = e.reason
        if malformed is not None:
            self._set_aside(message, malformed)
            return
        if framed is not None:
            if self.reassembler is not None:
                self._add(framed)
            else:
                self.window.append(framed)
        if partition in self.window_end and offset + 1 >= self.window_end[partition]:
            del self.window_end[partition]  # the window of this partition is read

    def check_marked(self) -> None:
        """Once read to the end: a partition read from its beginning that held nothing
        at all lost its history (capture writes the marker before anything else)."""
        if self.unmarked:
            names = ", ".join(self._name(p) for p in sorted(self.unmarked))
            raise StreamError(f"{names} hold no events, not even the pipeline's marker: capture has not started, "
                              "or the topics lost their history",
                              fix="start capture (`gpcdc capture start`); if it refuses to, bootstrap the pipeline "
                                  "again and replay into a fresh target")

    def check_reached(self) -> None:
        """A replay asked to stop at a sync point that read everything without it."""
        if self.until is not None and not self.reached:
            seen = ", ".join(map(str, self.syncpoints_read[-5:])) or "none"
            raise SyncPointNotReachedError(
                f"sync point {self.until} is not in the stream read (its sync points, the latest: {seen}); "
                "everything read was applied",
                fix="name a sync point the stream holds (`gpcdc replay --archive PATH --list-syncpoints`), or archive "
                    "again once it is in Kafka")

    def _name(self, partition: int) -> str:
        return self.topics.name(partition)

    def _open_reassembler(self) -> None:
        if self.settings.legacy_per_segment:
            # Applied in each partition's order, so the resume offsets alone are exact.
            self.reassembler = SegmentOrder(self.segments, clock_skew_ms=self.settings.clock_skew_ms,
                                            applied_lsn=self.applied_lsn)
        else:
            gxids = {f.gxid for f in self.window if isinstance(f, (Part, Record)) and f.gxid is not None}
            self.reassembler = Reassembler(self.segments, clock_skew_ms=self.settings.clock_skew_ms,
                                           applied=self.applier.applied_among(gxids) if gxids else set(),
                                           applied_lsn=self.applied_lsn, copies_applied=self.repaired)
        for framed in self.window:
            self._add(framed)
        self.window = []

    def _add(self, framed: Part | Record | Watermark) -> None:
        assert self.reassembler is not None
        if isinstance(framed, Part):
            self.reassembler.add_part(framed)
        elif isinstance(framed, Record):
            if framed.syncpoint and framed.gxid is not None:
                self.syncpoints_read.append(framed.gxid)
            self.reassembler.add_record(framed)
        elif framed.repaired is not None:
            self.reassembler.add_repair(framed.repaired)
        else:
            self.reassembler.add_watermark(framed.segment, framed.resolved_ts_ms, framed.prepared,
                                           framed.prepared_ts_ms, framed.parts, framed.lost, framed.offset,
                                           framed.resolved_lsn, at=framed.offset)

    @property
    def ready_to_apply(self) -> bool:
        return bool(self.in_hand) and bool(self._next_batch())

    def _apply_ready(self) -> None:
        while self.in_hand and not self.reached:
            batch = self._next_batch()
            if not batch:
                return  # the first waits for a repair's rows
            checkpoint = self._checkpoint(after=len(batch))
            began = time.monotonic()
            try:
                self.applier.apply(batch, checkpoint)
            except DdlRefusedError as refused:
                self._quarantine(refused)
                raise
            self.batches += 1
            self.batch_seconds += time.monotonic() - began
            self.applied_lsn = dict(checkpoint.applied_lsn)
            self.repaired = dict(checkpoint.repaired)
            for whole in batch:
                self.in_hand.popleft()
                for part in whole.parts:
                    if isinstance(part.payload, SqliteSpill):
                        part.payload.close()
            last = batch[-1]
            if last.record is not None and last.record.syncpoint and last.gxid is not None:
                self._pass_syncpoint(last.gxid)
                self.reached = last.gxid == self.until

    def _pass_syncpoint(self, gxid: int) -> None:
        """Everything before sync point ``gxid`` is applied, nothing after: wait while a
        validator holds its lock on the target (it reads the target here, then lets go)."""
        started = time.monotonic()
        with self.target.coordinator_connection() as conn:
            conn.execute("SELECT pg_advisory_lock_shared(%s, %s)", syncpoint_lock(self.topics.prefix, gxid))
        held_ms = (time.monotonic() - started) * 1000
        self.syncpoints.append((gxid, held_ms))
        log.info("passed sync point %d (held %.1f ms)", gxid, held_ms)

    def _set_aside(self, message: Delivery, reason: str) -> None:
        """A malformed message into the quarantine file, with where it is and (the first
        64 KiB of) what it holds; the topic keeps it whole at that offset."""
        value = message.value or b""
        topic = self.topics.dtx if message.partition == COORDINATOR else self.topics.changes
        partition = 0 if message.partition == COORDINATOR else message.partition
        log.warning("set aside the malformed message at offset %d of %s partition %d: %s (see %s)",
                    message.offset, topic, partition, reason, self.quarantine)
        self.set_aside += 1
        self.quarantine.parent.mkdir(parents=True, exist_ok=True)
        with self.quarantine.open("ab") as f:
            f.write(orjson.dumps({"topic": topic, "partition": partition, "offset": message.offset,
                                  "reason": reason, "bytes": len(value),
                                  "value_base64": base64.b64encode(value[:65536]).decode(),
                                  "quarantined_ms": int(time.time() * 1000)}) + b"\n")

    def _quarantine(self, refused: DdlRefusedError) -> None:
        """Keep the refused record where an operator finds it, one JSON line each."""
        self.quarantine.parent.mkdir(parents=True, exist_ok=True)
        with self.quarantine.open("ab") as f:
            f.write(orjson.dumps({"gxid": refused.gxid, "topic": self.topics.dtx, "offset": refused.offset,
                                  "statement": refused.statement, "reason": refused.reason,
                                  "refused_ms": int(time.time() * 1000)}) + b"\n")

    def _next_batch(self) -> list[Whole]:
        """The transactions in hand that go into the next target transaction; none while
        the first must wait. A transaction whose part on a repaired segment is in the
        repair's copy goes with the rows of that copy (``reconcile``, handed out after
        every such transaction): before it, the target would show it in part."""
        in_hand = list(self.in_hand)
        through = -1  # the batch goes at least this far
        for i, whole in enumerate(in_hand):
            closing = [next((j for j in range(i + 1, len(in_hand))
                             if (repair := in_hand[j].reconcile) is not None and repair.segment == s), None)
                       for s in whole.covered]
            if None in closing:
                in_hand = in_hand[:i]  # wait for the copied rows of every segment it is covered on
                break
            through = max([through, *(j for j in closing if j is not None)])
        batch: list[Whole] = []
        rows = 0
        for i, whole in enumerate(in_hand):
            if whole.record is not None and whole.record.ddl:
                return batch or [whole]  # DDL goes alone
            if whole.record is not None and whole.record.syncpoint:
                return [*batch, whole]  # a batch ends at a sync point, to stop there
            size = sum(len(p.payload or ()) for p in whole.parts)
            if i > through and batch and (len(batch) >= self.settings.batch_transactions
                                          or rows + size > self.settings.batch_rows):
                break
            batch.append(whole)
            rows += size
        return batch

    def _checkpoint(self, after: int) -> Checkpoint:
        """Where to resume once the first ``after`` transactions in hand are applied."""
        assert self.reassembler is not None
        unapplied = list(self.in_hand)[after:]
        resume = resume_point(self.next, self.reassembler, unapplied, self.framer.resume_offsets())
        applied_lsn, repaired = dict(self.applied_lsn), dict(self.repaired)
        for whole in list(self.in_hand)[:after]:
            if whole.reconcile is not None:
                repaired[whole.reconcile.segment] = whole.reconcile.number
                continue
            if self.settings.legacy_per_segment:
                lsns = [(p.segment, p.commit_lsn) for p in whole.parts]
                lsns += [(COORDINATOR, whole.record.commit_lsn)] if whole.record is not None else []
            elif whole.gxid is None:  # one-phase, without a gxid: applied in its segment's order
                lsns = [(p.segment, p.commit_lsn) for p in whole.parts]
            else:
                continue  # named by its gxid in the target's applied table
            for partition, lsn in lsns:
                applied_lsn[partition] = max(applied_lsn.get(partition, -1), lsn)
        return Checkpoint(resume, dict(self.next), dict(self.framer.last_lsn), applied_lsn, repaired)

    def progress(self) -> Progress:
        stats = self.applier.stats
        transactions, rows, ddl, empty = (now - then for now, then in zip(
            (stats.transactions, stats.rows, stats.ddl, stats.empty), self.stats_at_start))
        pending = (self.reassembler.pending if self.reassembler is not None else 0) + len(self.in_hand)
        waiting = [commit_ts_ms(w) for w in self.in_hand if w.reconcile is None]
        if self.reassembler is not None and (oldest := self.reassembler.oldest_waiting_ts_ms()) is not None:
            waiting.append(oldest)
        lag = max(0, int(time.time() * 1000) - min(waiting)) if waiting else 0
        return Progress(transactions, rows, ddl, pending, lag, time.monotonic() - self.started, self.caught_up,
                        self.set_aside, self.batches, self.batch_seconds, empty)
