"""Does the control plane keep a claim's capacity request (common/dra.py)? DRA mode fails closed: while the API
server drops it, fractional pods are refused, saying why and what to turn on, instead of each getting a whole GPU.

The probe is a dry-run create (nothing is stored) of a ResourceClaimTemplate that asks for 1 MiB of memory: what
the API server answers shows whether the request was kept. It runs when DRA mode starts in a process, then every
`every_s` in the background; a probe that cannot reach the API keeps the last answer, and with none yet it counts
as a problem (the pod could not be served anyway).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from common.dra import (
    CAPACITY_DROPPED,
    CONSUMABLE_CAPACITY_GATE,
    TEMPLATES_PATH,
    capacity_kept,
    capacity_probe_manifest,
)

log = logging.getLogger("admission.dra")


class CapacityProbe:
    def __init__(self, create_dry_run: Callable[[str, dict[str, Any]], dict[str, Any]], namespace: str,
                 every_s: float = 180.0) -> None:
        self.create_dry_run = create_dry_run  # (collection path, body) -> the API server's answer, nothing stored
        self.namespace = namespace
        self.every_s = every_s
        self._problem: str | None = f"consumable capacity has not been checked yet ({CONSUMABLE_CAPACITY_GATE})"
        self._stop = threading.Event()

    def check(self) -> str | None:
        """Probe now; the problem, or None when capacity requests are kept."""
        try:
            answer = self.create_dry_run(TEMPLATES_PATH.format(self.namespace), capacity_probe_manifest(self.namespace))
        except Exception as error:  # the API is away or refuses: keep what was known
            log.warning("consumable-capacity probe failed", extra={"fields": {"error": str(error)}})
            if self._problem and "not been checked" in self._problem:
                self._problem = f"consumable capacity could not be checked ({CONSUMABLE_CAPACITY_GATE}): {error}"
            return self._problem
        problem = None if capacity_kept(answer) else CAPACITY_DROPPED
        if problem != self._problem:
            (log.error if problem else log.info)(
                "consumable capacity is off: fractional pods are refused" if problem
                else "consumable capacity is on", extra={"fields": {"gate": CONSUMABLE_CAPACITY_GATE}})
        self._problem = problem
        return problem

    def problem(self) -> str | None:
        return self._problem

    def start(self) -> None:
        self.check()
        threading.Thread(target=self._run, name="capacity-probe", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.check()

    def stop(self) -> None:
        self._stop.set()
