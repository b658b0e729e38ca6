"""The descriptors dradriver/grpcapi.py builds by hand are the kubelet's own: the .proto files of k8s.io/kubelet
(for the test bed's Kubernetes version, from the Go module cache the build used) are compiled with protoc and
compared message by message, field by field, service by service. A message round-trips through both."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from dradriver import grpcapi
from testbed.cluster.binaries import K8S_VERSION
from testbed.cluster.features import module_source


def _kubelet_module() -> Path:
    return module_source(K8S_VERSION).parent / f"kubelet@v0{K8S_VERSION[2:]}"


def _compiled(proto: str, tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    root = _kubelet_module()
    out = tmp_path / "set.pb"
    assert (root / proto).is_file(), f"{root / proto} is missing: `make k8s-binaries` downloads k8s.io/kubelet"
    assert protoc.main(["protoc", f"-I{root}", f"--descriptor_set_out={out}", str(root / proto)]) == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return files.file[0]


def _shape(file: descriptor_pb2.FileDescriptorProto) -> dict:
    def message(m: descriptor_pb2.DescriptorProto) -> dict:
        return {
            "fields": sorted((f.name, f.number, f.type, f.label, f.type_name.rsplit(".", 1)[-1], f.proto3_optional)
                             for f in m.field),
            "nested": {n.name: message(n) | {"map_entry": n.options.map_entry} for n in m.nested_type},
            "oneofs": sorted(o.name for o in m.oneof_decl),
        }

    return {
        "package": file.package,
        "messages": {m.name: message(m) for m in file.message_type},
        "services": {s.name: sorted((x.name, x.input_type, x.output_type) for x in s.method) for s in file.service},
    }


@pytest.mark.parametrize(("proto", "built"), [
    ("pkg/apis/pluginregistration/v1/api.proto", grpcapi.registration_file),
    ("pkg/apis/dra/v1/api.proto", lambda: grpcapi.dra_file(grpcapi.DRA_V1_PACKAGE)),
    ("pkg/apis/dra/v1beta1/api.proto", lambda: grpcapi.dra_file(grpcapi.DRA_V1BETA1_PACKAGE)),
])
def test_descriptors_are_the_kubelets(proto: str, built, tmp_path: Path) -> None:
    assert _shape(built()) == _shape(_compiled(proto, tmp_path))


def test_service_names_are_the_kubelets_constants() -> None:
    types = (_kubelet_module() / "pkg/apis/dra/v1/types.go").read_text()
    assert f'DRAPluginService = "{grpcapi.DRA_V1_SERVICE}"' in types
    beta = (_kubelet_module() / "pkg/apis/dra/v1beta1/types.go").read_text()
    assert f'DRAPluginService = "{grpcapi.DRA_V1BETA1_SERVICE}"' in beta
    constants = (_kubelet_module() / "pkg/apis/pluginregistration/v1/constants.go").read_text()
    assert f'DRAPlugin = "{grpcapi.DRA_PLUGIN_TYPE}"' in constants


def test_a_response_round_trips_with_share_id_present_only_when_set() -> None:
    api = grpcapi.api("dra-v1")
    response = api.NodePrepareResourcesResponse()
    response.claims["uid-1"].devices.add(request_names=["gpu"], pool_name="n1", device_name="gpu-0",
                                         cdi_device_ids=["fracgpu.io/claim=uid-1-gpu"], share_id="s1")
    response.claims["uid-2"].error = "no"
    again = api.NodePrepareResourcesResponse.FromString(response.SerializeToString())
    device = again.claims["uid-1"].devices[0]
    assert (device.share_id, device.HasField("share_id")) == ("s1", True)
    assert again.claims["uid-2"].error == "no"
    assert not api.Device(pool_name="n1").HasField("share_id")
