"""Sessions of the Spark Connect server, handed from one process to the next.

Spark starts Python worker daemons (the reads' ``mapInArrow``, a stream's planning) for
each Connect session, and keeps them until the server stops. A new session for every
command made each command's first read start them again (5 s on a
slow machine, most of a small read) and left three more daemons on the server each time
(37 processes and 1.4 GB after twelve commands). So the toolkit's processes take their
sessions from slots kept beside the server: a slot is one session, held by one process
at a time (an ``flock``, which the kernel drops however the process ends), and a process
gives it back tidied when it stops its session: its checkpoints released, its temporary
views, streaming queries, settings and current database gone. A slot whose last holder
ended without giving it back stays marked in use: the next process to take a slot
releases every such session whole (and with it whatever it held), and the slot's next
holder starts a new one.
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._runtime import read_json, write_json

_held: set[Lease] = set()  # the slots this process holds, for a forked child to let go of


@dataclass(eq=False)
class Lease:
    """A slot held by this process, and the session it stands for."""

    state_file: Path
    lock_fd: int
    server: str
    session_id: str
    given_back: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start_anew(self) -> None:
        """The slot's session is gone from the server (its idle timeout closed it): a new one."""
        self.session_id = str(uuid.uuid4())
        self._write(in_use=True)

    def give_back(self, tidy: bool) -> None:
        """Free the slot (once): for the next holder to reuse the session when ``tidy``,
        else to release it and start another."""
        with self._lock:
            if self.given_back:
                return
            self.given_back = True
            _held.discard(self)
            try:
                if tidy:
                    self._write(in_use=False)
            finally:
                os.close(self.lock_fd)

    def _write(self, in_use: bool) -> None:
        write_json(self.state_file, {"server": self.server, "session": self.session_id, "in_use": in_use})


def _forget_in_child() -> None:
    # A forked child shares the parent's locks: it lets go of its copies (an flock belongs
    # to the open file, so the parent keeps its slot) and gives nothing back.
    for lease in list(_held):
        lease._lock = threading.Lock()  # a fork amid a give-back copies it held
        lease.given_back = True
        os.close(lease.lock_fd)
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def take_slot(directory: Path, server: str, release: Callable[[str], None]) -> Lease:
    """The first slot in ``directory`` no process holds, for a session of ``server`` (an
    identity of the server's run: a session of an earlier run is gone with it). First,
    every session a free slot was left holding in use (its holder ended without giving it
    back) is passed to ``release``; its slot forgets it only once that returns."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "take.lock").open("w") as taking:
        # Takers take turns, so that one looking over the free slots never makes another
        # find them held and begin a session in a new slot.
        fcntl.flock(taking, fcntl.LOCK_EX)
        lease: Lease | None = None
        try:
            index = 0
            while lease is None or (directory / f"{index}.lock").exists():
                fd = _locked(directory / f"{index}.lock")
                if fd is not None:
                    try:
                        lease = _visit(directory / f"{index}.json", fd, server, release, lease)
                    finally:
                        if lease is None or lease.lock_fd != fd:
                            os.close(fd)
                index += 1
        except BaseException:
            if lease is not None:
                lease.give_back(tidy=False)
            raise
    _held.add(lease)
    return lease


def _visit(state_file: Path, fd: int, server: str, release: Callable[[str], None], lease: Lease | None) -> Lease | None:
    """A free slot, its lock held: the lease when none is taken yet; its session released
    if it was left in use."""
    session, in_use = _state(state_file, server)
    if session is not None and in_use:
        release(session)
        session = None
        if lease is not None:
            state_file.unlink()  # released: the slot's next holder begins anew
    if lease is not None:
        return lease
    taken = Lease(state_file, fd, server, session or str(uuid.uuid4()))
    taken._write(in_use=True)
    return taken


def _locked(path: Path) -> int | None:
    """A descriptor of ``path`` holding its lock, or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _state(state_file: Path, server: str) -> tuple[str | None, bool]:
    """The slot's session of ``server`` and whether it was left in use; (None, False)
    when it has none (a new slot, another server's, or a file that cannot be read)."""
    try:
        state: dict[str, Any] = read_json(state_file)
        session = str(uuid.UUID(state["session"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, False
    if state.get("server") != server:
        return None, False
    return session, state.get("in_use") is not False
