"""Why the binder is not ready, on the real apiserver: /readyz, the log and fracgpu_binder_informer_synced name
the informer that waits and its cause (missing RBAC, a resource the API server does not serve)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from binder.app import BinderApp
from binder.settings import parse_settings
from common.kube.cache import Informer
from common.kube.client import KubeClient
from testbed.cluster.kube import wait_for
from testbed.programs.procs import free_ports

pytestmark = pytest.mark.apiserver


def informer_gauges(text: str) -> dict[str, str]:
    return {line.split('"')[1]: line.rsplit(" ", 1)[1] for line in text.splitlines()
            if line.startswith("fracgpu_binder_informer_synced{")}


def test_a_binder_without_rbac_says_which_informer_cannot_list_what(control_plane: Any, crds: str,
                                                                     tmp_path: Path) -> None:
    nobody = control_plane.client_cert_user("fracgpu-test-no-rbac")
    kubeconfig = control_plane.write_kubeconfig(tmp_path / "nobody.kubeconfig", nobody)
    health, metrics = free_ports(2)
    settings = parse_settings(["--kubeconfig", str(kubeconfig), f"--health-probe-bind-address=127.0.0.1:{health}",
                               f"--metrics-bind-address=127.0.0.1:{metrics}"])
    client = KubeClient.from_kubeconfig(str(kubeconfig), qps=0, burst=1)
    app = BinderApp(settings, client)
    starting = threading.Thread(target=app.start, daemon=True)
    starting.start()
    try:
        def forbidden_readyz() -> list[requests.Response]:  # a 503 Response is falsy: wrap it
            try:
                answer = requests.get(f"http://127.0.0.1:{health}/readyz", timeout=5)
            except requests.ConnectionError:
                return []  # app.start runs on its own thread: the probe server may not listen yet
            # Each informer makes its first list on its own: wait until all three have been refused.
            refused = all(f"RBAC: cannot list {what}" in answer.text for what in ("pods", "nodes", "bindrequests"))
            return [answer] if refused else []

        (answer,) = wait_for("/readyz naming the missing RBAC", forbidden_readyz, interval=0.2)
        assert answer.status_code == 503
        assert answer.text.startswith("caches not synced: ")
        assert "403 Forbidden on list /api/v1/pods" in answer.text
        assert 'User \\"fracgpu-test-no-rbac\\"' in answer.text or '"fracgpu-test-no-rbac"' in answer.text
        exposition = requests.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5).text
        assert informer_gauges(exposition) == {"pods": "0.0", "nodes": "0.0", "bindrequests": "0.0"}
    finally:
        app.stop_event_loop()
        starting.join(10)
        app.shutdown()
        client.close()
    assert not starting.is_alive()


def test_synced_informers_are_reported_as_such(control_plane: Any, crds: str) -> None:
    client = KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig), qps=0, burst=1)
    app = BinderApp(parse_settings(["--health-probe-bind-address=0", "--metrics-bind-address=0"]), client)
    try:
        app.caches.start()
        assert app.caches.wait_synced(30)
        assert app.ready() == (True, "ok")
        assert informer_gauges(app.metrics.exposition().decode()) == {
            "pods": "1.0", "nodes": "1.0", "bindrequests": "1.0"}
    finally:
        app.caches.stop()
        client.close()


def test_an_informer_on_a_resource_nobody_serves_asks_whether_the_crd_is_installed(
        control_plane: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kube.cache")
    client = KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig), qps=0, burst=1)
    informer = Informer(client, "/apis/nothere.fracgpu.example/v1/widgets", "widgets")
    informer.start()
    try:
        wait_for("the informer to say what is wrong", lambda: informer.problem, interval=0.2)
        assert not informer.synced
        problem = informer.sync_problem()
        assert problem.startswith("404 ") and problem.endswith(
            " on list /apis/nothere.fracgpu.example/v1/widgets: is the CRD installed?")
        logged = wait_for("the CRD hint in the log", lambda: [r for r in caplog.records
                                                      if "is the CRD installed?" in r.getMessage()], interval=0.2)
        assert logged[0].getMessage().startswith(f"informer widgets: {problem}")
        assert logged[0].fields["informer"] == "widgets" and logged[0].fields["code"] == 404
    finally:
        informer.stop()
        client.close()
