"""Create a pod's ResourceClaimTemplate idempotently: the template is named by a hash of its spec
(claimtemplates.py), so one that exists already is the one wanted, and an AlreadyExists answer is success. Templates
known to exist are remembered per process, so only the first pod of a kind in a namespace costs an API call. A
dry-run admission creates nothing. A template is believed in for TEMPLATE_MEMORY_S, then ensured again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from common.dra import TEMPLATES_PATH
from common.kube.client import ApiError

log = logging.getLogger("admission.dra")



# How long a template is believed to exist without asking: well below the sweeper's hour (sweeper.py), so one
# deleted as unused is never believed in for long.
TEMPLATE_MEMORY_S = 600.0


class TemplateNotCreated(RuntimeError):
    """The API refused or did not answer; the message is the admission refusal."""


class TemplateStore:
    def __init__(self, create: Callable[[str, dict[str, Any]], Any], memory_s: float = TEMPLATE_MEMORY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.create = create  # (collection path, body) -> the created object; raises ApiError
        self.memory_s = memory_s
        self.clock = clock
        self._known: dict[tuple[str, str], float] = {}  # -> when it was last known to exist
        self._lock = threading.Lock()

    def ensure(self, manifest: dict[str, Any]) -> bool:
        """Make sure the template exists; True when this call created it."""
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        with self._lock:
            known_at = self._known.get((namespace, name))
            if known_at is not None and self.clock() - known_at < self.memory_s:
                return False
        created = True
        try:
            self.create(TEMPLATES_PATH.format(namespace), manifest)
        except ApiError as error:
            if not error.already_exists:
                raise TemplateNotCreated(
                    f"the ResourceClaimTemplate {namespace}/{name} for the pod's GPU share could not be created: "
                    f"{error}") from None
            created = False
        with self._lock:
            self._known[(namespace, name)] = self.clock()
        if created:
            log.info("ResourceClaimTemplate created", extra={"fields": {"namespace": namespace, "template": name}})
        return created

    def forget(self, namespace: str, name: str) -> None:
        """The sweeper deleted it: the next pod that wants it creates it again."""
        with self._lock:
            self._known.pop((namespace, name), None)
