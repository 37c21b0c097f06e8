"""Spark reads planned in the calling process: one task per item."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

Item = TypeVar("Item")


def read_in_tasks(spark: Any, items: Sequence[Item], read: Callable[[Item], Iterator[Any]], schema: str) -> Any:
    """A DataFrame of what ``read`` yields (Arrow record batches of ``schema``) for each
    item, one Spark task per item. The items travel with the tasks' function, so Spark
    starts no Python worker to plan the read, as it does for a Python data source."""

    def read_each(ids: Iterator[Any]) -> Iterator[Any]:
        for batch in ids:
            for i in batch.column(0).to_pylist():
                yield from read(items[i])

    return spark.range(0, len(items), 1, max(len(items), 1)).mapInArrow(read_each, schema)
