"""Large parts on disk: a part's row events in a SQLite file, by sequence number.

The replayer holds a part in memory until it has ``spill_rows`` rows; past that its
rows go to a :class:`SqliteSpill` as they arrive, and the part's payload reads them
back in order, so that a source transaction of any size passes through bounded memory.
The file is removed when the spill is closed or collected; a replayer's directory of
them, when it stops, and the directories a killed replayer left, when the next replayer
of the same pipeline starts.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import tempfile
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from ._source import resent_content

_WRITE_BATCH = 500  # rows per INSERT round


class SpillDirectory:
    """A replayer's own directory for its spills, under ``base`` (default: the system's
    temporary directory), named ``gpcdc-spill+<pipeline>+<random>`` (no topic prefix
    holds a ``+``) and locked (``flock`` on its ``lock`` file) until :meth:`cleanup`.
    Directories of the same pipeline whose lock nobody holds (their replayer was killed:
    nothing reads them again) are removed first. A lock rather than a process id: ids
    are reused, and a process does not see those of another container sharing ``base``."""

    def __init__(self, base: str | None, pipeline: str) -> None:
        root = Path(base or tempfile.gettempdir())
        for left in root.glob(f"gpcdc-spill+{pipeline}+*"):
            _remove_if_abandoned(left)
        self.name = tempfile.mkdtemp(prefix=f"gpcdc-spill+{pipeline}+", dir=root)
        # Locked before it has its name: no one sees the lock file unlocked.
        handle, creating = tempfile.mkstemp(dir=self.name, prefix="lock-")
        fcntl.flock(handle, fcntl.LOCK_EX)
        os.rename(creating, os.path.join(self.name, "lock"))
        self._finalizer = weakref.finalize(self, _release, self.name, handle)

    def cleanup(self) -> None:
        self._finalizer()


def _remove_if_abandoned(directory: Path) -> None:
    try:
        handle = os.open(directory / "lock", os.O_RDWR)
    except OSError:
        return  # not locked yet (being created), or not a spill directory
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(handle)  # its replayer runs
        return
    _release(str(directory), handle)


def _release(directory: str, handle: int) -> None:
    shutil.rmtree(directory, ignore_errors=True)  # while still locked: no one else removes it meanwhile
    os.close(handle)


class SqliteSpill:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        handle, name = tempfile.mkstemp(dir=directory, prefix="part-", suffix=".sqlite")
        os.close(handle)
        self.path = Path(name)
        self._db = sqlite3.connect(name, isolation_level=None, check_same_thread=False)
        self._db.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -4096;"
                               "CREATE TABLE rows (seq INTEGER PRIMARY KEY, event BLOB NOT NULL, content BLOB NOT NULL, "
                               "differs INTEGER NOT NULL)")
        self._pending: list[tuple[int, bytes, bytes]] = []
        self._count: int | None = 0
        self._finalizer = weakref.finalize(self, _remove, self._db, self.path)

    def put(self, seq: int, event: Mapping[str, Any]) -> None:
        self._pending.append((seq, orjson.dumps(event), resent_content(event)))
        self._count = None
        if len(self._pending) >= _WRITE_BATCH:
            self._write()

    def _write(self) -> None:
        if self._pending:
            self._db.execute("BEGIN")  # one transaction per round; a resend replaces by sequence number
            self._db.executemany("INSERT INTO rows VALUES (?, ?, ?, 0) ON CONFLICT (seq) DO UPDATE SET "
                                 "event = excluded.event, content = excluded.content, "
                                 "differs = differs OR content <> excluded.content", self._pending)
            self._db.execute("COMMIT")
            self._pending = []

    def conflicting(self) -> int | None:
        self._write()
        row = self._db.execute("SELECT seq FROM rows WHERE differs ORDER BY seq LIMIT 1").fetchone()
        return None if row is None else int(row[0])

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
