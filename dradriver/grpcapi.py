"""The kubelet's gRPC APIs a DRA plugin serves, as protobuf messages built at run time: plugin registration
(`pluginregistration.Registration`) and the DRA service (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, and v1beta1
for kubelets before v1.34).

The messages are described here field by field, as the kubelet's .proto files (k8s.io/kubelet
pkg/apis/pluginregistration/v1/api.proto, pkg/apis/dra/v1*/api.proto) declare them, so the image needs only the
protobuf and grpcio runtimes, no protoc and no generated code. tests/dradriver/test_grpcapi.py compiles the
kubelet's own .proto files and compares them with these descriptors field by field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_BOOL = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
_MESSAGE = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
_OPTIONAL = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
_REPEATED = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED

REGISTRATION_PACKAGE = "pluginregistration"
DRA_V1_PACKAGE = "k8s.io.kubelet.pkg.apis.dra.v1"
DRA_V1BETA1_PACKAGE = "k8s.io.kubelet.pkg.apis.dra.v1beta1"
# What the plugin lists in PluginInfo.supported_versions: "<last package element>.<service>" (the kubelet's
# drapb*.DRAPluginService constants); the kubelet picks the newest it knows.
DRA_V1_SERVICE = "v1.DRAPlugin"
DRA_V1BETA1_SERVICE = "v1beta1.DRAPlugin"
DRA_PLUGIN_TYPE = "DRAPlugin"  # PluginInfo.type of a DRA driver (pluginregistration/v1 constants)


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    kind: int = _STRING
    repeated: bool = False
    message: str = ""  # the message type's name within the package, for TYPE_MESSAGE
    proto3_optional: bool = False


def _message(name: str, *fields: Field, package: str,
             maps: tuple[tuple[str, int, str], ...] = ()) -> descriptor_pb2.DescriptorProto:
    """A message; `maps` adds `map<string, V> name = number` fields, as protoc writes them (a nested *Entry
    message with map_entry set)."""
    message = descriptor_pb2.DescriptorProto(name=name)
    for spec in fields:
        field = message.field.add(name=spec.name, number=spec.number, type=spec.kind,
                                  label=_REPEATED if spec.repeated else _OPTIONAL, json_name=_json_name(spec.name))
        if spec.message:
            field.type_name = f".{package}.{spec.message}"
        if spec.proto3_optional:
            field.proto3_optional = True
            field.oneof_index = len(message.oneof_decl)
            message.oneof_decl.add(name=f"_{spec.name}")
    for field_name, number, value_type in maps:
        entry_name = "".join(part.capitalize() for part in field_name.split("_")) + "Entry"
        entry = message.nested_type.add(name=entry_name)
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=_STRING, label=_OPTIONAL, json_name="key")
        entry.field.add(name="value", number=2, type=_MESSAGE, label=_OPTIONAL, json_name="value",
                        type_name=f".{package}.{value_type}")
        message.field.add(name=field_name, number=number, type=_MESSAGE, label=_REPEATED,
                          type_name=f".{package}.{name}.{entry_name}", json_name=_json_name(field_name))
    return message


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _service(file: descriptor_pb2.FileDescriptorProto, name: str, *methods: tuple[str, str, str]) -> None:
    service = file.service.add(name=name)
    for method, request, response in methods:
        service.method.add(name=method, input_type=f".{file.package}.{request}",
                           output_type=f".{file.package}.{response}")


def registration_file() -> descriptor_pb2.FileDescriptorProto:
    package = REGISTRATION_PACKAGE
    file = descriptor_pb2.FileDescriptorProto(name="fracgpu/pluginregistration/v1/api.proto", package=package,
                                              syntax="proto3")
    file.message_type.extend([
        _message("PluginInfo", Field("type", 1), Field("name", 2), Field("endpoint", 3),
                 Field("supported_versions", 4, repeated=True), package=package),
        _message("RegistrationStatus", Field("plugin_registered", 1, _BOOL), Field("error", 2), package=package),
        _message("RegistrationStatusResponse", package=package),
        _message("InfoRequest", package=package),
    ])
    _service(file, "Registration", ("GetInfo", "InfoRequest", "PluginInfo"),
             ("NotifyRegistrationStatus", "RegistrationStatus", "RegistrationStatusResponse"))
    return file


def dra_file(package: str) -> descriptor_pb2.FileDescriptorProto:
    """The DRA service of `package` (v1 has Device.share_id, v1beta1 does not)."""
    version = package.rsplit(".", 1)[-1]
    file = descriptor_pb2.FileDescriptorProto(name=f"fracgpu/dra/{version}/api.proto", package=package,
                                              syntax="proto3")
    device_fields = [Field("request_names", 1, repeated=True), Field("pool_name", 2), Field("device_name", 3),
                     Field("cdi_device_ids", 4, repeated=True)]
    if package == DRA_V1_PACKAGE:
        device_fields.append(Field("share_id", 5, proto3_optional=True))
    file.message_type.extend([
        _message("NodePrepareResourcesRequest", Field("claims", 1, _MESSAGE, True, "Claim"), package=package),
        _message("NodePrepareResourcesResponse", package=package,
                 maps=(("claims", 1, "NodePrepareResourceResponse"),)),
        _message("NodePrepareResourceResponse", Field("devices", 1, _MESSAGE, True, "Device"), Field("error", 2),
                 package=package),
        _message("Device", *device_fields, package=package),
        _message("NodeUnprepareResourcesRequest", Field("claims", 1, _MESSAGE, True, "Claim"), package=package),
        _message("NodeUnprepareResourcesResponse", package=package,
                 maps=(("claims", 1, "NodeUnprepareResourceResponse"),)),
        _message("NodeUnprepareResourceResponse", Field("error", 1), package=package),
        _message("Claim", Field("namespace", 1), Field("uid", 2), Field("name", 3), package=package),
    ])
    _service(file, "DRAPlugin", ("NodePrepareResources", "NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
             ("NodeUnprepareResources", "NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse"))
    return file


class Api:
    """The message classes of one file, by name (`api.PluginInfo`), and its services' full names."""

    def __init__(self, file: descriptor_pb2.FileDescriptorProto, pool: descriptor_pool.DescriptorPool) -> None:
        self.file = file
        pool.AddSerializedFile(file.SerializeToString())
        descriptor = pool.FindFileByName(file.name)
        messages = descriptor.message_types_by_name.items()
        self._classes: dict[str, Any] = {name: message_factory.GetMessageClass(msg) for name, msg in messages}
        self.package = file.package

    def __getattr__(self, name: str) -> Any:
        try:
            return self._classes[name]
        except KeyError:
            raise AttributeError(name) from None

    def service(self, name: str) -> str:
        return f"{self.package}.{name}"


_POOL: descriptor_pool.DescriptorPool | None = None
_APIS: dict[str, Api] = {}


def api(which: str) -> Api:
    """`registration`, `dra-v1` or `dra-v1beta1`, built once per process in a pool of their own."""
    global _POOL
    if which not in _APIS:
        if _POOL is None:
            _POOL = descriptor_pool.DescriptorPool()
        files = {"registration": registration_file, "dra-v1": lambda: dra_file(DRA_V1_PACKAGE),
                 "dra-v1beta1": lambda: dra_file(DRA_V1BETA1_PACKAGE)}
        _APIS[which] = Api(files[which](), _POOL)
    return _APIS[which]
