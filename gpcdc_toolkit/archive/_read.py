"""Reading an archive: into Spark for audits, or message by message for a replay."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import orjson

from .._runtime import read_json
from ..ingest._rows import SCHEMA_DDL
from ..protocol import COORDINATOR, Topics, numbering_of
from ._layout import POSITION, START, VALUE, ArchiveError, RunBounds, check_continuous, run_number


def runs_of(path: Path) -> list[Path]:
    """The run directories, by number."""
    found = [(n, p) for p in path.glob("run-*") if p.is_dir() and (n := run_number(p)) is not None]
    return [p for _, p in sorted(found)]


def _offsets(file: Path) -> dict[str, dict[int, int]]:
    return {topic: {int(p): o for p, o in parts.items()} for topic, parts in read_json(file).items()}


def bounds_of(path: Path) -> list[RunBounds]:
    out = []
    for run in runs_of(path):
        start = run / START
        out.append(RunBounds(run_number(run) or 0, _offsets(start) if start.is_file() else None,
                             _offsets(run / POSITION)))
    return out


def archive_runs(path: Path) -> list[Path]:
    """An archive's runs, in order; a directory with none (or no directory) is refused."""
    runs = runs_of(path) if path.is_dir() else []
    if not runs:
        raise ArchiveError(f"{path} holds no archive runs", fix="write one with `gpcdc archive --to PATH` first")
    return runs


def read_archive(spark: Any, path: Path) -> Any:
    """Every message of an archive, in the ingest schema."""
    return spark.read.schema(SCHEMA_DDL).parquet(*(str(run) for run in archive_runs(path)))


Message = tuple[int, int, bytes | None]  # (partition, COORDINATOR for the coordinator's topic; offset; value)


class ArchivedStream:
    """An archive's messages of one pipeline, as a replay reads them: checked whole
    (its runs chain, each holds the messages' bytes) before anything is read."""

    def __init__(self, path: Path, topics: Topics) -> None:
        self.path, self.topics = path, topics
        if not path.is_dir():
            raise ArchiveError(f"archive {path} does not exist", fix="give the directory `gpcdc archive --to` wrote")
        bounds = bounds_of(path)
        check_continuous(str(path), bounds)
        self.runs = runs_of(path)
        ends = bounds[-1].end
        if set(ends) != {topics.changes, topics.dtx}:
            raise ArchiveError(f"archive {path} holds topics {sorted(ends)}, not pipeline {topics.prefix!r}'s",
                               fix="give the archive of this pipeline (kafka.topic_prefix)")
        self.segments = sorted(ends[topics.changes])
        self.ends = {**ends[topics.changes], COORDINATOR: ends[topics.dtx].get(0, 0)}
        for run in self.runs:
            for file in self._files(run):
                if VALUE not in _schema_names(file):
                    raise ArchiveError(f"archive {path} {run.name} does not hold the messages' bytes (written by an "
                                       "earlier version, for audits only)",
                                       fix="write a new archive with `gpcdc archive --to NEWPATH` to replay from it")

    @staticmethod
    def _files(run: Path) -> list[Path]:
        return sorted(run.glob("*.parquet"))

    def messages(self, start: dict[int, int], batch: int = 2000) -> Generator[list[Message], None, None]:
        """Every message from ``start`` (partition -> offset), in the order the archive
        holds them (each partition's in offset order), ``batch`` at a time."""
        import pyarrow.parquet as pq

        last: dict[int, int] = {}  # each partition's offset met last
        for run in self.runs:
            for file in self._files(run):
                for record in pq.ParquetFile(file).iter_batches(batch, columns=["topic", "partition", "offset", VALUE]):
                    columns = record.to_pydict()
                    out = []
                    for topic, p, offset, value in zip(columns["topic"], columns["partition"], columns["offset"],
                                                       columns[VALUE]):
                        partition = COORDINATOR if topic == self.topics.dtx else p
                        if offset < start.get(partition, 0):
                            continue
                        if partition in last and offset != last[partition] + 1:
                            raise ArchiveError(
                                f"archive {self.path} has a gap: {self.topics.name(partition)} goes from offset "
                                f"{last[partition]} to {offset} in {run.name}",
                                fix="restore the missing messages, or rebuild from an archive without a gap")
                        last[partition] = offset
                        out.append((partition, offset, value))
                    if out:
                        yield out

    def numbering_before(self, partition: int, offset: int) -> int | None:
        """The number of the last part before ``offset`` in a numbered segment partition
        (see ``protocol.numbering_of``); None when nothing before it says."""
        import pyarrow.parquet as pq

        found: tuple[int, int] | None = None  # (offset, number)
        for run in self.runs:
            for file in self._files(run):
                table = pq.read_table(file, columns=["offset", VALUE], filters=[
                    ("topic", "=", self.topics.changes), ("partition", "=", partition), ("offset", "<", offset),
                    ("kind", "in", ["end", "resolved", "pipeline"])])
                for at, value in zip(table["offset"].to_pylist(), table[VALUE].to_pylist()):
                    try:
                        body = orjson.loads(value or b"")
                    except orjson.JSONDecodeError:
                        continue
                    numbering = numbering_of(body) if isinstance(body, dict) else None
                    if numbering is not None and (found is None or at > found[0]):
                        found = (at, numbering[1])
        return None if found is None else found[1]

    def syncpoints(self) -> list[tuple[int, int]]:
        """(gxid, commit time in ms) of every sync point's commit record, in stream order."""
        import pyarrow.parquet as pq

        found = []
        for run in self.runs:
            for file in self._files(run):
                table = pq.read_table(file, columns=[VALUE],
                                      filters=[("topic", "=", self.topics.dtx), ("kind", "=", "commit")])
                for value in table[VALUE].to_pylist():
                    body = orjson.loads(value)
                    if body.get("syncpoint") is not None:
                        found.append((int(body["gxid"]), int(body["commit_ts_ms"])))
        return found


def _schema_names(file: Path) -> list[str]:
    import pyarrow.parquet as pq

    return list(pq.read_schema(file).names)
