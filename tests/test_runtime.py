"""Ports for the servers the toolkit starts: free, and out of the way of outgoing
connections (which take theirs from the kernel's ephemeral range); processes that have
exited are not alive, whoever has to reap them."""

import signal
import socket
import subprocess
import sys
import time

import pytest

from gpcdc_toolkit import _runtime
from gpcdc_toolkit._runtime import free_port, group_running, pid_alive, stop_group, stop_pids


def test_a_free_port_is_outside_the_ephemeral_range_and_can_be_listened_on():
    low, high = _runtime._ephemeral_ports()
    for _ in range(50):
        port = free_port()
        assert 20000 <= port <= 65535 and not low <= port <= high
        with socket.socket() as s:
            # As the servers listen (PostgreSQL, Kafka's and Spark's JVMs all set it): a port
            # whose last server's connections linger in TIME_WAIT is free to them, and only
            # a bind without SO_REUSEADDR would be refused it.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()


def test_a_port_listened_on_or_to_avoid_is_never_chosen(monkeypatch, tmp_path):
    monkeypatch.setattr(_runtime, "_RESERVATIONS", tmp_path / "ports.json")
    monkeypatch.setattr(_runtime, "_RESERVED_SECONDS", 0)  # each port given out is free again at once
    monkeypatch.setattr(_runtime, "_LISTEN_PORTS", range(20000, 20004))
    monkeypatch.setattr(_runtime, "_ephemeral_ports", lambda: (20003, 20003))
    monkeypatch.setattr(_runtime, "port_in_use", lambda port: port == 20000)
    assert {free_port(avoid={20001}) for _ in range(30)} == {20002}
    with pytest.raises(OSError, match=r"no free port in 20000-20003 outside the ephemeral range 20003-20003"):
        free_port(avoid={20001, 20002})


# Another process choosing ports from the same few, with the same reservations.
_CHOOSER = """
import sys
from pathlib import Path
from gpcdc_toolkit import _runtime
_runtime._RESERVATIONS, _runtime._LISTEN_PORTS = Path(sys.argv[1]), range(int(sys.argv[2]), int(sys.argv[3]))
_runtime._ephemeral_ports = lambda: (1, 2)
_runtime.port_in_use = lambda port: False  # whatever listens there now: what counts is who was given it
try:
    print(_runtime.free_port())
except OSError as e:
    print("none:", e)
"""


def test_a_port_given_out_is_given_to_no_other_process_until_its_reservation_ends(monkeypatch, tmp_path):
    """Two processes starting servers at once would both find a port free until one
    binds it: each port goes to one of them."""
    reservations = tmp_path / "ports.json"
    monkeypatch.setattr(_runtime, "_RESERVATIONS", reservations)
    monkeypatch.setattr(_runtime, "_LISTEN_PORTS", range(20000, 20003))
    monkeypatch.setattr(_runtime, "_ephemeral_ports", lambda: (1, 2))
    monkeypatch.setattr(_runtime, "port_in_use", lambda port: False)  # none of them bound yet
    mine = free_port()
    choosers = [subprocess.Popen([sys.executable, "-c", _CHOOSER, str(reservations), "20000", "20003"],
                                 stdout=subprocess.PIPE, text=True) for _ in range(3)]
    answers = sorted(p.communicate(timeout=60)[0].strip() for p in choosers)
    given = [int(a) for a in answers if not a.startswith("none")]
    assert sorted([mine, *given]) == [20000, 20001, 20002], answers  # each once, whichever process asked first
    assert answers[-1].startswith("none: ") and "no free port in 20000-20002" in answers[-1], answers
    with pytest.raises(OSError, match="no free port"):
        free_port()
    monkeypatch.setattr(_runtime, "_RESERVED_SECONDS", 0)
    reservations.write_text('{"20000": 0, "20001": 1e18, "20002": 1e18}')  # the first expired: given out again
    assert free_port() == 20000
    for damaged in ("not json", "[1, 2]", '{"20000": null}', '{"20000": "soon"}', '{"x": 1e18}'):
        reservations.write_text(damaged)  # as if none were reserved
        assert free_port() in (20000, 20001, 20002)


def test_a_span_of_ports_is_free_and_given_out_whole(monkeypatch, tmp_path):
    monkeypatch.setattr(_runtime, "_RESERVATIONS", tmp_path / "ports.json")
    monkeypatch.setattr(_runtime, "_LISTEN_PORTS", range(20000, 20004))
    monkeypatch.setattr(_runtime, "_ephemeral_ports", lambda: (1, 2))
    monkeypatch.setattr(_runtime, "port_in_use", lambda port: port == 20003)
    first = free_port(span=2)
    assert first in (20000, 20001)  # 20002-20003 holds one in use, 20003-20004 leaves the range
    with pytest.raises(OSError, match="no free port"):
        free_port(span=2)  # what is left is one port
    assert free_port() == ({20000, 20001, 20002} - {first, first + 1}).pop()


def test_a_link_in_place_of_the_reservations_is_refused_not_followed(monkeypatch, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("kept")
    (tmp_path / "ports.json").symlink_to(victim)
    monkeypatch.setattr(_runtime, "_RESERVATIONS", tmp_path / "ports.json")
    with pytest.raises(OSError):
        free_port()
    assert victim.read_text() == "kept"


# A parent that starts a child which exits at once, prints its pid, and never reaps it.
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "pass"])
print(child.pid, flush=True)
time.sleep(600)
"""


def state(pid):
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rindex(")") + 2]


def test_a_process_that_exited_is_not_alive_before_its_parent_reaps_it():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 30
        while state(child) != "Z":  # waiting for the child's exit, as /proc shows it
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert not pid_alive(child)
        assert state(child) == "Z"  # not ours to reap: still there, and not taken for alive
        assert pid_alive(parent.pid)
        started = time.monotonic()
        stop_pids([child], timeout=120)
        assert time.monotonic() - started < 120  # it saw the exit: the time did not run out
    finally:
        parent.kill()
        parent.wait()
    assert not pid_alive(parent.pid)


# A leader in a session of its own whose child outlives it unless stopped.
_LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_stopping_a_group_stops_its_leader_and_what_it_started():
    leader = subprocess.Popen([sys.executable, "-c", _LEADER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        child = int(leader.stdout.readline())
        assert sorted(group_running(leader.pid)) == sorted([leader.pid, child])
        stop_group(leader.pid, timeout=30)
        assert group_running(leader.pid) == []
        assert not pid_alive(leader.pid) and not pid_alive(child)
    finally:
        leader.kill()
        leader.wait()


def test_sigterm_ends_a_process_as_ctrl_c_does_its_clean_up_run(tmp_path):
    """What a benchmark or a test run started is stopped by its ``finally`` blocks when a
    time limit or ``kill`` ends it; without the handler SIGTERM ends it at once."""
    program = f"""
import sys, threading
from gpcdc_toolkit._runtime import interrupt_on_sigterm
if sys.argv[1] == "handled":
    interrupt_on_sigterm()
try:
    print("ready", flush=True)
    threading.Event().wait()
finally:
    open({str(tmp_path / "cleaned")!r} + sys.argv[1], "w").write("stopped")
"""
    def masked(mode):  # the handled child inherits SIGTERM blocked, as from a thread that blocks it
        how = signal.SIG_BLOCK if mode == "handled" else signal.SIG_UNBLOCK
        return lambda: signal.pthread_sigmask(how, [signal.SIGTERM])

    for mode in ("handled", "default"):
        child = subprocess.Popen([sys.executable, "-c", program, mode], stdout=subprocess.PIPE, text=True,
                                 preexec_fn=masked(mode))  # noqa: PLW1509 (the child's mask, set before it runs)
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) != 0
        child.stdout.close()
    assert (tmp_path / "cleanedhandled").read_text() == "stopped"
    assert not (tmp_path / "cleaneddefault").exists()


def test_a_state_writer_keeps_its_caller_out_of_a_slow_write_and_ends_on_the_latest_state(monkeypatch, tmp_path):
    import json
    import threading

    started, release = threading.Event(), threading.Event()
    real_write = _runtime.write_atomic

    def slow_write(path, text):  # a disk that takes its time, as ext4 replacing a file under load
        started.set()
        assert release.wait(30)
        real_write(path, text)

    monkeypatch.setattr(_runtime, "write_atomic", slow_write)
    path = tmp_path / "node0.status.json"
    writer = _runtime.StateWriter(path)
    state = {"state": "streaming", "events": 0, "kinds": {"row": 0}}
    writer.write(state)
    assert started.wait(30)
    for events in range(1, 1000):  # the caller goes on while the first write waits
        state["events"] = events
        state["kinds"]["row"] = events
        writer.write(state)
    state["state"] = "stopped"  # changed after the last write: not what was handed over
    release.set()
    writer.close()
    assert json.loads(path.read_text()) == {"state": "streaming", "events": 999, "kinds": {"row": 999}}
    assert not writer._thread.is_alive()


def test_a_state_that_cannot_be_written_is_logged_and_the_next_one_still_written(tmp_path, caplog):
    import json

    path = tmp_path / "gone" / "node0.status.json"
    writer = _runtime.StateWriter(path)
    writer.write({"state": "starting"})
    writer.close()
    assert "is not written" in caplog.text and str(path) in caplog.text and not path.exists()
    path.parent.mkdir()
    writer = _runtime.StateWriter(path)
    writer.write({"state": "streaming"})
    writer.close()
    assert json.loads(path.read_text()) == {"state": "streaming"}
