"""Which slot positions Kafka's delivery reports prove may be acknowledged, without
waiting for Kafka.

A worker must not move its slot past a transaction before Kafka has every event of it.
Waiting for that (``flush()``) stops the worker reading: every event decoded meanwhile
waits with it, and a slow answer from Kafka shows as a stall of the whole stream. So
the worker goes on producing and acknowledges later what Kafka has confirmed by then.

Only the events that close something (a transaction's END, a watermark, a marker; every
event but a row's) ask for a delivery report: one for each of the million rows of a
load would add a third to producing them (``bench/bench_delivery_reports.py``). A row
is proven by the report of a later event of its partition, which the worker always
produces (a transaction's END goes to every partition its rows may be in): the
idempotent producer writes a partition's events in order, and an event that fails once
it has its place in the partition's series stops the producer for good instead of
leaving a gap (``enable.gapless.guarantee``), so no later event of the partition is
confirmed after it. An event refused before it has that place (its topic gone while
it waited for the topic's metadata) is not covered; its transaction then holds fewer
rows than its END counts, which the replayer refuses and the audit reports.

Pure bookkeeping: the worker calls ``sent`` for each reported event it produces,
gives ``on_delivery`` to the producer as that event's callback, records a
``checkpoint`` (the position acknowledging everything produced so far would allow)
every ``ack_interval``, and acknowledges what ``confirmed`` returns. Delivery reports do
not wake the worker's wait on its slot; ``look_again_in`` says when to look for them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

# While a checkpoint awaits its confirmations, the worker looks for delivery reports
# soon (a broker that answers does so within milliseconds), then less often the longer
# it has waited: sixty workers looking every 5 ms for the answers of a slow broker take
# the CPU it needs to answer. Looking again after an eighth of the wait so far adds at
# most an eighth to when the slot learns of the confirmation.
FIRST_LOOK = 0.005
LONGEST_LOOK = 0.25

_Partition = tuple[str, int]  # (topic, partition)


class Confirmations:
    def __init__(self) -> None:
        self._sent: dict[_Partition, int] = {}  # reported events produced to each partition
        self._confirmed: dict[_Partition, int] = {}  # of those, confirmed by Kafka (in order)
        self.offsets: dict[_Partition, int] = {}  # the offset of the last of them in each partition
        # (partition, offset before, offset now) of a confirmation at or before one
        # confirmed earlier: the partition lost what Kafka had confirmed
        self.went_back: tuple[_Partition, int, int] | None = None
        # (position, when, reported events sent to each partition by then), oldest first
        self._checkpoints: deque[tuple[int, float, dict[_Partition, int]]] = deque()
        self._last: tuple[int, dict[_Partition, int]] | None = None  # the last checkpoint's position and counts
        self._returned = -1  # the last position ``confirmed`` returned
        self.error: Any = None  # the first delivery error reported (a KafkaError)

    def sent(self, topic: str, partition: int) -> None:
        """A reported event was produced to ``partition`` of ``topic`` (a partition
        number: the client's partitioner must not choose it, or its report would count
        elsewhere)."""
        key = (topic, partition)
        self._sent[key] = self._sent.get(key, 0) + 1

    def on_delivery(self, err: Any, msg: Any) -> None:
        """The producer's callback for a reported event."""
        if err is not None:
            if self.error is None:
                self.error = err
            return
        key = (msg.topic(), msg.partition())
        self._confirmed[key] = self._confirmed.get(key, 0) + 1
        before, offset = self.offsets.get(key, -1), msg.offset()
        if offset <= before and self.went_back is None:
            self.went_back = (key, before, offset)
        self.offsets[key] = max(before, offset)

    def checkpoint(self, position: int, now: float) -> None:
        """Everything produced so far is what acknowledging ``position`` rests on (never
        less than a position checkpointed before)."""
        sent = dict(self._sent)
        if self._last is not None:
            if position <= self._last[0] and sent == self._last[1]:
                return  # nothing new since the last one
            position = max(position, self._last[0])
        self._last = (position, sent)
        self._checkpoints.append((position, now, sent))

    def confirmed(self) -> int | None:
        """The furthest checkpointed position whose events Kafka has all confirmed, once
        (None: none newly). Counts only grow, so the checkpoints confirmed are the oldest."""
        position = None
        while self._checkpoints and self._covered(self._checkpoints[0][2]):
            position = self._checkpoints.popleft()[0]
        if position is None or position <= self._returned:
            return None  # a checkpoint that only waited for more events at a position already returned
        self._returned = position
        return position

    def waiting_since(self) -> float | None:
        """When the oldest checkpoint not yet confirmed was recorded."""
        return self._checkpoints[0][1] if self._checkpoints else None

    def look_again_in(self, now: float) -> float | None:
        """Seconds until delivery reports are worth looking for again (None: no checkpoint
        awaits any)."""
        since = self.waiting_since()
        if since is None:
            return None
        return min(LONGEST_LOOK, max(FIRST_LOOK, (now - since) / 8))

    def unconfirmed(self) -> int:
        """Reported events produced and not yet confirmed."""
        return sum(self._sent.values()) - sum(self._confirmed.values())

    def _covered(self, sent: dict[_Partition, int]) -> bool:
        confirmed = self._confirmed
        return all(confirmed.get(partition, 0) >= count for partition, count in sent.items())
