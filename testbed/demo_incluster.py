"""`make demo ARGS=--in-cluster`: the demo with fracgpu installed as an operator installs it.

The same two real nodes as `make demo`, as an operator's cluster (testbed/realnodes/incluster.py: workload
controllers, the default kube-scheduler, cluster DNS, fracgpu's images built from the Dockerfile in every node's
containerd); then `helm install` of charts/fracgpu with hamicore and the stock-scheduler component on, into
fracgpu-system. Every program is a pod of that release: the webhook pods mutate, the stock kube-scheduler pod and its
extender sidecar place, the binder pod reserves (reservation pods from the fracgpu image) and binds. The demo then
creates the same three pods as `make demo` and prints the same table.
"""

from __future__ import annotations

import time

from testbed.cluster.kube import KubeSession, http_session, wait_for
from testbed.demo import DEMO_NAMESPACE, GPU_MEMORY_MIB, NODES, Demo, ensure, say
from testbed.programs.local_deploy import RESERVATION
from testbed.realnodes.cluster import RealCluster
from testbed.realnodes.host import RealNodesUnavailable, check_machine
from testbed.realnodes.release import SYSTEM, helm, helm_install_args, pods_of, wait_live


class InClusterDemo(Demo):
    def start_control_plane(self) -> KubeSession:
        started = time.monotonic()
        try:
            check_machine()
        except RealNodesUnavailable as error:
            raise RuntimeError(f"{error}\n  (the in-cluster demo needs real nodes)") from None
        say(f"starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and {len(NODES)} "
            "real nodes as an operator's cluster (fracgpu's images in every node's containerd)")
        self.cluster = RealCluster(node_names=list(NODES), gpus_per_node=4, gpu_memory_mib=GPU_MEMORY_MIB,
                                   workdir=self.workdir / "cluster", in_cluster=True)
        self.cluster.start()
        self.control_plane = self.cluster.plane
        say(f"cluster ready at {self.control_plane.url} in {time.monotonic() - started:.1f}s")
        self.session = http_session(self.control_plane)
        return self.session

    def install(self, session: KubeSession) -> None:
        assert self.cluster is not None
        started = time.monotonic()
        ensure(session, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM}})
        args = helm_install_args("install")
        say(f"helm {' '.join(args)} --take-ownership")
        helm(self.cluster, *args, "--take-ownership")
        try:
            wait_live(session)
        except AssertionError as error:
            raise RuntimeError(f"the release did not come up: {error}") from None
        for component in ("fracgpu-admission", "fracgpu-binder", "fracgpu-scheduler"):
            placed = ", ".join(f"{p['metadata']['name']} on {p['spec'].get('nodeName')}"
                               for p in pods_of(session, component))
            say(f"  {component}: {placed}")
        say(f"every Deployment rolled out, the certificate Job complete, the webhooks registered "
            f"({time.monotonic() - started:.1f}s after helm install)")
        ensure(session, "/api/v1/namespaces",
               {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEMO_NAMESPACE}})

    def run(self) -> int:
        session = self.start_control_plane()
        self.create_nodes(session)
        self.install(session)
        return self.submit_and_show(session)

    def stop(self) -> None:
        """Stop every pod first, so the nodes stop with nothing running (no process left in their cgroups)."""
        if self.session is not None and self.cluster is not None:
            say("deleting the release's Deployments and every pod, then stopping the nodes")
            try:
                for collection in ("apis/apps/v1/namespaces/{ns}/deployments", "apis/batch/v1/namespaces/{ns}/jobs",
                                   "apis/batch/v1/namespaces/{ns}/cronjobs"):
                    self.session.delete(f"/{collection.format(ns=SYSTEM)}", params={"propagationPolicy": "Foreground"},
                                        timeout=30)
                namespaces = (SYSTEM, DEMO_NAMESPACE, RESERVATION)
                for namespace in namespaces:
                    self.session.delete(f"/api/v1/namespaces/{namespace}/pods", params={"gracePeriodSeconds": "0"},
                                        timeout=30)
                wait_for("every pod stopped", lambda: not any(
                    self.session.get(f"/api/v1/namespaces/{ns}/pods", timeout=30).json().get("items")
                    for ns in namespaces), timeout=60, interval=0.5)
            except Exception as error:  # noqa: BLE001 - the nodes' own stop still cleans up
                say(f"could not stop every pod first ({error}); the nodes' stop kills what is left")
        super().stop()
