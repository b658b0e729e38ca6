"""What is installed: the effective settings of the fracgpu webhook and binder, read from their Deployments.

The operator CLI must judge a cluster by the flags the programs really run with (a scheduler name, a runtime
class, hamicore on or off), not by defaults. Command-line options of the CLI override what is read here; with
neither, the programs' own defaults apply.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from common import names
from common.flags import parse_bool
from common.kube.client import KubeClient

DEFAULT_NAMESPACE = "fracgpu-system"
ADMISSION_DEPLOYMENT = "fracgpu-admission"
BINDER_DEPLOYMENT = "fracgpu-binder"
MUTATING_CONFIGURATION = "fracgpu-mutating-admission"
VALIDATING_CONFIGURATION = "fracgpu-validating-admission"
DEFAULT_RESERVATION_IMAGE = "registry/local/kai-scheduler/resource-reservation"


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The last value of `flag` in a container's args (`--f=v` or `--f v`); "true" for a bare boolean."""
    found = None
    for index, arg in enumerate(args):
        if arg == flag:
            following = args[index + 1] if index + 1 < len(args) else None
            found = following if following is not None and not following.startswith("--") else "true"
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def _bool_flag(args: Sequence[str], flag: str) -> bool:
    value = flag_value(args, flag)
    try:
        return value is not None and parse_bool(value)
    except argparse.ArgumentTypeError:
        return False


def hamicore_plugin_enabled(plugins_json: str | None) -> bool:
    """The binder's --plugins JSON turns hamicore on (keys match case-insensitively, as the binder reads them)."""
    if not plugins_json:
        return False
    try:
        config = json.loads(plugins_json)
    except ValueError:
        return False
    for name, options in (config.items() if isinstance(config, dict) else ()):
        if name.lower() == "hamicore" and isinstance(options, dict):
            enabled = {key.lower(): value for key, value in options.items()}.get("enabled")
            return enabled is True
    return False


@dataclass
class Installed:
    """Effective settings; `found` names the Deployments they were read from."""

    namespace: str = DEFAULT_NAMESPACE
    scheduler_name: str = names.DEFAULT_SCHEDULER_NAME
    runtime_class: str = names.DEFAULT_RUNTIME_CLASS
    hamicore: bool = False
    # --toolkit-memory-limits-enabled on the webhook and on the binder: each side alone does nothing useful.
    toolkit_memory_webhook: bool = False
    toolkit_memory_binder: bool = False
    # --nri-memory-limits-enabled, a binder flag alone: the annotations go on the pod at bind.
    nri_memory_binder: bool = False
    reservation_namespace: str = names.DEFAULT_RESERVATION_NAMESPACE
    reservation_image: str = DEFAULT_RESERVATION_IMAGE
    reservation_platforms: list[str] = field(default_factory=list)
    mutating_configuration: str = MUTATING_CONFIGURATION
    validating_configuration: str = VALIDATING_CONFIGURATION
    found: list[str] = field(default_factory=list)


def _container_args(deployment: dict[str, Any]) -> list[str]:
    containers = (((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
    return [str(arg) for arg in (containers[0].get("args") or [])] if containers else []


def _read(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    return client.get_or_none(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")


def read_installed(client: KubeClient, namespace: str = DEFAULT_NAMESPACE) -> Installed:
    installed = Installed(namespace=namespace)
    admission = _read(client, namespace, ADMISSION_DEPLOYMENT)
    if admission is not None:
        installed.found.append(f"deployment/{ADMISSION_DEPLOYMENT}")
        args = _container_args(admission)
        installed.scheduler_name = flag_value(args, "--scheduler-name") or installed.scheduler_name
        # The new flag wins over its deprecated alias, as in the webhook; "" turns the runtime class off.
        runtime = flag_value(args, "--gpu-fraction-runtime-class-name")
        if runtime is None:
            runtime = flag_value(args, "--gpu-pod-runtime-class-name")
        installed.runtime_class = installed.runtime_class if runtime is None else runtime
        installed.hamicore = _bool_flag(args, "--hami-core-enabled")
        installed.toolkit_memory_webhook = _bool_flag(args, "--toolkit-memory-limits-enabled")
    binder = _read(client, namespace, BINDER_DEPLOYMENT)
    if binder is not None:
        installed.found.append(f"deployment/{BINDER_DEPLOYMENT}")
        args = _container_args(binder)
        installed.hamicore = installed.hamicore or hamicore_plugin_enabled(flag_value(args, "--plugins"))
        installed.toolkit_memory_binder = _bool_flag(args, "--toolkit-memory-limits-enabled")
        installed.nri_memory_binder = _bool_flag(args, "--nri-memory-limits-enabled")
        installed.reservation_namespace = (flag_value(args, "--resource-reservation-namespace")
                                           or installed.reservation_namespace)
        installed.reservation_image = (flag_value(args, "--resource-reservation-pod-image")
                                       or installed.reservation_image)
        annotations = (binder.get("metadata") or {}).get("annotations") or {}
        platforms = annotations.get(names.RESERVATION_IMAGE_PLATFORMS_ANNOTATION, "")
        installed.reservation_platforms = [p.strip() for p in platforms.split(",") if p.strip()]
    return installed
