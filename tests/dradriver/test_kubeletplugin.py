"""The kubelet plugin's gRPC servers, called over their unix sockets the way the kubelet calls them: registration's
GetInfo, then NodePrepareResources / NodeUnprepareResources in v1 and v1beta1; a claim that cannot be prepared gets
its reason and the others are prepared; a restarted plugin takes over its stale sockets and keeps its claims."""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest

from dradriver import grpcapi
from dradriver.devices import Gpu
from dradriver.kubeletplugin import KubeletPlugin, Sockets
from dradriver.preparer import Preparer

GPUS = [Gpu(0, "GPU-aaaa", "NVIDIA A100", 40960)]


def _claim(uid: str, name: str) -> dict:
    return {"metadata": {"namespace": "team", "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"driver": "gpu.fracgpu.io", "pool": "n1", "device": "gpu-0", "request": "gpu", "shareID": f"s-{uid}",
                 "consumedCapacity": {"memory": "20Gi"}}]}}}}


@pytest.fixture
def plugin(tmp_path: Path):
    claims = {("team", "c1"): _claim("u1", "c1"), ("team", "c2"): _claim("u2", "c2")}
    started: list[KubeletPlugin] = []

    def start() -> KubeletPlugin:
        preparer = Preparer(pool="n1", read_claim=lambda ns, name: claims.get((ns, name)), gpus=lambda: GPUS,
                            cdi_dir=str(tmp_path / "cdi"), nvidia_devices=set)
        # unix socket paths are limited to 107 bytes: keep them short
        sockets = Sockets.under(str(tmp_path / "reg"), str(tmp_path / "p"))
        instance = KubeletPlugin(preparer, sockets)
        instance.start()
        started.append(instance)
        return instance

    yield start, claims
    for instance in started:
        instance.stop(0)


def _call(address: Path, service: str, method: str, request, response_type):
    with grpc.insecure_channel(f"unix://{address}") as channel:
        call = channel.unary_unary(f"/{service}/{method}", request_serializer=type(request).SerializeToString,
                                   response_deserializer=response_type.FromString)
        return call(request, timeout=5)


def test_registration_names_the_driver_its_socket_and_both_versions(plugin) -> None:
    start, _ = plugin
    instance = start()
    reg = grpcapi.api("registration")
    info = _call(instance.sockets.registration, "pluginregistration.Registration", "GetInfo", reg.InfoRequest(),
                 reg.PluginInfo)
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", "gpu.fracgpu.io", str(instance.sockets.service))
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    _call(instance.sockets.registration, "pluginregistration.Registration", "NotifyRegistrationStatus",
          reg.RegistrationStatus(plugin_registered=True), reg.RegistrationStatusResponse)
    assert instance.registration.registered


@pytest.mark.parametrize("version", ["dra-v1", "dra-v1beta1"])
def test_prepare_answers_each_claim_and_a_bad_one_with_its_reason(plugin, version: str) -> None:
    start, _ = plugin
    instance = start()
    api = grpcapi.api(version)
    request = api.NodePrepareResourcesRequest(claims=[api.Claim(namespace="team", uid="u1", name="c1"),
                                                      api.Claim(namespace="team", uid="u9", name="gone")])
    response = _call(instance.sockets.service, api.service("DRAPlugin"), "NodePrepareResources", request,
                     api.NodePrepareResourcesResponse)
    good, bad = response.claims["u1"], response.claims["u9"]
    assert good.error == ""
    device = good.devices[0]
    assert (list(device.request_names), device.pool_name, device.device_name, list(device.cdi_device_ids)) == (
        ["gpu"], "n1", "gpu-0", ["fracgpu.io/claim=u1-gpu"])
    if version == "dra-v1":
        assert device.share_id == "s-u1"
    assert bad.error == "prepare of ResourceClaim team/gone failed: ResourceClaim team/gone not found"
    assert not bad.devices


def test_a_restarted_plugin_takes_its_sockets_back_and_keeps_prepared_claims(plugin, tmp_path: Path) -> None:
    start, claims = plugin
    api = grpcapi.api("dra-v1")
    first = start()
    one = api.NodePrepareResourcesRequest(claims=[api.Claim(namespace="team", uid="u1", name="c1")])
    before = _call(first.sockets.service, api.service("DRAPlugin"), "NodePrepareResources", one,
                   api.NodePrepareResourcesResponse)
    for server in first._servers:
        server.stop(0).wait()
    first._servers.clear()
    for path in (first.sockets.service, first.sockets.registration):  # a killed process leaves its sockets
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(path))
        stale.close()
        assert path.exists()
    claims.clear()
    second = start()
    after = _call(second.sockets.service, api.service("DRAPlugin"), "NodePrepareResources", one,
                  api.NodePrepareResourcesResponse)
    assert after == before
    unprepare = api.NodeUnprepareResourcesRequest(claims=[api.Claim(namespace="team", uid="u1", name="c1")])
    for _ in range(2):
        answer = _call(second.sockets.service, api.service("DRAPlugin"), "NodeUnprepareResources", unprepare,
                       api.NodeUnprepareResourcesResponse)
        assert answer.claims["u1"].error == ""
    assert list((tmp_path / "cdi").iterdir()) == []


def test_a_socket_path_too_long_for_unix_sockets_is_refused_naming_the_limit(tmp_path: Path) -> None:
    """grpc itself fails such a path with a RuntimeError that names no limit; the driver says what to change."""
    preparer = Preparer(pool="n1", read_claim=lambda ns, name: None, gpus=lambda: GPUS,
                        cdi_dir=str(tmp_path / "cdi"), nvidia_devices=set)
    deep = tmp_path / ("d" * 120)
    instance = KubeletPlugin(preparer, Sockets.under(str(deep / "reg"), str(deep / "p")))
    with pytest.raises(OSError, match="a unix socket path has at most 107: give shorter kubelet plugin directories"):
        instance.start()
    assert not deep.exists()  # refused before anything was made
