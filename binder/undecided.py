"""Bindings whose outcome is unknown (docs/decisions.md §2.3): a `pods/binding` call whose answer was lost or was a
5xx may still commit until the API server's own request deadline has passed. Such a BindRequest is neither failed nor
rolled back: it is remembered here, and a read of the pod made after that deadline decides what happened."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from binder import status as st
from binder.steps import Attempt, Step
from common.kube.client import ApiError, pod_path

if TYPE_CHECKING:
    from common.kube.client import KubeClient

log = logging.getLogger("binder.controller")
# A read that could not decide yet (the API server failing) is tried again this much later.
UNDECIDED_RETRY_S = 1.0


@dataclass(frozen=True)
class UndecidedBinding:
    """A Binding whose outcome is unknown (binder/pipeline.py BindOutcomeUnknown), waiting to be decided."""

    bind_request_uid: str
    pod_uid: str
    decide_after: float  # time.monotonic()
    message: str


class UndecidedBindings:
    """BindRequest key -> its undecided Binding. Each key is worked on by one bind worker at a time."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._by_key: dict[str, UndecidedBinding] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def remember(self, attempt: Attempt) -> bool:
        """Remember the attempt's undecided Binding; False when one was remembered already (the first one's deadline
        stands)."""
        if attempt.key in self._by_key:
            return False
        self._by_key[attempt.key] = UndecidedBinding(st.uid(attempt.bind_request), st.uid(attempt.pod or {}),
                                                     attempt.decide_after, attempt.unknown_message)
        return True

    def forget(self, key: str) -> None:
        self._by_key.pop(key, None)

    def decided_not_bound(self, attempt: Attempt) -> bool:
        """The cache shows the attempt's pod unbound, and an earlier Binding of this key is undecided.

        True when that Binding cannot have taken effect (a read after the server-side deadline shows the pod unbound,
        or it belonged to another BindRequest or pod of that name): the caller binds again, as the API failed, not
        the bind (M5). Otherwise fills in `attempt` and returns False: still undecided (wait), or decided another way
        (bound, pod gone)."""
        undecided = self._by_key[attempt.key]
        if undecided.bind_request_uid != st.uid(attempt.bind_request) or undecided.pod_uid != st.uid(attempt.pod or {}):
            self.forget(attempt.key)  # a new BindRequest or pod under the same name: start afresh
            return True
        if not self._decide(attempt, undecided):
            return False
        self.forget(attempt.key)
        attempt.step, attempt.unknown_message = Step.NOT_DONE, ""
        log.info("the earlier binding did not take effect (%s); binding again", undecided.message)
        return True

    def _decide(self, attempt: Attempt, undecided: UndecidedBinding) -> bool:
        pod = attempt.pod or {}
        attempt.step, attempt.unknown_message = Step.OUTCOME_UNKNOWN, undecided.message
        attempt.decide_after = undecided.decide_after
        if time.monotonic() < undecided.decide_after:
            return False
        meta = pod.get("metadata") or {}
        try:
            current = self.client.get(pod_path(meta.get("namespace", ""), meta.get("name", "")))
        except ApiError as error:
            if not error.not_found:
                log.warning("cannot decide the earlier binding yet: %s", error)
                attempt.decide_after = time.monotonic() + UNDECIDED_RETRY_S
                return False
            attempt.error, attempt.step = f'pods "{meta.get("name")}" not found', Step.POD_NOT_FOUND
            return False
        if st.uid(current) != undecided.pod_uid:
            attempt.error, attempt.step = f'pods "{meta.get("name")}" not found', Step.POD_NOT_FOUND
            return False
        attempt.pod = current
        node_name = st.spec(attempt.bind_request)["selectedNode"]
        if (current.get("spec") or {}).get("nodeName"):
            attempt.error = st.already_bound_error(current, node_name, attempt.bind_request)
            attempt.step = Step.BOUND_ELSEWHERE if attempt.error else Step.BOUND
            if not attempt.error:
                log.info("the earlier binding went through after all: the pod is bound")
            return False
        return True
