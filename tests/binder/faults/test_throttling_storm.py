"""S9: API Priority and Fairness and an overloaded apiserver: 429 and 503 storms on every kind of request.

One leader-elected replica reaches the apiserver through testbed/proxies/flakyproxy.py. For 10 s a seeded 20 % of all
its requests (lease, watches, lists, writes) are answered 429 with `Retry-After: 1`, then for 10 s 10 % are
answered 503 with `Retry-After: 1`, 25 BindRequests arriving in each storm. Both answers say the request was not
carried out, so the binder may repeat any of them. No attempt may be burnt on them: 0 BindRequests Failed (the
scheduler simulator records every one it replaces), no lease lost (one process incarnation), every pod bound,
and 0 violations.
"""

from __future__ import annotations

import time

import pytest
from binder_e2e_kit import make_pod
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations, wait_all_bound

from testbed.cluster.kube import wait_for
from testbed.proxies.flakyproxy import FlakyProxy

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


@pytest.mark.parametrize("world", [2], indirect=True)
def test_429_and_503_storms_burn_no_attempt(world: World) -> None:
    proxy = FlakyProxy(world.plane.url, world.plane.ca_file, world.plane.admin.token, seed=world.sim.seed).start()
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=1,
                        kubeconfigs=[proxy.write_kubeconfig(world.workdir / "proxy.kubeconfig")],
                        extra=("--leader-elect", "--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT)))
    replicas.start()
    pods: list[str] = []
    storm429 = 0
    try:
        wait_for("the leader", lambda: replicas.holder(world.client), timeout=60)
        with world.sim:
            for share, status, first in ((0.2, 429, 0), (0.1, 503, 25)):
                proxy.clear()
                proxy.flake("[A-Z]+", ".", share, status, {"Retry-After": "1"})
                for i in range(first, first + 25):  # 25 BindRequests over the first 5 s of each 10 s storm
                    pod = make_pod(world.client, world.namespace, f"q{i}", fraction="0.5" if i % 2 else None)
                    world.sim.submit(pod, world.nodes[i % 2])
                    pods.append(f"q{i}")
                    time.sleep(0.2)
                time.sleep(5)
                storm429 = proxy.injected if status == 429 else storm429
            proxy.clear()
            took = wait_all_bound(world.client, world.namespace, pods, timeout=60)
        print(f"storms: {storm429} answers 429 and {proxy.injected - storm429} answers 503 injected; all bound "
              f"{took:.1f} s after; failed BindRequests {world.sim.failures}; incarnations "
              f"{replicas.replicas[0].incarnations}")
        assert world.sim.failures == []
        assert replicas.replicas[0].incarnations == 1, "the leader lost its lease"
    finally:
        replicas.stop()
        proxy.stop()
    assert violations(world.client, world.plane, world.scene(binder_logs=replicas.logs)) == []
