"""The kubelet plugin's gRPC servers: registration (the kubelet's plugin watcher finds `<driver>-reg.sock` in its
plugins_registry directory and asks GetInfo) and the DRA service on `<plugins dir>/<driver>/dra.sock`, v1 and
v1beta1 (the kubelet uses the newest it knows). The calls are turned into Preparer calls (dradriver/preparer.py);
a claim that cannot be prepared gets its reason in the per-claim `error`, which the kubelet shows on the pod.

A kubelet restart needs nothing from us: its watcher finds the registration socket again and re-registers the
plugin. A restart of this plugin removes its stale sockets and listens anew, and the prepared claims are still on
disk.
"""

from __future__ import annotations

import logging
import os
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from common import names
from dradriver import grpcapi
from dradriver.preparer import Preparer

log = logging.getLogger("dradriver.kubeletplugin")

DEFAULT_REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"


@dataclass(frozen=True)
class Sockets:
    registration: Path
    service: Path

    @classmethod
    def under(cls, registrar_dir: str, plugins_dir: str, driver: str = names.DRA_DRIVER_NAME) -> Sockets:
        return cls(Path(registrar_dir) / f"{driver}-reg.sock", Path(plugins_dir) / driver / "dra.sock")


def _claims_of(request: Any) -> list[tuple[str, str, str]]:
    return [(claim.namespace, claim.uid, claim.name) for claim in request.claims]


class _DraService:
    """NodePrepareResources / NodeUnprepareResources of one API version."""

    def __init__(self, api: grpcapi.Api, preparer: Preparer) -> None:
        self.api = api
        self.preparer = preparer
        self.has_share_id = "share_id" in api.Device.DESCRIPTOR.fields_by_name

    def prepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.api.NodePrepareResourcesResponse()
        for namespace, uid, name in _claims_of(request):
            entry = response.claims[uid]
            try:
                for device in self.preparer.prepare(namespace, uid, name):
                    if not self.has_share_id:
                        device = {key: value for key, value in device.items() if key != "share_id"}
                    entry.devices.add(**device)
            except Exception as error:  # every failure is the claim's, and the plugin keeps serving
                del entry.devices[:]
                entry.error = f"prepare of ResourceClaim {namespace}/{name} failed: {error}"
                log.warning("claim not prepared", extra={"fields": {
                    "namespace": namespace, "claim": name, "claim_uid": uid, "error": str(error)}})
        return response

    def unprepare(self, request: Any, context: grpc.ServicerContext) -> Any:
        response = self.api.NodeUnprepareResourcesResponse()
        for namespace, uid, name in _claims_of(request):
            entry = response.claims[uid]
            try:
                self.preparer.unprepare(namespace, uid, name)
            except Exception as error:
                entry.error = f"unprepare of ResourceClaim {namespace}/{name} failed: {error}"
                log.warning("claim not unprepared", extra={"fields": {
                    "namespace": namespace, "claim": name, "claim_uid": uid, "error": str(error)}})
        return response

    def handler(self) -> grpc.GenericRpcHandler:
        return _handler(self.api, "DRAPlugin", {
            "NodePrepareResources": (self.prepare, "NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
            "NodeUnprepareResources": (self.unprepare, "NodeUnprepareResourcesRequest",
                                       "NodeUnprepareResourcesResponse"),
        })


class _Registration:
    def __init__(self, driver: str, endpoint: Path) -> None:
        self.api = grpcapi.api("registration")
        self.driver = driver
        self.endpoint = endpoint
        self.registered = False
        self.error = ""

    def get_info(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self.api.PluginInfo(type=grpcapi.DRA_PLUGIN_TYPE, name=self.driver, endpoint=str(self.endpoint),
                                   supported_versions=[grpcapi.DRA_V1_SERVICE, grpcapi.DRA_V1BETA1_SERVICE])

    def notify(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.registered, self.error = bool(request.plugin_registered), str(request.error)
        if self.registered:
            log.info("registered with the kubelet", extra={"fields": {"driver": self.driver}})
        else:
            log.error("the kubelet refused the plugin", extra={"fields": {"driver": self.driver, "error": self.error}})
        return self.api.RegistrationStatusResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        return _handler(self.api, "Registration", {
            "GetInfo": (self.get_info, "InfoRequest", "PluginInfo"),
            "NotifyRegistrationStatus": (self.notify, "RegistrationStatus", "RegistrationStatusResponse"),
        })


def _handler(api: grpcapi.Api, service: str, methods: dict[str, tuple[Any, str, str]]) -> grpc.GenericRpcHandler:
    """Unary methods of `service`: name -> (behaviour, request message, response message)."""
    return grpc.method_handlers_generic_handler(api.service(service), {
        name: grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=getattr(api, request).FromString,
            response_serializer=getattr(api, response).SerializeToString)
        for name, (behaviour, request, response) in methods.items()})


# sun_path holds 108 bytes with the terminating NUL; grpc fails a longer path with a RuntimeError naming no limit.
UNIX_SOCKET_PATH_LIMIT = 107


def _listen(handlers: list[grpc.GenericRpcHandler], socket: Path, workers: int) -> grpc.Server:
    if len(os.fsencode(str(socket))) > UNIX_SOCKET_PATH_LIMIT:
        raise OSError(f"socket path {socket} is {len(os.fsencode(str(socket)))} bytes; a unix socket path has at "
                      f"most {UNIX_SOCKET_PATH_LIMIT}: give shorter kubelet plugin directories")
    socket.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.unlink(socket)  # left by an earlier run of this plugin
    except FileNotFoundError:
        pass
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), handlers=handlers)
    if server.add_insecure_port(f"unix://{socket}") == 0:
        raise OSError(f"cannot listen on {socket}")
    server.start()
    return server


class KubeletPlugin:
    """Both servers; `start` serves the DRA service before it registers, so the kubelet never calls a socket that
    is not there yet."""

    def __init__(self, preparer: Preparer, sockets: Sockets, driver: str = names.DRA_DRIVER_NAME,
                 workers: int = 8) -> None:
        self.preparer = preparer
        self.sockets = sockets
        self.driver = driver
        self.workers = workers
        self.registration = _Registration(driver, sockets.service)
        self._servers: list[grpc.Server] = []

    def start(self) -> None:
        services = [_DraService(grpcapi.api("dra-v1"), self.preparer).handler(),
                    _DraService(grpcapi.api("dra-v1beta1"), self.preparer).handler()]
        self._servers.append(_listen(services, self.sockets.service, self.workers))
        self._servers.append(_listen([self.registration.handler()], self.sockets.registration, 2))
        log.info("kubelet plugin serving", extra={"fields": {
            "driver": self.driver, "registration": str(self.sockets.registration),
            "service": str(self.sockets.service)}})

    def stop(self, grace: float = 5.0) -> None:
        # Registration first: the kubelet stops sending calls before the service goes away.
        for server in reversed(self._servers):
            server.stop(grace).wait()
        self._servers.clear()
        for socket in (self.sockets.registration, self.sockets.service):
            try:
                os.unlink(socket)
            except FileNotFoundError:
                pass
