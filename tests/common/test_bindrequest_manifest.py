"""The one BindRequest writer (common/bindrequest.manifest) that the extender, the scheduler simulator and the demo
share: KAI's shape, with each scheduler version's difference a named parameter."""

from common import bindrequest, names

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}


def test_fraction_as_kai_v018_writes_it_with_both_group_fields() -> None:
    body = bindrequest.manifest(POD, "n1", groups=["g1", "g2"], portion=0.5,
                                compute_sharing_mode=names.COMPUTE_TIME_SLICING)
    assert body["metadata"] == {"name": "p", "namespace": "ns", "labels": {"selected-node": "n1"},
                                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-1"}]}
    spec = body["spec"]
    assert spec["receivedResourceType"] == names.RECEIVED_TYPE_FRACTION
    assert spec["receivedGPU"] == {"count": 2, "portion": "0.50"}
    assert spec["selectedGPUGroups"] == ["g1", "g2"]
    assert bindrequest.selected_gpu_groups(body) == ["g1", "g2"]
    assert "backoffLimit" not in spec


def test_v017_writers_leave_the_typed_groups_out_and_regular_binds_without_a_count() -> None:
    old = bindrequest.manifest(POD, "n1", groups=["g1"], portion=0.1, typed_groups=False)
    assert "selectedFractionalGpuGroups" not in old["spec"] and old["spec"]["receivedGPU"]["portion"] == "0.10"
    assert bindrequest.manifest(POD, "n1")["spec"] == {"podName": "p", "selectedNode": "n1",
                                                       "receivedResourceType": names.RECEIVED_TYPE_REGULAR}
    assert bindrequest.manifest(POD, "n1", whole_gpus=2)["spec"]["receivedGPU"] == {"count": 2, "portion": "1.00"}
