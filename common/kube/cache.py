"""List+watch informers: an in-memory copy of one resource, kept current from the API server.

Each `Informer` runs one thread: LIST (paginated) → replace the store → WATCH from the list's
resourceVersion with bookmarks → apply events. A watch that ends is resumed from the last
resourceVersion seen; `410 Gone` (too old) re-lists; connection errors back off exponentially. A re-list
diffs against the store so handlers still see every add, update and delete.

Objects are plain dicts, slimmed by a per-resource function (common/kube/slim.py: no managedFields, no
node images) so 10,000 pods fit in little memory. Handlers run on the informer thread and must be quick; an exception in
a handler is logged and never stops the informer.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from common.kube.backoff import ResettingBackoff
from common.kube.client import ApiError, KubeClient, WatchIdle
from common.kube.sync import explain_failure

log = logging.getLogger("kube.cache")

Indexer = Callable[[dict], Iterable[str]]
Handler = Callable[..., None]


def object_key(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name', '')}" if namespace else meta.get("name", "")


def _newer_or_equal(candidate: str | None, current: str | None) -> bool:
    """resourceVersions are opaque, but etcd's are integers; compare numerically when both are."""
    if not current or not candidate:
        return True
    if candidate.isdigit() and current.isdigit():
        return int(candidate) >= int(current)
    return True


def watch_timeout_s(read_timeout_s: float) -> int:
    """The `timeoutSeconds` of one watch: spread, so informers do not re-open in step, and well inside the read
    timeout."""
    return max(1, random.randint(int(read_timeout_s / 2), int(read_timeout_s * 3 / 4)))


@dataclass
class EventHandlers:
    on_add: Handler | None = None  # (obj)
    on_update: Handler | None = None  # (old, new)
    on_delete: Handler | None = None  # (obj) — the last state seen


@dataclass
class Informer:
    client: KubeClient
    path: str
    name: str
    slim: Callable[[dict], dict] = lambda obj: obj
    indexers: dict[str, Indexer] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    max_backoff_s: float = 30.0
    # No byte for this long ends the watch (then it is re-opened from the last resourceVersion): a silently
    # dead connection is noticed within it. The server is asked to end each watch after a random half to three
    # quarters of it (`timeoutSeconds`), so a healthy watch, even one with nothing to say, never waits this long;
    # bookmarks (about one a minute) could not bound it below a minute. Re-opening a watch from a recent
    # resourceVersion is served from the apiserver's watch cache.
    read_timeout_s: float = 40.0
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self._store: dict[str, dict] = {}
        self._index: dict[str, dict[str, set[str]]] = {name: {} for name in self.indexers}
        self._lock = threading.RLock()
        self._handlers: list[EventHandlers] = []
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._wakeup = threading.Event()  # cuts a backoff short: stop(), or retry_now()
        self._thread: threading.Thread | None = None
        self._watch = None
        self.resource_version = ""
        # When resource_version last moved (clock), and a condition that wakes wait_caught_up callers then.
        self._version_seen_at = 0.0
        self._progress = threading.Condition()
        self.relists = 0
        self.quiet = False
        # Why the last list or watch failed, in words an operator can act on; "" once a list succeeds.
        self.problem = ""

    # ------------------------------------------------------------------ public reads
    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def sync_problem(self) -> str:
        """Why this informer has not synced yet: its last error, else that its first list is pending."""
        return self.problem or "waiting for the first list"

    def get(self, namespace_or_name: str, name: str | None = None) -> dict | None:
        key = f"{namespace_or_name}/{name}" if name is not None else namespace_or_name
        with self._lock:
            return self._store.get(key)

    def list(self, namespace: str | None = None) -> list[dict]:
        with self._lock:
            if namespace is None:
                return list(self._store.values())
            prefix = namespace + "/"
            return [obj for key, obj in self._store.items() if key.startswith(prefix)]

    def by_index(self, index: str, value: str) -> list[dict]:
        with self._lock:
            keys = self._index[index].get(value, ())
            return [self._store[key] for key in keys if key in self._store]

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def add_handlers(self, handlers: EventHandlers) -> None:
        self._handlers.append(handlers)

    def store_local(self, obj: dict) -> None:
        """Replace an object this process just wrote in the store, unless the store already has a newer one.

        Lets a controller read its own writes before the watch delivers them (no handlers fire). A key the
        store does not hold is never added: the watch may already have deleted it, and a ghost would stay
        until the next re-list (L1); a new object comes from the watch.
        """
        obj = self.slim(obj)
        key = object_key(obj)
        with self._lock:
            current = self._store.get(key)
            if current is None:
                return
            current_rv = current.get("metadata", {}).get("resourceVersion")
            if _newer_or_equal(obj["metadata"].get("resourceVersion"), current_rv):
                self._put(key, obj)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wakeup.set()
        watch = self._watch
        if watch is not None:
            try:
                watch.close()
            except Exception:  # noqa: BLE001 - closing a generator from another thread may race
                pass

    def retry_now(self) -> None:
        """The API server answers again (a lease request just succeeded): end a backoff now. After a long outage
        the backoff reaches tens of seconds, and a replica that takes the lease meanwhile would work from a cache
        that sees nothing, its reservation waits included."""
        self._wakeup.set()

    def _pause(self, seconds: float) -> None:
        if self._wakeup.wait(seconds) and not self._stop.is_set():
            self._wakeup.clear()

    # ------------------------------------------------------------------ store maintenance
    def _put(self, key: str, obj: dict) -> dict | None:
        old = self._store.get(key)
        if old is not None:
            self._unindex(key, old)
        self._store[key] = obj
        for index, fn in self.indexers.items():
            for value in fn(obj):
                self._index[index].setdefault(value, set()).add(key)
        return old

    def _unindex(self, key: str, obj: dict) -> None:
        for index, fn in self.indexers.items():
            for value in fn(obj):
                keys = self._index[index].get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._index[index][value]

    def _remove(self, key: str) -> dict | None:
        old = self._store.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def _fire(self, kind: str, *args: dict) -> None:
        for handlers in self._handlers:
            fn = getattr(handlers, kind)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - a handler bug must not stop the informer
                log.exception("informer %s: %s handler failed", self.name, kind)

    # ------------------------------------------------------------------ list / watch loop
    def _relist(self) -> None:
        listed = self.client.list_all(self.path, self.params, transform=self.slim)
        fresh = {object_key(obj): self.slim(obj) for obj in listed.get("items") or []}
        with self._lock:
            gone = [(key, obj) for key, obj in self._store.items() if key not in fresh]
            changes = []
            for key, _ in gone:
                self._remove(key)
            for key, obj in fresh.items():
                old = self._put(key, obj)
                changes.append((old, obj))
        for _, obj in gone:
            self._fire("on_delete", obj)
        for old, obj in changes:
            if old is None:
                self._fire("on_add", obj)
            elif old.get("metadata", {}).get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                self._fire("on_update", old, obj)
        self.relists += 1
        self.problem = ""
        self._synced.set()
        self._advance((listed.get("metadata") or {}).get("resourceVersion", ""))

    def _apply(self, event: dict) -> bool:
        """Apply one watch event; False means the watch must re-list (410 Gone)."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            log.info("informer %s: watch error %s: %s", self.name, code, obj.get("message"))
            if code == 410:
                return False
            raise ApiError(code or 500, obj.get("reason", ""), obj.get("message", "watch error"), obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self._advance(rv)
            return True
        obj = self.slim(obj)
        key = object_key(obj)
        with self._lock:
            if kind == "DELETED":
                old = self._remove(key)
            else:
                old = self._put(key, obj)
        if rv:
            self._advance(rv)  # only once the store holds the change: wait_caught_up relies on it
        if kind == "DELETED":
            self._fire("on_delete", old or obj)
        elif old is None:
            self._fire("on_add", obj)
        else:
            self._fire("on_update", old, obj)
        return True

    def _advance(self, resource_version: str) -> None:
        with self._progress:
            self.resource_version = resource_version
            self._version_seen_at = self.clock()
            self._progress.notify_all()

    def heard_within(self, seconds: float) -> bool:
        """Whether the server moved this cache's resourceVersion in the last `seconds` (an event, a list or a
        bookmark): a resource that changes often catches up with a fresh version within about that long."""
        return self.synced and self.clock() - self._version_seen_at <= seconds

    def wait_caught_up(self, resource_version: str, since: float, timeout: float) -> bool:
        """Wait until this cache holds every change up to `resource_version` (a version the server answered
        after `since`, by `clock`), learnt from the server after `since`; False after `timeout` seconds.

        The second condition keeps a cache that is ahead of a server restored from a backup (M1) from
        counting as caught up: such a cache hears nothing new until it lists again."""
        if not resource_version.isdigit():
            return False
        wanted = int(resource_version)

        def caught_up() -> bool:
            current = self.resource_version
            return (self.synced and current.isdigit() and int(current) >= wanted
                    and self._version_seen_at >= since)

        with self._progress:
            return self._progress.wait_for(caught_up, timeout)

    def _server_is_behind(self) -> bool:
        """Whether the API server's current resourceVersion is below the one this cache holds: etcd was
        restored from a backup. A watch from a version the server has not reached is accepted and stays silent
        (kube-apiserver 1.35 answers no "too large" error), and once the server's counter passes it the watch
        resumes and misses every change in between: only a new list heals that (M1). One cheap request (a
        consistent list of one object), made only after a watch failed or ended with nothing in it."""
        if not self.resource_version.isdigit():
            return False
        probe = self.client.get(self.path, params={**self.params, "limit": "1"})
        current = (probe.get("metadata") or {}).get("resourceVersion", "")
        if current.isdigit() and int(current) < int(self.resource_version):
            log.warning("informer %s: the API server is at resourceVersion %s, behind this cache's %s (etcd "
                        "restored from a backup?); re-listing", self.name, current, self.resource_version,
                        extra={"fields": {"informer": self.name}})
            return True
        return False

    def _watch_once(self) -> bool:
        """One watch; False when the cache must be listed again. Sets `quiet` when nothing at all came."""
        self.quiet = True
        params = dict(self.params)
        params.update({
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(watch_timeout_s(self.read_timeout_s)),
        })
        self._watch = self.client.watch(self.path, params, read_timeout=self.read_timeout_s)
        try:
            for event in self._watch:
                self.quiet = False
                if self._stop.is_set():
                    return True
                if not self._apply(event):
                    return False
        except WatchIdle as idle:
            # Nothing, not even a bookmark, for the read timeout: the connection may be dead. Not an
            # error: open a new watch (on a new connection) from the last resourceVersion at once.
            log.info("informer %s: %s; watching again", self.name, idle)
        finally:
            self._watch.close()
            self._watch = None
        return True

    def _run(self) -> None:
        # Reset after two minutes without a failure, as client-go's reflector (L3); a 410 waits too, so a
        # server answering 410 at once cannot spin the informer through LIST after LIST.
        backoff = ResettingBackoff(0.2, self.max_backoff_s, clock=lambda: self.clock())
        need_list = True
        suspect = False  # the last watch failed or brought nothing: is the server behind us?
        while not self._stop.is_set():
            try:
                if suspect and not need_list:
                    need_list = self._server_is_behind()
                suspect = False
                if need_list:
                    self._relist()
                    need_list = False
                need_list = not self._watch_once()
                suspect = self.quiet
                if need_list:
                    self._pause(backoff.next())
            except ApiError as error:
                if self._stop.is_set():
                    return
                # As client-go's reflector: only a connection problem or throttling is worth watching
                # again from the same resourceVersion. Anything else (504 "Too large resource version"
                # after an etcd restore, a 500 ERROR event, ...) may never heal from it: list afresh.
                verb = "list" if need_list else "watch"
                need_list = need_list or error.gone or not (error.transport or error.status == 429)
                suspect = True
                wait = backoff.next()
                self.problem = explain_failure(self.name, self.path, verb, error)
                log.warning("informer %s: %s; %s in %.1fs", self.name, self.problem,
                            "re-listing" if need_list else "watching again", wait,
                            extra={"fields": {"informer": self.name, "verb": verb, "code": error.status}})
                self._pause(wait)
            except Exception as error:  # noqa: BLE001 - keep the cache alive whatever happens
                if self._stop.is_set():
                    return
                self.problem = f"unexpected failure: {error!r}"
                wait = backoff.next()
                log.exception("informer %s: unexpected failure; re-listing in %.1fs", self.name, wait)
                need_list = True
                self._pause(wait)
