"""The DeviceClass of fracgpu's DRA driver: claims name it to get a GPU the driver publishes (the chart ships it;
the test bed and the demo create it from here)."""

from __future__ import annotations

from typing import Any

from common import names


def device_class() -> dict[str, Any]:
    return {
        "apiVersion": f"{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}", "kind": "DeviceClass",
        "metadata": {"name": names.DRA_DRIVER_NAME},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{names.DRA_DRIVER_NAME}"'}}]},
    }
