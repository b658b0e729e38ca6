"""Per-GPU-group mutexes (reference 6.8): reference-counted so idle groups leave nothing behind."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class GroupLocks:
    """`with locks.hold(group):` serialises all reservation work for one group. Not re-entrant: code that
    already holds a group's lock calls the `_locked` variants of the service."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._users: dict[str, int] = {}

    @contextmanager
    def hold(self, group: str, blocking: bool = True) -> Iterator[bool]:
        """Hold the group's lock; with `blocking=False` only if it is free at once. Yields whether held."""
        with self._guard:
            lock = self._locks.setdefault(group, threading.Lock())
            self._users[group] = self._users.get(group, 0) + 1
        held = lock.acquire(blocking)
        try:
            yield held
        finally:
            with self._guard:
                self._users[group] -= 1
                if self._users[group] == 0:
                    del self._users[group]
                    del self._locks[group]
            if held:
                lock.release()

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)
