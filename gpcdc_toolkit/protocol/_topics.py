"""Topics and how events are spread over their partitions (pure).

``<prefix>.changes`` carries the segments' events; ``<prefix>.dtx`` (one partition)
carries the coordinator's distributed commit records, DDL records and watermarks.

Dispatchers of the changes topic, and what each guarantees:

* ``segment`` (default): partition = segment. A partition holds one segment's
  committed local transactions in that segment's commit order, each framed by BEGIN
  and END, and that segment's watermarks. Everything of one key is in one
  partition (a key lives on one segment), except across a distribution-key update,
  which moves the row to another segment within one distributed transaction.
* ``key``: row events are partitioned by their key (the Kafka client's murmur2
  partitioner, as Java clients do), so consumers can scale past the segment count.
  The events of one key are in order; a transaction's rows spread over partitions.
  BEGIN, END and watermarks go to every partition, so that each partition tells on
  its own when a transaction's rows and a watermark's position are complete.
"""

from __future__ import annotations

from dataclasses import dataclass

DISPATCHERS = ("segment", "key")


@dataclass(frozen=True)
class Topics:
    prefix: str

    @property
    def changes(self) -> str:
        return f"{self.prefix}.changes"

    @property
    def dtx(self) -> str:
        return f"{self.prefix}.dtx"

    def name(self, partition: int) -> str:
        """A partition as messages name it: of the changes topic, or (-1) the coordinator's topic."""
        return self.dtx if partition < 0 else f"{self.changes} partition {partition}"


@dataclass(frozen=True)
class Dispatcher:
    kind: str
    partitions: int  # of the changes topic

    def __post_init__(self) -> None:
        if self.kind not in DISPATCHERS:
            raise ValueError(f"unknown dispatcher {self.kind!r}: use one of {', '.join(DISPATCHERS)}")

    def partitions_for(self, kind: str, segment: int) -> list[int] | None:
        """Partitions of a segment's event; None: let the client partition by key."""
        if self.kind == "segment":
            return [segment % self.partitions]
        if kind == "row":
            return None
        return list(range(self.partitions))
