"""Informers a program starts, stops and waits on as one: its start-up waits for all, its readiness names
each one still waiting and why (common/kube/sync.py)."""

from __future__ import annotations

from collections.abc import Iterator

from common.kube.cache import Informer
from common.kube.sync import unsynced_reason


class InformerSet:
    def __init__(self, *informers: Informer) -> None:
        self._informers = list(informers)

    def all(self) -> list[Informer]:
        return list(self._informers)

    def __iter__(self) -> Iterator[Informer]:
        return iter(self._informers)

    def start(self) -> None:
        for informer in self._informers:
            informer.start()

    def stop(self) -> None:
        for informer in self._informers:
            informer.stop()

    def retry_now(self) -> None:
        """Informers backing off from an outage list and watch at once (the API server was just seen to answer)."""
        for informer in self._informers:
            informer.retry_now()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return all(informer.wait_synced(timeout) for informer in self._informers)

    @property
    def synced(self) -> bool:
        return all(informer.synced for informer in self._informers)

    def unsynced_reason(self) -> str:
        return unsynced_reason(self._informers)
