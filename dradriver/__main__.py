"""`python -m dradriver` / `fracgpu-dra-driver`: flags → client → slice publisher + kubelet plugin; SIGTERM stops
both (the prepared claims' specs stay on disk for the next start)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from common import names
from common.flags import StartupError, exit_with, kube_client, log_startup
from common.logs import configure_logging
from common.probes import HttpEndpoint, health_routes
from dradriver.settings import parse_settings

log = logging.getLogger("dradriver")


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    configure_logging(settings.log_format, settings.log_level)
    log_startup(log, "dra-driver", settings)
    from common.kube.events import EventRecorder
    from dradriver import devices
    from dradriver.kubeletplugin import KubeletPlugin, Sockets
    from dradriver.preparer import Preparer
    from dradriver.publisher import SlicePublisher

    try:
        client = kube_client(settings.kubeconfig, user_agent="fracgpu-dra-driver")
    except StartupError as error:
        return exit_with("dra-driver", error)
    if settings.fake_gpus:
        made_up = devices.fake_gpus(settings.node_name, settings.fake_gpus, settings.fake_gpu_memory_mib)

        def discover() -> list[devices.Gpu]:
            return made_up
    else:
        try:
            nvml = devices.load_nvml()
            devices.discover(nvml)  # fail at start, with NVML's answer, rather than publish nothing
        except (ImportError, devices.DiscoveryError) as error:
            return exit_with("dra-driver", StartupError("GPU discovery", str(error),
                                                        "run this on a GPU node with the NVIDIA driver"))

        def discover() -> list[devices.Gpu]:
            return devices.discover(nvml)

    def read_claim(namespace: str, name: str) -> dict[str, Any] | None:
        return client.get_or_none(f"/apis/{names.RESOURCE_API_GROUP}/{names.RESOURCE_API_VERSION}/namespaces/"
                                  f"{namespace}/resourceclaims/{name}")

    publisher = SlicePublisher(client, settings.node_name, discover, settings.slice_interval_s)
    events = EventRecorder(client, "fracgpu-dra-driver", settings.node_name)
    preparer = Preparer(pool=settings.node_name, read_claim=read_claim, gpus=discover, cdi_dir=settings.cdi_dir,
                        node_name=settings.node_name, record_event=events)
    plugin = KubeletPlugin(preparer, Sockets.under(settings.registrar_dir, settings.plugins_dir))
    health = None
    if settings.health_address:
        def ready() -> tuple[bool, str]:
            if not publisher.synced.is_set():
                return False, "the node's ResourceSlice has not been written yet"
            return True, "ok"

        try:
            health = HttpEndpoint(settings.health_address, health_routes(ready), "health",
                                  "--health-probe-bind-address")
        except StartupError as error:
            return exit_with("dra-driver", error)
        health.start()
    stopped = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        plugin.start()
    except OSError as error:
        return exit_with("dra-driver", StartupError("kubelet plugin sockets", str(error),
                                                    "mount the kubelet's plugin directories into the pod"))
    publisher.start()
    while not stopped.wait(1.0):
        pass
    publisher.stop()
    plugin.stop()
    if health is not None:
        health.stop()
    log.info("dra driver stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
