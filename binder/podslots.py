"""One bind attempt per pod at a time (L6).

The work queue deduplicates by BindRequest, not by pod: a second BindRequest for the same pod (a name other than
the pod's, a scheduler that wrote two) would otherwise run alongside the first, each labelling the pod with its
own groups and rewriting its ConfigMaps with its own GPU ids. The controller takes the pod's slot before an
attempt; a BindRequest that finds it taken comes back later without counting an attempt.

A slot stays with its BindRequest while that one's Binding has an unknown outcome (it may still commit), and
after an attempt ends the next BindRequest for the pod reads the pod from the API server for a while: the
informer may not show yet that the first one bound it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

# How long after another BindRequest's attempt on a pod the cache is not trusted for that pod. Generous: the
# pod watch normally delivers in milliseconds, but a slow or re-listing informer can lag for seconds.
CACHE_DISTRUST_S = 30.0


class PodSlots:
    def __init__(self, distrust_s: float = CACHE_DISTRUST_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._distrust_s = distrust_s
        self._clock = clock
        self._lock = threading.Lock()
        self._holder: dict[str, str] = {}  # pod key -> BindRequest key attempting it
        self._held: dict[str, str] = {}  # BindRequest key -> pod key it holds
        # pod key -> (BindRequest key, when) of the last attempt that ended, oldest first: pruned as it ages.
        self._ended: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def acquire(self, pod_key: str, owner: str) -> bool:
        """Take the pod's slot for BindRequest `owner`; True also when `owner` holds it already."""
        with self._lock:
            holder = self._holder.get(pod_key)
            if holder is not None and holder != owner:
                return False
            previous = self._held.get(owner)
            if previous is not None and previous != pod_key:  # the BindRequest now names another pod
                self._holder.pop(previous, None)
            self._holder[pod_key] = owner
            self._held[owner] = pod_key
            return True

    def release(self, owner: str) -> None:
        """`owner` is done with whatever pod it held (no-op when it holds none)."""
        with self._lock:
            pod_key = self._held.pop(owner, None)
            if pod_key is None:
                return
            if self._holder.get(pod_key) == owner:
                del self._holder[pod_key]
            now = self._clock()
            self._ended.pop(pod_key, None)
            self._ended[pod_key] = (owner, now)
            while self._ended:
                _, (_, ended) = next(iter(self._ended.items()))
                if now - ended <= self._distrust_s:
                    break
                self._ended.popitem(last=False)

    def recently_worked_by_another(self, pod_key: str, owner: str) -> bool:
        """Whether another BindRequest's attempt on this pod ended so recently that the cache may not show it."""
        with self._lock:
            last = self._ended.get(pod_key)
        return last is not None and last[0] != owner and self._clock() - last[1] <= self._distrust_s

    def __len__(self) -> int:
        with self._lock:
            return len(self._holder) + len(self._ended)
