"""An archive's layout and its continuity (pure over what its runs say).

``<path>/run-<n>/`` (n = 1, 2, ...) each hold one write's messages as Parquet, with
``_start.json`` and ``_position.json``: per topic and partition, the offset the run
starts at and the one it ends before. Runs chain: each starts where the one before it
ended. ``<path>/capture/<prefix>/`` holds a copy of the pipeline's record (start point,
initial snapshot, repairs, sync points), so that the archive alone rebuilds a target.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

START, POSITION = "_start.json", "_position.json"  # in each run's directory (Spark's reader passes over them)
VALUE = "value"  # the column holding each message's bytes, as Kafka held them

Offsets = dict[str, dict[int, int]]  # topic -> partition -> offset


class ArchiveError(ConfigError):
    """An archive cannot be read or written as asked."""


@dataclass(frozen=True)
class RunBounds:
    number: int
    start: Offsets | None  # None: written before runs said where they start
    end: Offsets


def run_number(path: Path) -> int | None:
    name = path.name
    if not name.startswith("run-") or not name[4:].isdigit():
        return None
    return int(name[4:])


def check_continuous(archive: str, runs: list[RunBounds]) -> None:
    """Refuse an archive whose runs do not chain: a run missing by its number, or one
    that starts elsewhere than where the run before it ended."""
    if not runs:
        raise ArchiveError(f"{archive} holds no archive runs", fix="write one with `gpcdc archive --to PATH` first")
    expected = 1
    previous: RunBounds | None = None
    for run in runs:
        if run.number != expected:
            missing = f"run-{expected:06d}" if run.number == expected + 1 else f"runs {expected} to {run.number - 1}"
            raise ArchiveError(f"archive {archive} has a gap: {missing} is missing before run-{run.number:06d}",
                               fix="restore the missing run, or rebuild from an archive without a gap")
        if previous is not None and run.start is not None:
            for topic, parts in run.start.items():
                for partition, offset in sorted(parts.items()):
                    ended = previous.end.get(topic, {}).get(partition, 0)
                    if offset != ended:
                        raise ArchiveError(
                            f"archive {archive} has a gap: run-{run.number:06d} starts {topic} partition {partition} "
                            f"at offset {offset}, and run-{previous.number:06d} ended it at offset {ended}",
                            fix="restore the missing messages, or rebuild from an archive without a gap")
        previous, expected = run, expected + 1
