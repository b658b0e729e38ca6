"""Cluster DNS for in-cluster mode: `<service>.<namespace>.svc.cluster.local` answered from the API server.

The chart's pods find each other by Service name (the certificate Job waits for
`https://fracgpu-admission.<namespace>.svc:443`), so the kubelets point their pods at this server (`clusterDNS`) and
it answers A queries for Services with their cluster IP, which kube-proxy forwards to a ready endpoint. It answers
nothing else: every other name is NXDOMAIN and no query is forwarded, so a pod's lookup never leaves the machine.
Only what the test bed needs of RFC 1035: one question per UDP query, A records, and an empty answer to any other
type of a name that exists (a resolver asks for AAAA beside A).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable

import requests

DOMAIN = "cluster.local"
TTL_S = 5  # Services come and go during tests: keep what resolvers cache short
TYPE_A, CLASS_IN = 1, 1
NOERROR, FORMERR, NXDOMAIN = 0, 1, 3


def parse_question(packet: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, name, qtype, end of the question) of a query; ValueError when it is not one we answer."""
    if len(packet) < 12:
        raise ValueError("short header")
    ident, flags, questions = struct.unpack("!HHH", packet[:6])
    if questions != 1 or flags & 0x8000:
        raise ValueError("not a single-question query")
    labels, offset = [], 12
    while True:
        if offset >= len(packet):
            raise ValueError("truncated name")
        length = packet[offset]
        offset += 1
        if length == 0:
            break
        if length & 0xC0:  # no compression pointers in a question we accept
            raise ValueError("compressed name")
        labels.append(packet[offset:offset + length].decode("ascii", "replace").lower())
        offset += length
    if offset + 4 > len(packet):
        raise ValueError("truncated question")
    qtype, qclass = struct.unpack("!HH", packet[offset:offset + 4])
    return ident, flags, ".".join(labels), qtype, offset + 4 if qclass == CLASS_IN else -1


def answer(packet: bytes, lookup: Callable[[str, str], str | None]) -> bytes:
    """The response to a query packet; lookup(namespace, service) gives a Service's cluster IP or None."""
    try:
        ident, flags, name, qtype, end = parse_question(packet)
    except ValueError:
        return packet[:2] + struct.pack("!HHHHH", 0x8000 | FORMERR, 0, 0, 0, 0) if len(packet) >= 2 else b""
    address = None
    parts = name.split(".")
    if end > 0 and name.endswith(f".svc.{DOMAIN}") and len(parts) == 5:
        address = lookup(parts[1], parts[0])
    code = NOERROR if address else NXDOMAIN
    records = [address] if address and qtype == TYPE_A else []
    # QR, the query's opcode and RD, AA (we are the authority for the cluster domain), RA
    header = struct.pack("!HHHHHH", ident, 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080 | code, 1, len(records), 0, 0)
    question = packet[12:end] if end > 0 else packet[12:]
    body = b"".join(struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL_S, 4) + socket.inet_aton(ip) for ip in records)
    return header + question + body


class ClusterDNS:
    """A UDP DNS server on address:53, in a thread of this process, answering from the API server."""

    def __init__(self, address: str, base_url: str, session: requests.Session) -> None:
        self.address, self.base_url, self.session = address, base_url, session
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind((address, 53))
        self.socket.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="cluster-dns", daemon=True)
        self._thread.start()

    def cluster_ip(self, namespace: str, service: str) -> str | None:
        try:
            response = self.session.get(f"{self.base_url}/api/v1/namespaces/{namespace}/services/{service}",
                                        timeout=5)
        except requests.RequestException:
            return None
        ip = (response.json().get("spec") or {}).get("clusterIP") if response.status_code == 200 else None
        return ip if ip and ip != "None" else None  # a headless Service has no single address to give

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                packet, peer = self.socket.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = answer(packet, self.cluster_ip)
            if reply:
                self.socket.sendto(reply, peer)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.socket.close()
