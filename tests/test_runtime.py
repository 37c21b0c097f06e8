"""Ports for the servers the toolkit starts: free, and out of the way of outgoing
connections (which take theirs from the kernel's ephemeral range)."""

import socket

import pytest

from gpcdc_toolkit import _runtime
from gpcdc_toolkit._runtime import free_port


def test_a_free_port_is_outside_the_ephemeral_range_and_can_be_listened_on():
    low, high = _runtime._ephemeral_ports()
    for _ in range(50):
        port = free_port()
        assert 20000 <= port <= 65535 and not low <= port <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()


def test_a_port_listened_on_or_to_avoid_is_never_chosen(monkeypatch):
    monkeypatch.setattr(_runtime, "_LISTEN_PORTS", range(20000, 20004))
    monkeypatch.setattr(_runtime, "_ephemeral_ports", lambda: (20003, 20003))
    monkeypatch.setattr(_runtime, "port_in_use", lambda port: port == 20000)
    assert {free_port(avoid={20001}) for _ in range(30)} == {20002}
    with pytest.raises(OSError, match=r"no free port in 20000-20003 outside the ephemeral range 20003-20003"):
        free_port(avoid={20001, 20002})
