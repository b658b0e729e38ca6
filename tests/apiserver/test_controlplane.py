"""The test bed itself: a real kube-apiserver + etcd, and the fixtures built on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed.cluster.binaries import K8S_VERSION, RELEASE, BinariesMissingError
from testbed.cluster.controlplane import ControlPlane, ControlPlaneError
from testbed.cluster.kube import (
    GPU_MEMORY_LABEL,
    GPU_RESOURCE,
    apply_crds,
    create_namespace,
    delete_namespace,
    set_pod_running,
)

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.testbed.fracgpu.io
spec:
  group: testbed.fracgpu.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer, minimum: 1}
"""


def _eventually(what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _pod(name: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_missing_binaries_fail_loudly(tmp_path: Path) -> None:
    plane = ControlPlane(binaries=tmp_path / "no-binaries-here")
    with pytest.raises(BinariesMissingError, match="build-k8s.sh"):
        plane.start()


@pytest.mark.apiserver
def test_startup_failure_raises_with_log_tails_and_cleans_up(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path, extra_apiserver_args=["--no-such-flag=1"], start_timeout=60)
    with pytest.raises(ControlPlaneError) as excinfo:
        plane.start()
    message = str(excinfo.value)
    assert "kube-apiserver exited" in message
    assert "unknown flag: --no-such-flag" in message  # the apiserver's own log, quoted
    assert "etcd.log" in message
    assert plane._procs == []  # etcd was stopped too


@pytest.mark.apiserver
def test_apiserver_is_ready_and_is_the_chosen_version(kube_session: Any) -> None:
    assert kube_session.get("/readyz").status_code == 200
    version = kube_session.get("/version").json()
    assert version["gitVersion"] == K8S_VERSION  # FRACGPU_K8S_VERSION, or the default row of tools/k8s/versions.tsv
    assert (version["major"], version["minor"]) == ("1", str(RELEASE.minor))
    default = kube_session.get("/api/v1/namespaces/default").json()
    assert default["status"]["phase"] == "Active"


@pytest.mark.apiserver
def test_anonymous_and_bad_tokens_are_rejected(control_plane: ControlPlane, kube_session: Any) -> None:
    session = type(kube_session)(control_plane.url)
    session.verify = str(control_plane.ca_file)
    assert session.get("/api/v1/namespaces").status_code == 403  # anonymous: authenticated, not allowed
    session.headers["Authorization"] = "Bearer not-a-token"
    assert session.get("/api/v1/namespaces").status_code == 401


@pytest.mark.apiserver
def test_namespace_create_and_delete_with_contents(kube_admin: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_admin)
    name = create_namespace(kube_admin, prefix="life")
    assert name.startswith("life-")
    assert core.read_namespace(name).status.phase == "Active"
    core.create_namespaced_config_map(name, {"metadata": {"name": "cm"}, "data": {"k": "v"}})
    core.create_namespaced_pod(name, _pod("p", node="nowhere"))

    delete_namespace(kube_admin, name)

    with pytest.raises(ApiException) as excinfo:
        core.read_namespace(name)
    assert excinfo.value.status == 404
    selector = f"metadata.namespace={name}"
    assert core.list_config_map_for_all_namespaces(field_selector=selector).items == []
    assert core.list_pod_for_all_namespaces(field_selector=selector).items == []


@pytest.mark.apiserver
def test_a_namespace_deleted_while_a_controller_keeps_creating_pods_leaves_no_pod_behind(
        kube_admin: client.ApiClient) -> None:
    """A ReplicaSet recreating its pods while delete_namespace runs: once the namespace is gone, so are they. Pods
    left in a namespace that no longer exists can never be reported gone by a real kubelet (its status patch is
    refused), and stay Terminating on the node for good; a drain of that node then never ends."""
    core = client.CoreV1Api(kube_admin)
    name = create_namespace(kube_admin, prefix="racing")
    stopping = threading.Event()
    created = []

    def replicaset() -> None:
        while not stopping.is_set():
            try:
                created.append(core.create_namespaced_pod(name, {**_pod("", node="nowhere"), "metadata": {
                    "generateName": "web-"}}).metadata.name)
            except ApiException:
                time.sleep(0.005)  # forbidden while the namespace terminates, not found once it is gone

    creator = threading.Thread(target=replicaset, daemon=True)
    creator.start()
    try:
        time.sleep(0.2)
        delete_namespace(kube_admin, name)
    finally:
        stopping.set()
        creator.join(10)
    assert created
    assert core.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={name}").items == []


@pytest.mark.apiserver
def test_namespace_fixture_gives_a_fresh_namespace(kube_admin: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_admin)
    assert core.read_namespace(namespace).status.phase == "Active"
    assert core.list_namespaced_config_map(namespace).items == []


@pytest.mark.apiserver
def test_fake_gpu_node_has_capacity_labels_and_ready(
    kube_admin: client.ApiClient, make_gpu_node: Callable[..., dict[str, Any]]
) -> None:
    created = make_gpu_node(gpus=4, gpu_memory_mib=81920, cpu="32", memory="256Gi")
    node = client.CoreV1Api(kube_admin).read_node(created["metadata"]["name"])
    for resources in (node.status.capacity, node.status.allocatable):
        assert resources[GPU_RESOURCE] == "4"
        assert resources["cpu"] == "32"
        assert resources["memory"] == "256Gi"
        assert resources["pods"] == "110"
    assert node.metadata.labels[GPU_MEMORY_LABEL] == "81920"
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert len(ready) == 1 and ready[0].status == "True"
    assert not node.spec.taints  # TaintNodesByCondition is off and there is no node controller


@pytest.mark.apiserver
def test_pod_can_be_set_running(
    kube_admin: client.ApiClient, namespace: str, make_gpu_node: Callable[..., dict[str, Any]]
) -> None:
    node = make_gpu_node()["metadata"]["name"]
    core = client.CoreV1Api(kube_admin)
    core.create_namespaced_pod(namespace, _pod("worker", node=node))
    assert core.read_namespaced_pod("worker", namespace).status.phase == "Pending"

    set_pod_running(kube_admin, namespace, "worker")

    pod = core.read_namespaced_pod("worker", namespace)
    assert pod.status.phase == "Running"
    assert pod.spec.node_name == node
    assert pod.status.pod_ip
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
    assert pod.status.container_statuses[0].state.running is not None


@pytest.mark.apiserver
def test_crd_is_applied_established_and_served(kube_admin: client.ApiClient, namespace: str) -> None:
    assert apply_crds(kube_admin, WIDGET_CRD) == ["widgets.testbed.fracgpu.io"]
    assert apply_crds(kube_admin, WIDGET_CRD) == ["widgets.testbed.fracgpu.io"]  # idempotent update
    custom = client.CustomObjectsApi(kube_admin)
    widget = {"apiVersion": "testbed.fracgpu.io/v1", "kind": "Widget",
              "metadata": {"name": "w"}, "spec": {"size": 3}}
    custom.create_namespaced_custom_object("testbed.fracgpu.io", "v1", namespace, "widgets", widget)
    stored = custom.get_namespaced_custom_object("testbed.fracgpu.io", "v1", namespace, "widgets", "w")
    assert stored["spec"] == {"size": 3}
    bad = dict(widget, metadata={"name": "bad"}, spec={"size": 0})
    with pytest.raises(ApiException) as excinfo:  # the schema is enforced, so the CRD is real
        custom.create_namespaced_custom_object("testbed.fracgpu.io", "v1", namespace, "widgets", bad)
    assert excinfo.value.status == 422


@pytest.mark.apiserver
def test_service_account_identity_from_token_and_from_client_cert(
    control_plane: ControlPlane, service_account_client: Callable[[str, str], client.ApiClient]
) -> None:
    for ns, sa in (("testbed", "tester"), ("late-ns", "declared-after-start")):
        user = control_plane.service_account(ns, sa)
        assert (user.token is not None) == (ns == "testbed")
        review = client.AuthenticationV1Api(service_account_client(ns, sa)).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        info = review.status.user_info
        assert info.username == f"system:serviceaccount:{ns}:{sa}"
        assert {"system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"} <= set(
            info.groups)


@pytest.mark.apiserver
def test_rbac_forbids_secrets_until_a_rolebinding_allows_them(
    kube_admin: client.ApiClient, namespace: str,
    service_account_client: Callable[[str, str], client.ApiClient],
) -> None:
    as_tester = client.CoreV1Api(service_account_client("testbed", "tester"))
    for call in (as_tester.list_secret_for_all_namespaces, lambda: as_tester.list_namespaced_secret(namespace)):
        with pytest.raises(ApiException) as excinfo:
            call()
        assert excinfo.value.status == 403

    rbac = client.RbacAuthorizationV1Api(kube_admin)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "secret-reader"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "tester-reads-secrets"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secret-reader"},
        "subjects": [{"kind": "ServiceAccount", "namespace": "testbed", "name": "tester"}]})

    def allowed() -> bool:
        try:
            as_tester.list_namespaced_secret(namespace)
        except ApiException as exc:
            assert exc.status == 403
            return False
        return True

    _eventually("the RoleBinding to take effect", allowed)
    with pytest.raises(ApiException) as excinfo:  # still namespace-scoped only
        as_tester.list_secret_for_all_namespaces()
    assert excinfo.value.status == 403


@pytest.mark.apiserver
def test_garbage_collector_deletes_configmap_owned_by_deleted_pod(
    garbage_collector: ControlPlane, kube_admin: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_admin)
    pod = core.create_namespaced_pod(namespace, _pod("owner", node="nowhere"))
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": pod.metadata.uid}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "owned", "ownerReferences": [owner]}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "unowned"}})

    core.delete_namespaced_pod("owner", namespace, grace_period_seconds=0)

    def owned_gone() -> bool:
        names = {cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items}
        return "owned" not in names

    _eventually("the garbage collector to delete the owned ConfigMap", owned_gone, timeout=90)
    assert core.read_namespaced_config_map("unowned", namespace).metadata.name == "unowned"
