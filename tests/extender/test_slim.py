"""The extender caches every pod of the cluster slimmed to what it reads: the ledger must see the same."""

from extender.app import slim_gpu_pod
from extender.ledger import Ledger
from tests.extender.ledger_kit import fraction_pod, node, reservation_pod


def whole_pod(name, node_name, gpus):
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "labels": {"app": "x"},
                         "annotations": {"note": "y"}, "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": node_name, "initContainers": [{"name": "i", "image": "busybox"}],
                     "containers": [{"name": "c", "image": "cuda", "env": [{"name": "A", "value": "1"}],
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus), "memory": "1Gi"}}}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_ledger_of_slimmed_pods_sees_what_a_ledger_of_whole_pods_sees():
    pods = [reservation_pod("a", "n1"), fraction_pod("f1", "n1", ["a"]),
            fraction_pod("m1", "n1", ["b"], annotations={"gpu-memory": "10240"}),
            fraction_pod("multi", "n1", ["c", "d"],
                         annotations={"gpu-fraction": "0.3", "gpu-fraction-num-devices": "2"}),
            whole_pod("w", "n1", 2), fraction_pod("done", "n1", ["a"], phase="Succeeded")]
    full, slim = Ledger(), Ledger()
    for ledger, convert in ((full, lambda pod: pod), (slim, slim_gpu_pod)):
        ledger.upsert_node(node("n1", gpus=8))
        for pod in pods:
            ledger.upsert_pod(convert(pod))
    assert slim.view("n1") == full.view("n1")
    assert slim.view("n1").groups == {"a": 50, "b": 25, "c": 30, "d": 30} and slim.view("n1").whole_in_use == 2
    kept = slim_gpu_pod(whole_pod("w", "n1", 2))
    # A GPU pod keeps its labels: a PodDisruptionBudget that covers it as a victim is found by them.
    assert "managedFields" not in kept["metadata"] and kept["metadata"]["labels"] == {"app": "x"}
    assert kept["spec"]["containers"] == [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]
    plain = whole_pod("p", "n1", 1)
    plain["spec"]["containers"][0]["resources"] = {"limits": {"memory": "1Gi"}}
    plain["spec"]["priority"] = 5
    plain["status"]["nominatedNodeName"] = "n2"
    kept = slim_gpu_pod(plain)
    assert kept["metadata"]["labels"] == {} and kept["spec"]["priority"] == 5
    assert kept["status"] == {"phase": "Running", "nominatedNodeName": "n2"}


def test_gpus_of_sidecar_init_containers_count_beside_the_containers_slimmed_or_not():
    """A sidecar (an init container with restartPolicy Always) keeps running beside the containers, so its GPUs add
    to theirs, as the kube-scheduler counts them; an ordinary init container's GPUs are reused by the containers."""
    pod = whole_pod("s", "n1", 1)
    pod["spec"]["initContainers"] = [
        {"name": "sidecar", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "setup", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
    for convert in (lambda pod: pod, slim_gpu_pod):
        ledger = Ledger()
        ledger.upsert_node(node("n1", gpus=8))
        ledger.upsert_pod(convert(pod))
        # containers 1 + sidecar 1 = 2 running together; setup ran with the sidecar: 2 + 1 = 3 at its peak
        assert ledger.view("n1").whole_in_use == 3
    pod["spec"]["initContainers"][1]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    for convert in (lambda pod: pod, slim_gpu_pod):
        ledger = Ledger()
        ledger.upsert_node(node("n1", gpus=8))
        ledger.upsert_pod(convert(pod))
        assert ledger.view("n1").whole_in_use == 2
