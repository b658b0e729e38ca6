"""The in-cluster test bed's DNS answers (testbed/realnodes/clusterdns.py), packet by packet: a Service's cluster IP
for its cluster name, an empty answer for another type of it, NXDOMAIN for every other name (nothing forwarded)."""

from __future__ import annotations

import socket
import struct

from testbed.realnodes.clusterdns import NOERROR, NXDOMAIN, TYPE_A, answer

SERVICES = {("fracgpu-system", "fracgpu-admission"): "10.96.12.34"}
TYPE_AAAA = 28


def query(name: str, qtype: int = TYPE_A, ident: int = 0x1234) -> bytes:
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", qtype, 1)


def reply_of(name: str, qtype: int = TYPE_A) -> tuple[int, int, list[str]]:
    """(rcode, flags, addresses) of the answer to a query for name."""
    packet = answer(query(name, qtype), lambda namespace, service: SERVICES.get((namespace, service)))
    ident, flags, _, count = struct.unpack("!HHHH", packet[:8])
    assert ident == 0x1234 and flags & 0x8000  # our id, and a response
    addresses = [socket.inet_ntoa(packet[-4 * (i + 1):len(packet) - 4 * i]) for i in range(count)]
    return flags & 0xF, flags, addresses


def test_a_service_name_gets_its_cluster_ip() -> None:
    rcode, flags, addresses = reply_of("fracgpu-admission.fracgpu-system.svc.cluster.local")
    assert (rcode, addresses) == (NOERROR, ["10.96.12.34"])
    assert flags & 0x0400 and flags & 0x0100  # authoritative, recursion desired echoed


def test_another_type_of_a_service_name_is_an_empty_answer_not_an_error() -> None:
    assert reply_of("fracgpu-admission.fracgpu-system.svc.cluster.local", TYPE_AAAA)[::2] == (NOERROR, [])


def test_every_other_name_is_nxdomain_and_never_forwarded() -> None:
    for name in ("absent.fracgpu-system.svc.cluster.local", "fracgpu-admission.fracgpu-system.svc",
                 "pypi.org", "fracgpu-admission.fracgpu-system.svc.fracgpu-system.svc.cluster.local"):
        assert reply_of(name)[::2] == (NXDOMAIN, []), name


def test_a_malformed_query_gets_formerr() -> None:
    packet = answer(b"\x12\x34\x01\x00\x00\x02", lambda namespace, service: None)
    assert packet[:2] == b"\x12\x34" and struct.unpack("!H", packet[2:4])[0] & 0xF == 1
