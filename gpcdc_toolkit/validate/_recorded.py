"""Sync points' records: the source's per-table digests as of each cut, kept with the
pipeline (``capture/<prefix>/syncpoints/<gxid>.json``, copied into its archive by
``gpcdc archive``), so that a target rebuilt as of a sync point is proven equal to the
source as it was then, long after the source moved on.

A table's digest is the validation's whole-table digest (``_checksum``): its row
count and the sum of its rows' 64-bit hashes, computed by each segment inside its
snapshot of the cut. It proves equality, or says that a table differs; which rows
differ needs the source as it was, which only the stream holds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._runtime import read_json, write_json
from ..archive import ArchiveError
from ..bootstrap import Pipeline
from ..cluster import Cluster, Table
from ..config import Config
from ..connect import open_cluster
from ..errors import GpcdcError
from ._checksum import RECORD_32, whole_digest
from ._chunks import Digest
from ._snapshots import Snapshots
from ._syncpoint import SyncPoint

RECORD_HASH = 140000  # servers from this version hash rows by their columns' types (``_row_hash``)
# Records keep to the hashes every PostgreSQL computes, not the sandbox's own
# (``gp_dist.row_hash``): a target rebuilt elsewhere must be able to compute them.
# A record names its row hash: the ``_row_hash`` form -> its name in the record's file.
# "record" in a file is the form of the records of before 2026-11-28 (``RECORD_32``).
_HASH_NAMES = {"record": "record-2", RECORD_32: "record", "text": "text"}


@dataclass(frozen=True)
class TableDigest:
    table: str  # as SQL names it
    parts: tuple[str, str]  # (schema, name) as the catalog has them
    columns: tuple[str, ...]
    types: tuple[str, ...]
    primary_key: tuple[str, ...]
    rows: int
    checksum: int  # the sum of the rows' hashes, modulo 2**64


@dataclass(frozen=True)
class SyncPointRecord:
    gxid: int
    taken_at: str
    row_hash: str  # how rows were hashed: "record" or "text" (or RECORD_32), as ``_row_hash`` names it
    tables: tuple[TableDigest, ...]

    def to_json(self) -> dict[str, Any]:
        return {"syncpoint": self.gxid, "taken_at": self.taken_at, "hash": _HASH_NAMES[self.row_hash],
                "tables": [{"table": t.table, "parts": list(t.parts), "columns": list(t.columns),
                            "types": list(t.types), "primary_key": list(t.primary_key), "rows": t.rows,
                            "checksum": str(t.checksum)} for t in self.tables]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SyncPointRecord:
        forms = {name: form for form, name in _HASH_NAMES.items()}
        if data["hash"] not in forms:
            raise GpcdcError(f"sync point {data['syncpoint']}'s record hashes rows by {data['hash']!r}, which this "
                             f"version does not know (it knows {', '.join(forms)})",
                             fix="check it with the version of the toolkit that recorded it")
        return cls(int(data["syncpoint"]), data["taken_at"], forms[data["hash"]], tuple(
            TableDigest(t["table"], tuple(t["parts"]), tuple(t["columns"]), tuple(t["types"]),
                        tuple(t["primary_key"]), int(t["rows"]), int(t["checksum"])) for t in data["tables"]))


def record_syncpoint(point: SyncPoint, tables: Sequence[Table], directory: Path) -> SyncPointRecord:
    """Digest ``tables`` as of the sync point's cut and keep the record in ``directory``."""
    row_hash = "record" if point.source.server_version >= RECORD_HASH else "text"
    digests = []
    for info in tables:
        digest = whole_digest(point.source, info, row_hash)
        digests.append(TableDigest(info.name, info.parts, info.columns, info.types, info.primary_key, digest.rows,
                                   digest.checksum))
    record = SyncPointRecord(point.gxid, point.taken_at, row_hash, tuple(digests))
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / f"{point.gxid}.json", record.to_json())
    return record


def load_record(config: Config, gxid: int, archive: Path | None = None) -> SyncPointRecord:
    """Sync point ``gxid``'s record, from ``archive`` or else the work directory."""
    if archive is not None and not archive.is_dir():
        raise ArchiveError(f"archive {archive} does not exist", fix="give the directory `gpcdc archive --to` wrote")
    tried = [Pipeline(archive, config.kafka.topic_prefix)] if archive is not None else []
    tried.append(Pipeline(config.work_dir, config.kafka.topic_prefix))
    for pipeline in tried:
        path = pipeline.syncpoints_dir / f"{gxid}.json"
        if path.is_file():
            return SyncPointRecord.from_json(read_json(path))
    where = " or ".join(str(p.syncpoints_dir) for p in tried)
    raise GpcdcError(f"sync point {gxid} has no record in {where}",
                     fix="give the archive that holds it (--archive PATH); sync points are recorded by "
                         "`gpcdc syncpoint` and `gpcdc validate` when they take them")


@dataclass(frozen=True)
class RecordedResult:
    table: str
    source_rows: int
    target_rows: int | None  # None: the target has no such table
    equal: bool
    problem: str = ""  # what differs

    def line(self) -> str:
        if self.equal:
            return f"{self.table}: {self.source_rows} rows, equal to the source at the sync point"
        return f"{self.table}: {self.problem}"


def compare_record(record: SyncPointRecord, target: Cluster | Snapshots) -> list[RecordedResult]:
    """Each recorded table against the target as it is now."""
    # A caller's Snapshots are used as they are, and left open.
    with Snapshots(target) if isinstance(target, Cluster) else contextlib.nullcontext(target) as side:
        if record.row_hash != "text" and side.server_version < RECORD_HASH:
            raise GpcdcError(f"sync point {record.gxid} was digested by a server of version 14 or later, which "
                             f"hashes rows by their columns' types; the target's oldest segment is "
                             f"{side.server_version}", fix="rebuild into a PostgreSQL 14 or later target")
        return [_compare(t, side, record.row_hash) for t in record.tables]


def _compare(recorded: TableDigest, side: Snapshots, row_hash: str) -> RecordedResult:
    try:
        info = side.cluster.table(recorded.parts)
    except GpcdcError:
        return RecordedResult(recorded.table, recorded.rows, None, False, "the target has no such table")
    shape = (recorded.columns, recorded.types, recorded.primary_key)
    if (info.columns, info.types, info.primary_key) != shape:
        return RecordedResult(recorded.table, recorded.rows, None, False,
                              f"columns {list(zip(info.columns, info.types))} with primary key "
                              f"{list(info.primary_key)} on the target, "
                              f"{list(zip(recorded.columns, recorded.types))} with primary key "
                              f"{list(recorded.primary_key)} at the sync point")
    digest = whole_digest(side, info, row_hash)
    if digest == Digest(recorded.rows, recorded.checksum):
        return RecordedResult(recorded.table, recorded.rows, digest.rows, True)
    what = (f"{digest.rows} rows where the source had {recorded.rows}" if digest.rows != recorded.rows
            else f"{digest.rows} rows as on the source, but their checksum differs (rows changed)")
    return RecordedResult(recorded.table, recorded.rows, digest.rows, False, what)


@dataclass(frozen=True)
class SyncPointCheck:
    """The target against a sync point's record (``gpcdc validate --against-syncpoint``)."""

    record: SyncPointRecord
    results: tuple[RecordedResult, ...]
    seconds: float
    output: Path

    @property
    def verified(self) -> bool:
        return all(r.equal for r in self.results)

    def lines(self) -> list[str]:
        out = [f"{len(self.results)} tables compared with sync point {self.record.gxid} (taken {self.record.taken_at}) "
               f"as its record has them, in {self.seconds:.1f} s"]
        out += [r.line() for r in self.results]
        differ = sum(not r.equal for r in self.results)
        out.append(f"target equals the source as of sync point {self.record.gxid}" if not differ else
                   f"{differ} tables differ from the source as of sync point {self.record.gxid}")
        return out


def check_against_syncpoint(config: Config, gxid: int, *, archive: Path | None = None,
                            target: Cluster | None = None) -> SyncPointCheck:
    """Compare the target as it is now with sync point ``gxid``'s record; the results
    in ``<work_dir>/validate/<prefix>/syncpoint-checks/<UTC time>/``."""
    record = load_record(config, gxid, archive)
    started = time.monotonic()
    results = tuple(compare_record(record, target or open_cluster(config, "target")))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    output = Path(config.work_dir) / "validate" / config.kafka.topic_prefix / "syncpoint-checks" / stamp
    check = SyncPointCheck(record, results, time.monotonic() - started, output)
    output.mkdir(parents=True)
    rows = [{"table": r.table, "equal": r.equal, "source_rows": r.source_rows, "target_rows": r.target_rows,
             "problem": r.problem} for r in results]
    (output / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    write_json(output / "summary.json", {"verified": check.verified, "syncpoint": gxid, "taken_at": record.taken_at,
                                         "seconds": round(check.seconds, 3), "tables": len(rows),
                                         "differing": [r["table"] for r in rows if not r["equal"]]})
    return check
