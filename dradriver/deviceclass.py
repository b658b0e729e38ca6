"""The DeviceClass of fracgpu's DRA driver: claims name it to get a GPU the driver publishes (the chart ships it;
the test bed and the demo create it from here).

It also maps the extended resource `nvidia.com/gpu` (DRA extended resources, KEP-5004, GA in v1.37): a pod asking
for whole GPUs the usual way, on a node without a device plugin that advertises them, gets them through this class,
from the same devices and counted with the shares (a whole device consumes all of its memory by the slices' request
policy). On a node whose device plugin advertises `nvidia.com/gpu`, the device plugin keeps serving it."""

from __future__ import annotations

from typing import Any

from common import names


def device_class() -> dict[str, Any]:
    return {
        "apiVersion": f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}", "kind": "DeviceClass",
        "metadata": {"name": names.DRA_DRIVER_NAME},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{names.DRA_DRIVER_NAME}"'}}],
                 "extendedResourceName": names.NVIDIA_GPU},
    }
