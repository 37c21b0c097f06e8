"""Sessions of the Spark Connect server, handed from one process to the next.

Spark starts Python worker daemons (the gpcdc data source's planning and reading,
``mapInArrow``) for each Connect session, and keeps them until the server stops. A new
session for every command made each command's first read start them again (5 s on a
slow machine, most of a small read) and left three more daemons on the server each time
(37 processes and 1.4 GB after twelve commands). So the toolkit's processes take their
sessions from slots kept beside the server: a slot is one session, held by one process
at a time (an ``flock``, which the kernel drops however the process ends), and a process
gives it back tidied when it stops its session: its checkpoints released, its cached
tables, temporary views, streaming queries and settings gone. A slot whose last holder
ended without giving it back stays marked in use: the next process to take it releases
that session whole (and with it whatever it held) and starts a new one.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from .._runtime import read_json, write_json


@dataclass
class Lease:
    """A slot held by this process: the session it stands for, and what to release first."""

    state_file: Path
    lock_fd: int
    session_id: str
    stale_session_id: str | None  # left in use by a holder that did not give it back: release it
    given_back: bool = False

    def give_back(self, tidy: bool) -> None:
        """Free the slot (once): for the next holder to reuse the session when ``tidy``,
        else to release it and start another."""
        if self.given_back:
            return
        self.given_back = True
        try:
            if tidy:
                write_json(self.state_file, {**read_json(self.state_file), "in_use": False})
        finally:
            os.close(self.lock_fd)


def take_slot(directory: Path, server: str) -> Lease:
    """The first slot in ``directory`` no process holds, for a session of ``server`` (an
    identity of the server's run: a session of an earlier run is gone with it)."""
    directory.mkdir(parents=True, exist_ok=True)
    index = 0
    while True:
        fd = os.open(directory / f"{index}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            index += 1
            continue
        try:
            return _lease(directory / f"{index}.json", fd, server)
        except BaseException:
            os.close(fd)
            raise


def _lease(state_file: Path, fd: int, server: str) -> Lease:
    try:
        state = read_json(state_file)
    except (OSError, ValueError):
        state = {}
    ours = state.get("server") == server and isinstance(state.get("session"), str)
    stale = state["session"] if ours and state.get("in_use", True) else None
    session = state["session"] if ours and stale is None else str(uuid.uuid4())
    write_json(state_file, {"server": server, "session": session, "in_use": True})
    return Lease(state_file, fd, session, stale)
