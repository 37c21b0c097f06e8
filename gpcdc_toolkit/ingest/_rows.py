"""Protocol messages as flat, typed rows (pure): the schema of the Spark source.

One schema covers every kind of message, so that a topic (which mixes row events,
transaction boundaries and watermarks) reads as one DataFrame; the columns that do
not apply to a kind are null. A value that is not a protocol message keeps its raw
text in ``_corrupt_record``, as Spark's own file sources do, with its partition and
offset, and nulls elsewhere.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from ..protocol import kind_of, problem_of

try:
    from ._rowevent import row as _row_event
except ImportError:  # built without a C compiler: every message takes the general path
    _row_event = None  # type: ignore[assignment]

# (name, Spark SQL type). Stable: columns are only ever added at the end.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),  # the Kafka message's timestamp
    ("kind", "string"),  # row, begin, end, resolved, commit, ddl, pipeline, lost, repaired; null when corrupt
    ("segment", "int"),  # -1: the coordinator
    ("gxid", "bigint"),  # repaired: the cut's xmax
    ("xid", "bigint"),
    ("commit_lsn", "bigint"),
    ("commit_ts", "timestamp"),
    ("op", "string"),  # c, u, d, t
    ("table_schema", "string"),
    ("table_name", "string"),
    ("seq", "int"),
    ("one_phase", "boolean"),
    ("key", "string"),  # the row's key, as JSON
    ("before", "map<string,string>"),
    ("after", "map<string,string>"),
    ("event_count", "int"),
    ("end_lsn", "bigint"),
    ("segments", "array<int>"),
    ("statement", "string"),
    ("resolved_lsn", "bigint"),
    ("resolved_ts", "timestamp"),
    ("_corrupt_record", "string"),
    ("unchanged", "array<string>"),  # columns an update left out of "after" (TOASTed, not in the WAL)
    ("prepared", "array<bigint>"),  # watermarks: gxids the node held prepared at prepared_ts; repaired: running at the cut
    ("prepared_ts", "timestamp"),
    ("ddl_count", "int"),  # commit records: DDL records of the transaction before it
    # Numbered streams: a part's number (BEGIN, END), or the number of the node's last
    # part before it (watermarks, the pipeline marker).
    ("number", "bigint"),
)
SCHEMA_DDL = ", ".join(f"`{name}` {kind}" for name, kind in COLUMNS)
WIDTH = len(COLUMNS)
CORRUPT = [name for name, _ in COLUMNS].index("_corrupt_record")

TIMESTAMPS = frozenset(i for i, (_, kind) in enumerate(COLUMNS) if kind == "timestamp")


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return orjson.dumps(value).decode()


def _image(image: dict[str, Any] | None) -> dict[str, str | None] | None:
    return None if image is None else {k: _text(v) for k, v in image.items()}


def to_row(topic: str, partition: int, offset: int, timestamp_ms: int | None,
           key: bytes | None, value: bytes | None) -> tuple[Any, ...]:
    """One Kafka message as a tuple in :data:`COLUMNS` order (timestamps in epoch ms)."""
    head = (topic, partition, offset, timestamp_ms)
    try:
        decoded = orjson.loads(value) if value is not None else None
        # A row event of the usual form, the bulk of a stream, in compiled code; any
        # other message, or one it does not judge the same, on the general path below.
        if _row_event is not None and (row := _row_event(*head, key, decoded)) is not None:
            return row
        problem = problem_of(decoded)
        if problem is not None or not isinstance(decoded, dict):
            raise ValueError(problem)
        v = decoded
        kind = kind_of(v)
        if kind == "row":
            s = v["source"]
            return head + ("row", s["segment"], s["gxid"], s["txId"], s["commit_lsn"], s["ts_ms"], v["op"],
                           s["schema"], s["table"], s["seq"], s["one_phase"],
                           key.decode() if key is not None else None, _image(v["before"]), _image(v["after"]),
                           None, None, None, None, None, None, None, v.get("unchanged"), None, None, None, None)
        if kind in ("begin", "end"):
            return head + (kind, v["segment"], v["gxid"], v["xid"], v["commit_lsn"],
                           v["commit_ts_ms"], None, None, None, None, v.get("one_phase"), None, None, None,
                           v["event_count"], v.get("end_lsn"), None, None, None, None, None, None, None, None, None,
                           v.get("number"))
        if kind == "resolved":
            return head + ("resolved", v["segment"], None, None, None, None, None, None, None, None, None, None,
                           None, None, None, None, None, None, v["resolved"], v.get("resolved_ts_ms"), None, None,
                           v.get("prepared"), v.get("prepared_ts_ms"), None, v.get("parts"))
        if kind == "pipeline":  # the first message of each partition: which bootstrap wrote it
            return head + ("pipeline", v["segment"]) + (None,) * (WIDTH - 7) + (v.get("parts"),)
        if kind == "lost":  # the last message of a node's partition: its capture stopped for good
            return head + ("lost", v["segment"]) + (None,) * (WIDTH - 6)
        if kind == "repaired":  # captured again from a new slot: the cut's snapshot (xmax, the gxids then running)
            return head + ("repaired", v["segment"], v["xmax"], None, v["coordinator_lsn"]) + (None,) * 17 + (
                v["in_progress"], None, None, v["number"])
        if kind in ("commit", "ddl"):
            return head + (kind, v["segment"], v["gxid"], v["xid"], v["commit_lsn"], v["commit_ts_ms"],
                           None, None, None, None, None, None, None, None, None, None,
                           v.get("segments"), v.get("statement"), None, None, None, None, None, None,
                           v.get("ddl_count"), None)
        raise ValueError(f"not a protocol message: {str(v)[:80]}")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # a hostile message is a corrupt one
        raw = value.decode("utf-8", errors="replace") if value is not None else None
        return head + (None,) * (CORRUPT - len(head)) + (raw,) + (None,) * (WIDTH - CORRUPT - 1)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while a batch is parsed. Parsing makes
    no reference cycles, only many containers (each message's dicts, each row's tuple)
    that live until the batch is built: the collector would scan them again and again
    and free nothing. Reference counting frees them as before."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def arrow_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "boolean": pa.bool_(),
             "timestamp": pa.timestamp("us", tz="UTC"), "map<string,string>": pa.map_(pa.string(), pa.string()),
             "array<int>": pa.list_(pa.int32()), "array<string>": pa.list_(pa.string()),
             "array<bigint>": pa.list_(pa.int64())}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS])


def to_arrow(rows: Sequence[tuple[Any, ...]], schema: Any) -> Any:
    """Rows from :func:`to_row` as one Arrow record batch of ``schema``."""
    import pyarrow as pa

    n = len(rows)
    columns = list(zip(*rows)) if rows else [()] * WIDTH
    arrays = []
    for i, (values, field) in enumerate(zip(columns, schema)):
        if values.count(None) == n:
            arrays.append(pa.nulls(n, field.type))
        elif i in TIMESTAMPS:
            millis = pa.array(values, type=pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
            arrays.append(millis.cast(field.type))
        elif isinstance(field.type, pa.MapType):
            arrays.append(_map_array(values, field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _map_array(values: Sequence[dict[str, str | None] | None], map_type: Any) -> Any:
    import pyarrow as pa

    offsets = [0]
    missing = []
    keys: list[str] = []
    items: list[str | None] = []
    for image in values:
        missing.append(image is None)
        if image is not None:
            keys.extend(image)
            items.extend(image.values())
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(pa.array(offsets, type=pa.int32()), pa.array(keys, type=pa.string()),
                                   pa.array(items, type=pa.string()), type=map_type, mask=pa.array(missing))
