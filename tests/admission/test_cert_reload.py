"""Serving certificate rotation: files replaced under load, no request fails, the new one is served."""

import socket
import ssl
import threading
import time

import requests
from cryptography import x509

from certs.pki import generate_directory
from testbed.programs.webhook import AdmissionProcess

REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "r", "operation": "CREATE", "namespace": "ns",
                      "object": {"metadata": {"name": "p", "annotations": {"gpu-fraction": "0.5"}},
                                 "spec": {"schedulerName": "kai-scheduler", "containers": [{"name": "c"}]}}}}


def served_serial(port: int, ca_file: str) -> int:
    context = ssl.create_default_context(cafile=ca_file)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def test_certificate_files_replaced_under_keep_alive_load(tmp_path):
    with AdmissionProcess(tmp_path, workers=2) as webhook:
        before = served_serial(webhook.port, webhook.ca_file)
        failures: list[str] = []
        counts = [0] * 6
        stop = threading.Event()

        def client(index: int) -> None:
            with requests.Session() as http:
                http.trust_env = False
                http.verify = webhook.ca_file
                while not stop.is_set():
                    try:
                        if index % 2:  # half the clients reconnect each time, the others keep alive
                            http.close()
                        answer = http.post(f"{webhook.url}/mutate--v1-pod", json=REVIEW, timeout=10)
                        if answer.status_code != 200 or not answer.json()["response"]["allowed"]:
                            failures.append(answer.text)
                    except requests.RequestException as error:
                        failures.append(repr(error))
                    counts[index] += 1

        threads = [threading.Thread(target=client, args=(index,)) for index in range(len(counts))]
        for thread in threads:
            thread.start()
        serials = []
        for _ in range(4):
            time.sleep(0.7)
            _, serving = generate_directory(str(webhook.cert_dir), ["127.0.0.1", "localhost"])
            serials.append(serving.certificate.serial_number)
        time.sleep(1.5)  # the server re-checks the files at most once a second
        stop.set()
        for thread in threads:
            thread.join()
        after = served_serial(webhook.port, webhook.ca_file)

    assert failures == []
    assert min(counts) > 5, counts
    assert after != before and after == serials[-1]
