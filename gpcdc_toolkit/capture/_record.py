"""Where a node's capture keeps the offset of the last event of its partition that
Kafka confirmed, for a later session to tell a tail Kafka lost after confirming it
(``CaptureWorker._check_tail``).

In two places, each surviving what the other may not:

- a file of the work directory (``CaptureGroup.confirmed_file``), written as soon as
  the disk allows (``StateWriter``): exact, but only on the host whose worker wrote it;
- Kafka, as the committed offset of the node's own consumer group (:func:`group_of`),
  with the pipeline and the node's repair number as its metadata: any host reads it,
  and it outlives the partition's tail wherever Kafka keeps its groups' offsets apart
  from that partition (another broker leads them, or they were written to disk). It is
  committed at most every ``COMMIT_INTERVAL`` seconds while the worker streams, and
  once more when it stops, so after a crash it may lag by that much.

A session trusts the highest offset either holds for the same pipeline and repair
number (a repaired slot starts afresh), or this process recorded. Each holds an offset
Kafka confirmed, or an earlier one; the session reads them before the partition's end,
so that a worker of the node still streaming on another host is not taken for a loss.
Kafka is asked through an admin client, whose requests end within their timeout: a
consumer would wait out its session at close for a commit to a broker that is gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from .._runtime import StateWriter, read_json
from ..errors import BrokerError

log = logging.getLogger(__name__)

COMMIT_INTERVAL = 1.0  # seconds between two commits of the record to Kafka while streaming
_LAST_COMMIT_WAIT = 5.0  # seconds a stopping worker waits for Kafka to take its last commits
_COORDINATOR_WAIT = 30.0  # seconds a session waits for Kafka's groups' coordinator
_ANSWER_WAIT = 10.0  # seconds a session waits for Kafka to say what a group committed


def group_of(prefix: str, content: int) -> str:
    """The consumer group whose committed offset is the record of node ``content``'s
    capture; it never consumes."""
    return f"{groups_of(prefix)}{content}"


def groups_of(prefix: str) -> str:
    """What the names of the pipeline's record groups begin with."""
    return f"gpcdc.{prefix}.capture.node"


class ConfirmedRecord:
    """The record of one node's capture, for the pipeline ``identity`` and the node's
    slot made by repair number ``repair`` (0: the bootstrap's)."""

    def __init__(self, file: Path | None, kafka: Mapping[str, Any], group: str, *, identity: str,
                 repair: int) -> None:
        self.file = file
        self.group = group
        self._kafka = dict(kafka)
        self._owner = {"pipeline": identity, "repair": repair}
        self._highest = -1  # recorded by this process (a write or a commit may not be done)
        self._position: tuple[str, int] | None = None  # the partition recorded
        self._asked = -1  # the highest offset whose commit Kafka was asked for
        self._last_commit = 0.0
        self._answers: list[tuple[int, Future[Any]]] = []  # commits not answered yet: (offset, answer)
        self._writer: StateWriter | None = None
        self._admin: Any = None  # an AdminClient: its requests end within their timeout, whatever the broker does

    def open(self) -> None:
        self._writer = StateWriter(self.file) if self.file is not None else None

    def __enter__(self) -> ConfirmedRecord:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Write what is left, and commit it to Kafka, waiting a few seconds at most."""
        try:
            if self._position is not None and self._highest > self._asked:
                self._commit(*self._position, self._highest)
            deadline = time.monotonic() + _LAST_COMMIT_WAIT
            for _offset, answer in self._answers:
                with contextlib.suppress(KafkaException, TimeoutError):
                    answer.result(max(0.0, deadline - time.monotonic()))
            self._answered()
        finally:
            self._admin = None
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def record(self, topic: str, partition: int, offset: int) -> None:
        """Kafka confirmed the event at ``offset`` of the node's partition: written to the
        file now (in the writer's thread), committed to Kafka at most every
        ``COMMIT_INTERVAL`` seconds."""
        if offset <= self._highest:
            return
        self._highest, self._position = offset, (topic, partition)
        if self._writer is not None:
            self._writer.write({**self._owner, "topic": topic, "partition": partition, "offset": offset})
        self._answered()
        now = time.monotonic()
        if now - self._last_commit >= COMMIT_INTERVAL and not self._answers:
            self._last_commit = now
            self._commit(topic, partition, offset)

    def highest(self, topic: str, partition: int) -> int | None:
        """The highest offset recorded for the partition, by the file, by Kafka or by this
        process (None: none)."""
        found = [self._highest] if self._highest >= 0 and self._position == (topic, partition) else []
        try:
            kept = read_json(self.file) if self.file is not None else {}
        except (OSError, ValueError):
            kept = {}  # none yet, or unreadable: nothing to compare with
        if self._owns(kept) and (kept.get("topic"), kept.get("partition")) == (topic, partition) \
                and isinstance(kept.get("offset"), int):
            found.append(int(kept["offset"]))
        committed = self._committed_offset(topic, partition)
        if committed.offset > 0 and self._owns(_metadata(committed.metadata)):
            found.append(committed.offset - 1)  # a group commits the next offset to read
        return max(found, default=None)

    def _committed_offset(self, topic: str, partition: int) -> Any:
        """What the group committed for the partition (a TopicPartition), asked again
        while Kafka says to (its groups' coordinator is being chosen or is loading)."""
        deadline = time.monotonic() + _COORDINATOR_WAIT
        while True:
            try:
                [answer] = self._client().list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(self.group, [TopicPartition(topic, partition)])],
                    request_timeout=_ANSWER_WAIT).values()
                [committed] = answer.result().topic_partitions
                if committed.error is not None:
                    raise KafkaException(committed.error)
                return committed
            except KafkaException as e:
                if not e.args[0].retriable() or time.monotonic() > deadline:
                    raise BrokerError(f"Kafka did not say what {self.group} committed: {e.args[0].str()}",
                                      fix="check the broker and kafka.bootstrap_servers") from None
            time.sleep(0.2)  # Kafka gives no event for a coordinator ready: asked again

    def _owns(self, kept: Mapping[str, Any]) -> bool:
        return kept.get("pipeline") == self._owner["pipeline"] and kept.get("repair") == self._owner["repair"]

    def _commit(self, topic: str, partition: int, offset: int) -> None:
        [answer] = self._client().alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(self.group, [TopicPartition(topic, partition, offset + 1,
                                                                      metadata=json.dumps(self._owner))])],
            request_timeout=_ANSWER_WAIT).values()
        self._asked = offset
        self._answers.append((offset, answer))

    def _answered(self) -> None:
        """Take the answers Kafka gave: a commit refused for now is asked for again (by the
        next record, or when the worker stops); the file still holds what it records."""
        waiting = []
        for offset, answer in self._answers:
            if not answer.done():
                waiting.append((offset, answer))
            elif (error := answer.exception()) is not None:
                failure = error.args[0] if isinstance(error, KafkaException) else None
                if failure is not None and failure.retriable():
                    self._asked = min(self._asked, offset - 1)
                else:
                    log.warning("%s: Kafka did not take a commit of the confirmed offset: %s", self.group, error)
        self._answers = waiting

    def _client(self) -> Any:
        if self._admin is None:
            self._admin = AdminClient(self._kafka)
        return self._admin


def _metadata(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
