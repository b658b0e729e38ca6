"""The webhook cannot be starved by connections that hold it without using it (admission/connections.py)."""

import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
import requests

from testbed.programs.webhook import AdmissionProcess

REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "r", "operation": "CREATE", "namespace": "ns",
                      "object": {"metadata": {"name": "p", "annotations": {"gpu-fraction": "0.5"}},
                                 "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c"}]}}}}


def metric(webhook: AdmissionProcess, name: str, labels: str = "") -> float:
    text = requests.get(f"http://127.0.0.1:{webhook.metrics_port}/metrics", timeout=5).text
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def tls_connection(webhook: AdmissionProcess, timeout: float = 5) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=webhook.ca_file)
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=timeout)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def timed_reviews(webhook: AdmissionProcess, seconds: float) -> tuple[list[float], list[str]]:
    """Reviews for `seconds`: every other one on a new connection. Returns latencies and failures."""
    latencies: list[float] = []
    failures: list[str] = []
    deadline = time.monotonic() + seconds
    with requests.Session() as http:
        http.trust_env = False
        http.verify = webhook.ca_file
        while time.monotonic() < deadline:
            if len(latencies) % 2:
                http.close()
            started = time.perf_counter()
            try:
                answer = http.post(f"{webhook.url}/mutate--v1-pod", json=REVIEW, timeout=10)
                if answer.status_code != 200 or not answer.json()["response"]["allowed"]:
                    failures.append(answer.text[:200])
            except requests.RequestException as error:
                failures.append(repr(error))
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)
    return latencies, failures


def test_a_few_silent_connections_hold_nothing(tmp_path):
    """The failure the old thread-per-connection server had: 4 idle connections stalled every handshake."""
    with AdmissionProcess(tmp_path, ["--log-level", "warning"]) as webhook:
        handshakes = []
        silent = []
        try:
            for _ in range(8):
                started = time.perf_counter()
                silent.append(tls_connection(webhook, timeout=3))
                handshakes.append(time.perf_counter() - started)
            latencies, failures = timed_reviews(webhook, 1)
        finally:
            for sock in silent:
                sock.close()
    assert max(handshakes) < 1.0 and failures == [] and max(latencies) < 1.0, (handshakes, failures)


def test_silent_and_slow_connections_do_not_delay_real_reviews(tmp_path):
    with AdmissionProcess(tmp_path, ["--log-level", "warning"]) as webhook:
        pressure = subprocess.Popen(
            [sys.executable, "-m", "testbed.players.slowclients", "--port", str(webhook.port), "--silent", "500",
             "--slow", "500", "--duration", "25"], stdout=subprocess.PIPE, text=True)
        try:
            ready = json.loads(pressure.stdout.readline())
            assert ready["ready"] and ready["opened"] == {"silent": 500, "slow": 500, "unshaken": 0}, ready
            held = metric(webhook, "fracgpu_admission_open_connections")
            latencies, failures = timed_reviews(webhook, 12)
            final = json.loads(pressure.stdout.readline())
        finally:
            pressure.kill()
            pressure.wait()
        slow_cut = metric(webhook, "fracgpu_admission_connections_closed_total", '{reason="request_timeout"}')
    assert held >= 1000, "the pressure did not hold the server's connections"
    assert slow_cut >= 400, "slow requests were not cut at --request-read-timeout"
    assert final["closed_by_server"]["silent"] == 0, final  # idle connections are kept, not killed
    assert failures == []
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    assert len(latencies) > 200 and p99 <= 0.100, (len(latencies), p99, latencies[-5:])


def test_connection_bound_closes_the_longest_waiting_and_says_so(tmp_path):
    with AdmissionProcess(tmp_path, ["--max-connections", "20"], workers=1) as webhook:
        parked = [tls_connection(webhook) for _ in range(30)]
        try:
            oldest_closed = closed_by_server(parked[0], within=2)
            newest_open = not closed_by_server(parked[-1], within=0.5)
            latencies, failures = timed_reviews(webhook, 1)
        finally:
            for sock in parked:
                sock.close()
        evicted = metric(webhook, "fracgpu_admission_connections_closed_total", '{reason="limit"}')
        log = webhook.log_tail(200)
    assert oldest_closed and newest_open
    assert failures == [] and max(latencies) < 1.0
    assert evicted >= 10
    line = next(json.loads(text) for text in log.splitlines() if "connection limit reached" in text)
    assert line["level"] == "warning" and line["max_connections"] == 20 and line["evicted"] >= 1


def raw_review(sock: ssl.SSLSocket) -> bytes:
    """POST one review on an open connection and return the whole answer."""
    body = json.dumps(REVIEW).encode()
    sock.sendall(b"POST /mutate--v1-pod HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += received(sock, answer)
    head, _, rest = answer.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))
    while len(rest) < length:
        rest += received(sock, head + rest)
    return head + b"\r\n\r\n" + rest


def received(sock: ssl.SSLSocket, so_far: bytes) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise ConnectionError(f"the server closed the connection; answered so far: {so_far[:200]!r}")
    return chunk


def test_deadlines_for_handshake_and_request_but_not_for_idle_keep_alive(tmp_path):
    args = ["--tls-handshake-timeout", "1", "--request-read-timeout", "1"]
    with AdmissionProcess(tmp_path, args, workers=1) as webhook:
        unshaken = socket.create_connection(("127.0.0.1", webhook.port), timeout=5)
        slow = tls_connection(webhook)
        slow.sendall(b"POST /mutate--v1-pod HTTP/1.1\r\nHost: x\r\n")
        with tls_connection(webhook) as kept_alive:  # idle for longer than both deadlines between two reviews
            assert raw_review(kept_alive).startswith(b"HTTP/1.1 200 ")
            started = time.monotonic()
            assert closed_by_server(unshaken, within=4) and closed_by_server(slow, within=4)
            waited = time.monotonic() - started
            time.sleep(max(0.0, 2.5 - waited))
            kept_alive.settimeout(5)
            assert raw_review(kept_alive).startswith(b"HTTP/1.1 200 ")
        closed = {reason: metric(webhook, "fracgpu_admission_connections_closed_total", f'{{reason="{reason}"}}')
                  for reason in ("handshake_timeout", "request_timeout")}
    assert closed == {"handshake_timeout": 1.0, "request_timeout": 1.0}
    assert waited < 3.0


@pytest.mark.parametrize("request_bytes, status", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"POST /mutate--v1-pod HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n", 400),
])
def test_malformed_http_is_answered_and_the_server_keeps_serving(tmp_path, request_bytes, status):
    with AdmissionProcess(tmp_path, workers=1) as webhook:
        with tls_connection(webhook) as sock:
            sock.sendall(request_bytes)
            answer = sock.recv(4096)
        assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer
        latencies, failures = timed_reviews(webhook, 0.5)
        assert failures == [] and latencies


def test_sigterm_answers_the_request_in_flight(tmp_path):
    with AdmissionProcess(tmp_path, workers=1) as webhook:
        body = json.dumps(REVIEW).encode()
        with tls_connection(webhook) as sock:
            sock.sendall(b"POST /mutate--v1-pod HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
            time.sleep(0.3)
            answered: list[bytes] = []
            stopper = threading.Thread(target=webhook.stop)
            stopper.start()
            time.sleep(0.5)
            sock.sendall(body[10:])
            answered.append(sock.recv(65536))
            stopper.join()
    assert answered[0].startswith(b"HTTP/1.1 200 "), answered
    assert b"connection: close" in answered[0].lower()


def test_sigterm_leaves_idle_connections_open_for_one_more_request(tmp_path):
    """The API server may be writing its next review into an idle keep-alive connection at the moment the pod gets
    SIGTERM, and a POST written into a connection being closed is not retried ("broken pipe"). So after SIGTERM an
    idle connection's next review is answered with `Connection: close` (the client closes it, nothing in flight),
    and a connection nobody uses is closed only at the drain's end."""
    with AdmissionProcess(tmp_path, ["--shutdown-drain-seconds", "2"], workers=1) as webhook:
        with tls_connection(webhook) as reused, tls_connection(webhook) as left_idle:
            assert raw_review(reused).startswith(b"HTTP/1.1 200 ")
            assert raw_review(left_idle).startswith(b"HTTP/1.1 200 ")
            stopper = threading.Thread(target=webhook.stop)
            stopped_at = time.monotonic()
            stopper.start()
            time.sleep(1.0)  # the workers have had SIGTERM, also on a loaded machine
            assert not closed_by_server(left_idle, within=0.1)
            answer = raw_review(reused)
            assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" in answer.lower(), answer
            assert closed_by_server(reused, within=1)
            assert closed_by_server(left_idle, within=5)
            idle_closed_after = time.monotonic() - stopped_at
            stopper.join()
    assert 1.8 <= idle_closed_after < 6.0, idle_closed_after
