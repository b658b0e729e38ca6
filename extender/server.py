"""The extender's HTTP side: POST <prefix>/filter, /prioritize, /bind and /preempt from the kube-scheduler.

Every request is answered with the verb's result type; a body that cannot be read, or a verb that fails,
gives that type's `Error` (the scheduler shows it as the pod's scheduling failure) and a log line, never a
500 with a traceback. The preemption result has no `Error`: a failed preempt is an HTTP error status, which the
scheduler reports as the preemption's failure and retries. The scheduler is the only client (a sidecar on
localhost), so a thread per connection is plenty; a bind holds its thread while it waits for the binder.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from common.gpuclaims import InvalidRequest
from common.logs import log_context
from extender import protocol
from extender.preemption.verb import Preemption, PreemptionNotReady
from extender.verbs import CachesNotSynced, Verbs

log = logging.getLogger("extender.server")

MAX_BODY_BYTES = 64 * 1024 * 1024  # 5,000 Node objects when the scheduler is not nodeCacheCapable
IDLE_TIMEOUT_S = 120.0


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.latency = Histogram("fracgpu_extender_request_duration_seconds", "Time to answer a verb", ["verb"],
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 30),
                                 registry=registry)
        self.filtered_nodes = Counter("fracgpu_extender_filter_nodes_total",
                                      "Nodes judged by filter, by outcome (fit, refused)", ["outcome"],
                                      registry=registry)
        self.binds = Counter("fracgpu_extender_binds_total",
                             "Bind calls by outcome: bound, failed (the binder's reason went back), refused "
                             "(the node filled up since filter, or the pod's BindRequest places it elsewhere), "
                             "error (bad request), not_synced (the caches were not full yet)", ["outcome"],
                             registry=registry)
        self.not_synced = Counter("fracgpu_extender_not_synced_answers_total",
                                  "Verb calls answered with an error because the caches had not applied their first "
                                  "lists yet (the scheduler retries them)", ["verb"], registry=registry)
        self.failed_deleted = Counter("fracgpu_extender_failed_bindrequests_deleted_total",
                                      "BindRequests failed for good after their bind call ended, deleted once they "
                                      "had been failed for 30 s", registry=registry)
        self.requeues = Counter("fracgpu_extender_requeues_total",
                                "Pending pods the extender had refused everywhere, woken for the scheduler once GPUs "
                                "they fit were freed, by outcome (patched, failed)", ["outcome"], registry=registry)
        self.preemptions = Counter("fracgpu_extender_preemption_calls_total",
                                   "Preempt calls by outcome: nodes (victims chosen on some node), none (no node "
                                   "where removing lower-priority pods makes room on its GPUs), error", ["outcome"],
                                   registry=registry)
        self.preempted = Counter("fracgpu_extender_preemptions_total",
                                 "Preemptors nominated on a node whose victims the extender chose", registry=registry)
        self.victims = Counter("fracgpu_extender_preemption_victims_total",
                               "Pods the extender chose as victims on the node their preemptor was nominated on",
                               registry=registry)
        self.bind_to_bound = Histogram("fracgpu_extender_bind_to_bound_seconds",
                                       "From the scheduler's bind call to the pod bound",
                                       buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25), registry=registry)

    def count_bind(self, outcome: str) -> None:
        """Told by the verbs how each bind call ended."""
        self.binds.labels(outcome).inc()
        if outcome == "not_synced":
            self.not_synced.labels("bind").inc()


class VerbRefused(Exception):
    """A verb whose result type has no error field refuses with an HTTP status and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ExtenderServer:
    def __init__(self, address: tuple[str, int], verbs: Verbs, metrics: ExtenderMetrics,
                 preemption: Preemption | None = None) -> None:
        self.verbs = verbs
        self.metrics = metrics
        self.preemption = preemption
        self.routes: dict[str, Callable[[bytes], Any]] = {
            "filter": self._filter, "prioritize": self._prioritize, "bind": self._bind, "preempt": self._preempt}
        self.httpd = ThreadingHTTPServer(address, _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="extender-http", daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, verb: str, body: bytes) -> Any:
        started = time.perf_counter()
        try:
            return self.routes[verb](body)
        finally:
            self.metrics.latency.labels(verb).observe(time.perf_counter() - started)

    # -- verbs ------------------------------------------------------------------------------------------------

    def _filter(self, body: bytes) -> dict[str, Any]:
        try:
            args = protocol.decode_filter_args(body)
        except protocol.BadRequest as error:
            log.warning("filter refused the request", extra={"fields": {"error": str(error)}})
            return protocol.filter_error(str(error))
        meta = args.pod.get("metadata") or {}
        with log_context(pod=meta.get("name"), namespace=meta.get("namespace")):
            try:
                fitting, refused = self.verbs.filter(args.pod, args.node_names)
            except CachesNotSynced as not_synced:
                self.metrics.not_synced.labels("filter").inc()
                return protocol.filter_error(str(not_synced))
            except InvalidRequest as error:
                log.warning("filter refused the request", extra={"fields": {"error": str(error)}})
                return protocol.filter_error(str(error))
            self.metrics.filtered_nodes.labels("fit").inc(len(fitting))
            self.metrics.filtered_nodes.labels("refused").inc(len(refused))
            if not fitting:
                log.info("pod fits no node", extra={"fields": {"nodes": len(args.node_names),
                                                               "reasons": sorted(set(refused.values()))[:5]}})
            return protocol.filter_result(args, fitting, refused)

    def _prioritize(self, body: bytes) -> list[dict[str, Any]]:
        try:
            args = protocol.decode_filter_args(body)
            scores = self.verbs.prioritize(args.pod, args.node_names)
        except CachesNotSynced:
            self.metrics.not_synced.labels("prioritize").inc()
            return protocol.priority_list({}, args.node_names)  # no preference (filter refused it anyway)
        except (protocol.BadRequest, InvalidRequest) as error:
            # HostPriorityList has no error field: a list of zeros leaves the choice to the scheduler.
            log.warning("prioritize could not read the request", extra={"fields": {"error": str(error)}})
            return []
        return protocol.priority_list(scores, args.node_names)

    def _bind(self, body: bytes) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            args = protocol.decode_bind_args(body)
        except protocol.BadRequest as error:
            self.metrics.binds.labels("error").inc()
            log.warning("bind refused the request", extra={"fields": {"error": str(error)}})
            return protocol.bind_result(str(error))
        error = self.verbs.bind_by_name(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        if not error:
            self.metrics.bind_to_bound.observe(time.perf_counter() - started)
        return protocol.bind_result(error)


    def _preempt(self, body: bytes) -> dict[str, Any]:
        try:
            args = protocol.decode_preemption_args(body)
        except protocol.BadRequest as error:
            self.metrics.preemptions.labels("error").inc()
            log.warning("preempt refused the request", extra={"fields": {"error": str(error)}})
            raise VerbRefused(400, str(error)) from None
        if self.preemption is None:
            raise VerbRefused(404, "this extender chooses no victims")
        meta = args.pod.get("metadata") or {}
        with log_context(pod=meta.get("name"), namespace=meta.get("namespace")):
            try:
                answer = self.preemption.preempt(args.pod, args.proposed)
            except PreemptionNotReady as not_ready:
                self.metrics.preemptions.labels("error").inc()
                self.metrics.not_synced.labels("preempt").inc()
                raise VerbRefused(503, str(not_ready)) from None
            except InvalidRequest as error:
                self.metrics.preemptions.labels("error").inc()
                raise VerbRefused(400, str(error)) from None
            self.metrics.preemptions.labels("nodes" if answer else "none").inc()
            log.info("preemption answered", extra={"fields": {
                "candidates": len(args.proposed), "nodes": {node: list(chosen.victims)
                                                            for node, chosen in list(answer.items())[:5]}}})
            return protocol.preemption_result({node: (chosen.victims, chosen.pdb_violations)
                                               for node, chosen in answer.items()})


def _handler(server: ExtenderServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the scheduler keeps its connections open
        timeout = IDLE_TIMEOUT_S
        # Headers and body go out as two writes; with Nagle on, the body waited for a delayed ACK (40 ms a call).
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            verb = self.path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self.close_connection = True
                self._send(413 if length > 0 else 411, {"Error": "a Content-Length up to 64 MiB is required"})
                return
            body = self.rfile.read(length)  # read even when refused: the connection stays usable
            if verb not in server.routes:
                self._send(404, {"Error": f"unknown verb {verb!r}: use filter, prioritize, bind or preempt"})
                return
            try:
                self._send(200, server.answer(verb, body))
            except VerbRefused as refused:
                self._send(refused.status, {"Error": str(refused)})
            except Exception as error:  # noqa: BLE001 - a bug answers the scheduler, and the server keeps serving
                log.exception("verb failed", extra={"fields": {"verb": verb}})
                self._send(200, [] if verb == "prioritize" else {"Error": f"extender {verb} failed: {error}"})

        def _send(self, code: int, document: Any) -> None:
            payload = json.dumps(document).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            return  # every verb call has its own structured line where it matters

    return Handler
