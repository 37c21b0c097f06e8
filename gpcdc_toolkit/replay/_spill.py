"""Large parts on disk: a part's row events in a SQLite file, by sequence number.

The replayer holds a part in memory until it has ``spill_rows`` rows; past that its
rows go to a :class:`SqliteSpill` as they arrive, and the part's payload reads them
back in order, so that a source transaction of any size passes through bounded memory.
The file is removed when the spill is closed or collected; a replayer's directory of
them, when it stops, and the directories a killed replayer left, when the next replayer
of the same pipeline starts.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

_WRITE_BATCH = 500  # rows per INSERT round


def spill_directory(base: str | None, pipeline: str) -> tempfile.TemporaryDirectory[str]:
    """A replayer's own directory for its spills, under ``base`` (default: the system's
    temporary directory), named ``gpcdc-spill+<pipeline>+<pid>+<random>`` (no topic
    prefix holds a ``+``). Those of the same pipeline whose process is gone (a replayer
    killed: nothing of it reads them again) are removed first."""
    root = Path(base or tempfile.gettempdir())
    for left in root.glob("gpcdc-spill+*+*+*"):
        _, owner, pid, _ = left.name.split("+", 3)
        if owner == pipeline and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(left, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"gpcdc-spill+{pipeline}+{os.getpid()}+", dir=root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class SqliteSpill:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        handle, name = tempfile.mkstemp(dir=directory, prefix="part-", suffix=".sqlite")
        os.close(handle)
        self.path = Path(name)
        self._db = sqlite3.connect(name, isolation_level=None, check_same_thread=False)
        self._db.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -4096;"
                               "CREATE TABLE rows (seq INTEGER PRIMARY KEY, event BLOB NOT NULL)")
        self._pending: list[tuple[int, bytes]] = []
        self._count: int | None = 0
        self._finalizer = weakref.finalize(self, _remove, self._db, self.path)

    def put(self, seq: int, event: Mapping[str, Any]) -> None:
        self._pending.append((seq, orjson.dumps(event)))
        self._count = None
        if len(self._pending) >= _WRITE_BATCH:
            self._write()

    def _write(self) -> None:
        if self._pending:
            self._db.execute("BEGIN")  # one transaction per round; a resend replaces by sequence number
            self._db.executemany("INSERT OR REPLACE INTO rows VALUES (?, ?)", self._pending)
            self._db.execute("COMMIT")
            self._pending = []

    def seqs(self) -> Iterator[int]:
        self._write()
        return (seq for (seq,) in self._db.execute("SELECT seq FROM rows ORDER BY seq"))

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        self._write()
        return (orjson.loads(event) for (event,) in self._db.execute("SELECT event FROM rows ORDER BY seq"))

    def __len__(self) -> int:
        if self._count is None:
            self._write()
            self._count = int(self._db.execute("SELECT count(*) FROM rows").fetchone()[0])
        return self._count

    def close(self) -> None:
        self._finalizer()


def _remove(db: sqlite3.Connection, path: Path) -> None:
    db.close()
    path.unlink(missing_ok=True)
