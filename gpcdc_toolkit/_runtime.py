"""Small process and network helpers shared by the sandbox and the broker."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import random
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

_LISTEN_PORTS = range(20000, 65536)  # below: well-known services' customary ports


def free_port(avoid: Collection[int] = (), span: int = 1) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, not in ``avoid``, and
    that no other process of this machine has been given by this function lately; with
    ``span``, the first of that many consecutive such ports, all given out.

    Chosen outside the kernel's ephemeral range: a port from it can be taken, between
    this check and the server's bind, by any outgoing connection on the machine (a busy
    test run makes thousands). Given out once per ``_RESERVED_SECONDS``: two processes
    creating servers at the same moment (a test run's workers) would otherwise both
    find a port free, and the second server to bind it would fail."""
    low, high = _ephemeral_ports()
    with _reservations() as reserved:
        for _ in range(1000):
            block = range(first := random.choice(_LISTEN_PORTS), first + span)
            if block[-1] < _LISTEN_PORTS.stop and not any(
                    low <= port <= high or port in avoid or port in reserved or port_in_use(port) for port in block):
                reserved.update(dict.fromkeys(block, time.time() + _RESERVED_SECONDS))
                return first
    raise OSError(errno.EADDRINUSE, f"no free port in {_LISTEN_PORTS.start}-{_LISTEN_PORTS.stop - 1} outside "
                                    f"the ephemeral range {low}-{high} after 1000 tries")


# Long enough for the slowest server start after its port is chosen (a 64-segment
# sandbox runs initdb for every node first); a server bound by then keeps it in use.
_RESERVED_SECONDS = 900
_RESERVATIONS = Path(tempfile.gettempdir()) / f"gpcdc-ports-{os.getuid()}.json"  # per user: theirs to lock


@contextlib.contextmanager
def _reservations() -> Iterator[dict[int, float]]:
    """The ports given out lately on this machine (port: until when), read and written
    back under an exclusive lock, those expired left out."""
    fd = os.open(_RESERVATIONS, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # the user's own file, not a link
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with os.fdopen(os.dup(fd), "r+") as f:
            now = time.time()
            try:
                reserved = {int(port): float(until) for port, until in json.load(f).items() if float(until) > now}
            except (ValueError, AttributeError, TypeError):
                reserved = {}  # empty (just created) or damaged: nothing reserved
            yield reserved
            f.seek(0)
            f.truncate()
            json.dump({str(port): until for port, until in reserved.items()}, f)
    finally:
        os.close(fd)  # and with it the lock


def _ephemeral_ports() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def port_in_use(port: int) -> bool:
    """Whether something listens on the port (connections lingering in TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs: one that has exited is not alive, even before its
    parent reaps it."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive unless it has exited
        return not _exited(pid)
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # a child of ours that has exited is reaped here
        return done == 0
    except ChildProcessError:
        # Another's, still answering kill(0) as a zombie until its parent reaps it; an
        # orphan's is reaped by init, which may take a second to get to it.
        return not _exited(pid)


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie, or gone), as /proc says; without /proc, no."""
    try:
        state, _group = _state_and_group(Path(f"/proc/{pid}/stat"))
    except FileNotFoundError:
        return Path("/proc/self").exists()
    except OSError:
        return False
    return state == "Z"


def _state_and_group(stat: Path) -> tuple[str, int]:
    """A process's state letter and process group, from its /proc stat file."""
    text = stat.read_text()
    state, _parent, group = text[text.rindex(")") + 2:].split()[:3]  # after the name, which may hold anything
    return state, int(group)


def runs(pid: int | None, command_part: str) -> bool:
    """Whether ``pid`` is alive and its command line contains ``command_part``: a pid
    read from a file may since have been given to an unrelated process."""
    if not pid_alive(pid):
        return False
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True  # no /proc to ask: trust the pid file
    return command_part in command


def running_pid(pid_file: Path, *command_parts: str) -> int | None:
    """The pid ``pid_file`` names, while that process runs with every one of
    ``command_parts`` in its command line (else None: gone, or the pid reused)."""
    try:
        pid = int(pid_file.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if all(runs(pid, part) for part in command_parts) else None


def interrupt_on_sigterm() -> None:
    """End this process on SIGTERM as Ctrl-C ends it (a KeyboardInterrupt), so that its
    ``finally`` blocks and finalizers stop the servers it started: a CI's time limit,
    ``timeout`` or ``kill`` otherwise ends it at once, leaving them running. A second
    SIGTERM is ignored while they run. SIGTERM is unblocked too: a process started by a
    thread that blocks it (as a library's thread may) inherits that mask, and would
    never see one."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])


def _interrupt(signum: int, _frame: object) -> None:
    signal.signal(signum, signal.SIG_IGN)  # a second one would break off the clean-up
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def kill_pid(pid: int) -> None:
    """SIGKILL a process, as a crash would, and return once it is gone."""
    os.kill(pid, signal.SIGKILL)
    while pid_alive(pid):
        time.sleep(0.01)  # reaping: the process is dead, its entry goes shortly


def stop_pid(pid: int, *, timeout: float = 10.0) -> None:
    """SIGTERM a process, then SIGKILL it if it has not exited within ``timeout``."""
    stop_pids([pid], timeout=timeout)


def stop_pids(pids: list[int], *, timeout: float = 10.0) -> None:
    """SIGTERM processes all at once (they wind down side by side), then SIGKILL those
    that have not exited within ``timeout``."""
    alive = list(pids)
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in alive:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in alive if pid_alive(pid)]
            if alive:
                time.sleep(0.05)  # polling the processes' exit
        if not alive:
            return


def stop_group(leader: int, *, timeout: float = 10.0) -> None:
    """Stop a process started in a session of its own, and what it started: SIGTERM the
    leader and wait for it (``stop_pids``), then the members of its process group still
    running (a server's workers, which may outlive it by a moment)."""
    stop_pids([leader], timeout=timeout)
    if members := group_running(leader):
        stop_pids(members, timeout=timeout)


def group_running(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that have not exited, as /proc lists them."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, group = _state_and_group(entry / "stat")
            except OSError:
                continue  # gone meanwhile
            if group == pgid and state != "Z":
                members.append(int(entry.name))
    return members


def read_json(path: Path) -> dict[str, Any]:
    with path.open() as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, _json_text(data))


def _json_text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


class StateWriter:
    """Writes the latest of a file's states (``write_json``) from a thread of its own.

    Replacing a file can wait for the disk: ext4 writes the new file's data out before
    it replaces an old one, and under load that took 190 to 310 ms, during which a
    capture worker that wrote its status itself read nothing (docs/benchmarks.md). Only
    the latest state is written; ``close`` writes what is left and ends the thread. A
    state that cannot be written is logged, not raised: the file is for others to
    read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._text: str | None = None
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"writer of {path.name}", daemon=True)
        self._thread.start()

    def write(self, data: dict[str, Any]) -> None:
        text = _json_text(data)  # here: the caller may change ``data`` as soon as this returns
        with self._changed:
            self._text = text
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                while self._text is None and not self._closed:
                    self._changed.wait()
                text, self._text = self._text, None
            if text is None:
                return  # closed, and everything written
            try:
                write_atomic(self.path, text)
            except OSError as e:
                logging.getLogger(__name__).warning("%s is not written: %s", self.path, e)


def write_atomic(path: Path, text: str) -> None:
    """Write atomically, so neither a crash nor a concurrent reader ever sees half a
    state file (a reader sees the old content or the new)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file beside the state
        if isinstance(e, OSError) and e.filename is None:  # a failed write names no file: say which
            raise OSError(e.errno, e.strerror, str(tmp)) from None
        raise
