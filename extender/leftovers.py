"""BindRequests failed for good that nothing else would delete: the extender deletes them a bounded time later.

A bind call deletes the BindRequest it waits on when the binder fails it for good. One that fails after its bind
call has ended (the call timed out, its pod was deleted meanwhile, the extender restarted) was deleted only by the
next bind call of its pod, which never comes for a pod that is gone or never fits again, or by the owner garbage
collector, which does nothing for a BindRequest without an owner reference. It holds nothing (extender.md: only a
BindRequest failed for good, or one whose pod is gone, may be deleted), so once it has been seen failed for
`kept_s` — long enough for a person to read its reason — it is deleted, with a uid precondition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from common.bindrequest import failed_for_good
from common.logs import log_context
from common.objects import meta

log = logging.getLogger("extender.leftovers")

FAILED_KEPT_S = 30.0  # docs/operations.md §10.4
SWEEP_EVERY_S = 10.0


class FailedBindRequests:
    def __init__(self, bind_requests: Callable[[], Iterable[dict[str, Any]]],
                 delete: Callable[[dict[str, Any]], None], kept_s: float = FAILED_KEPT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bind_requests = bind_requests
        self.delete = delete
        self.kept_s = kept_s
        self._clock = clock
        self._failed_since: dict[str, float] = {}  # uid -> when a sweep first saw it failed for good

    def sweep(self) -> int:
        """Delete those seen failed for good for `kept_s`; how many."""
        now = self._clock()
        still: dict[str, float] = {}
        deleted = 0
        for bind_request in self.bind_requests():
            uid = str(meta(bind_request).get("uid") or "")
            if not uid or not failed_for_good(bind_request):
                continue
            since = self._failed_since.get(uid, now)
            if now - since < self.kept_s:
                still[uid] = since
                continue
            with log_context(namespace=meta(bind_request).get("namespace"), bindrequest=meta(bind_request).get("name"),
                             pod=(bind_request.get("spec") or {}).get("podName")):
                log.info("deleting a BindRequest failed for good that nothing waits on", extra={
                    "fields": {"reason": (bind_request.get("status") or {}).get("reason", "")}})
                self.delete(bind_request)
            deleted += 1
        self._failed_since = still
        return deleted
