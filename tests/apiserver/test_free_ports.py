"""The test bed's port picker: the ports it gives must still be free when a server starts on them later."""

from __future__ import annotations

import collections
import socket

import pytest

from testbed.programs import procs
from testbed.programs.procs import _ephemeral_range, free_ports


def test_ports_lie_outside_the_kernels_ephemeral_range_so_no_outgoing_connection_takes_one():
    low, high = _ephemeral_range()
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(not low <= port <= high for port in ports), ports


def test_a_port_is_not_handed_out_again_while_its_server_may_not_listen_yet():
    first = set(free_ports(200))
    second = set(free_ports(200))
    assert not first & second


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch):
    taken, free = free_ports(10), free_ports(10)
    listeners = []
    try:
        for port in taken:
            listener = socket.socket()
            listener.bind(("127.0.0.1", port))
            listener.listen()
            listeners.append(listener)
        monkeypatch.setattr(procs, "_handed_out", collections.deque(maxlen=100))
        monkeypatch.setattr(procs, "_candidate_ports", lambda: [*taken, *free])
        assert sorted(free_ports(10)) == sorted(free)
        with pytest.raises(RuntimeError, match="no 1 free TCP ports"):
            free_ports(1)
    finally:
        for listener in listeners:
            listener.close()
