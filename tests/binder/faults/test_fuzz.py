"""S19: 200 BindRequests mutated at random (seeded); good ones keep binding in between.

Each BindRequest is written straight to the API server (no scheduler simulator: failed ones must stay for the
checker). A mutation is either bad (the binder must end it `Failed` with a reason and a Warning, within 60 s, and
create no reservation pod for it), odd but valid (it must bind), or refused by the CRD schema (the API server
answers 422; nothing to do). Three good BindRequests are written during the storm and must bind within 10 s.

The bad ones include what once cost reservation pods or a worker before failing (issue 9, L6): a portion of "5",
"1e308" or "-0", duplicate groups, 500 groups, a Fraction BindRequest for a whole-GPU pod: each must now fail
before any side effect (the audit log shows no reservation pod created for it).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

import pytest
from binder_e2e_kit import make_pod, reservation_name
from faults_kit import APISERVER_REQUEST_TIMEOUT, Replicas, World, violations

from common import names
from common.kube.client import ApiError, bindrequest_path
from testbed.cluster.faults import read_audit
from testbed.cluster.kube import wait_for
from testbed.players.schedsim import bind_request_body

pytestmark = [pytest.mark.faults, pytest.mark.apiserver]


def mutate(kind: str, spec: dict[str, Any], meta: dict[str, Any], world: World) -> None:
    if kind == "no-pod":
        spec["podName"] = "nobody-" + uuid.uuid4().hex[:6]
    elif kind == "no-node":
        spec["selectedNode"] = "no-such-node"
    elif kind == "500-groups":
        spec["selectedGPUGroups"] = [f"g{i}" for i in range(500)]
    elif kind == "duplicate-groups":
        spec["selectedGPUGroups"] = ["dup", "dup"]
    elif kind == "no-groups":
        spec["selectedGPUGroups"] = []
    elif kind in ("portion-5", "portion-1e308", "portion--0"):
        spec["receivedGPU"]["portion"] = kind.split("-", 1)[1]
    elif kind == "owner-of-a-deleted-pod":
        meta["ownerReferences"][0]["uid"] = str(uuid.uuid4())
    elif kind == "fraction-for-a-whole-gpu-pod":
        pass  # the pod is made without the fraction annotations below
    elif kind == "missing-podname":
        del spec["podName"]
    elif kind == "missing-type":
        del spec["receivedResourceType"]
    elif kind in ("backoff-0", "backoff-max", "backoff--1"):
        spec["backoffLimit"] = {"backoff-0": 0, "backoff-max": 2**31 - 1, "backoff--1": -1}[kind]
    elif kind == "other-name":
        meta["name"] = meta["name"] + "-other"


BAD = ("no-pod", "no-node", "no-groups", "owner-of-a-deleted-pod", "missing-podname", "500-groups",
       "duplicate-groups", "portion-5", "portion-1e308", "portion--0", "fraction-for-a-whole-gpu-pod")
ODD_BUT_VALID = ("backoff-0", "backoff-max", "other-name")
# Refused by the schema, or accepted and then judged by the checker alone (no receivedResourceType reads as
# Regular, as in the reference).
EITHER = ("backoff--1", "missing-type")
NEEDS_FRACTION = ("500-groups", "duplicate-groups", "no-groups", "portion-5", "portion-1e308", "portion--0")


@pytest.mark.parametrize("world", [2], indirect=True)
def test_bad_input_fuzz_of_200_bind_requests(world: World) -> None:
    rng = random.Random(world.sim.seed)
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=1,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT))).start()
    written: dict[str, tuple[str, str, dict[str, Any]]] = {}  # BindRequest name -> (kind, pod, spec)
    refused: list[str] = []
    good: list[float] = []
    try:
        for i in range(200):
            if i % 60 == 30:
                good.append(write_good(world, f"good{i}"))
            kind = rng.choice(BAD + ODD_BUT_VALID + EITHER)
            fraction = kind in NEEDS_FRACTION or (rng.random() < 0.7 and kind != "fraction-for-a-whole-gpu-pod")
            pod = make_pod(world.client, world.namespace, f"z{i}", fraction="0.5" if fraction else None)
            groups = world.sim.new_groups(1) if fraction or kind == "fraction-for-a-whole-gpu-pod" else None
            body = bind_request_body(pod, world.nodes[i % 2], groups, 0.5 if groups else None)
            mutate(kind, body["spec"], body["metadata"], world)
            try:
                world.client.create(bindrequest_path(world.namespace), body)
            except ApiError as error:
                assert error.status == 422, error
                refused.append(kind)
                continue
            written[body["metadata"]["name"]] = (kind, f"z{i}", body["spec"])
        bad = {name: w for name, w in written.items() if w[0] in BAD}
        (world.workdir / "fuzz.json").write_text(json.dumps(written, indent=1))  # for a post-mortem

        def not_failed() -> list[tuple[str, str, dict[str, Any]]]:
            items = world.client.get(bindrequest_path(world.namespace)).get("items") or []
            status = {br["metadata"]["name"]: (br.get("status") or {}) for br in items}
            return [(name, bad[name][0], status.get(name, {})) for name in bad
                    if not (status.get(name, {}).get("phase") == names.PHASE_FAILED and status[name].get("reason"))]

        deadline = time.monotonic() + 60
        while not_failed() and time.monotonic() < deadline:
            time.sleep(1)
        left = not_failed()
        assert left == [], f"{len(left)} of {len(bad)} bad BindRequests not Failed with a reason after 60 s: {left}"
        valid_pods = [pod for kind, pod, _ in written.values() if kind in ODD_BUT_VALID]
        wait_all_bound_valid(world, valid_pods)
        def unwarned() -> list[tuple[str, str]]:
            events = world.client.get(f"/api/v1/namespaces/{world.namespace}/events").get("items") or []
            # On the pod when there is one, else on the BindRequest itself.
            warned = {(e["involvedObject"].get("kind"), e["involvedObject"].get("name")) for e in events
                      if e.get("type") == "Warning"}
            return [(name, kind) for name, (kind, _, spec) in bad.items()
                    if (names.BINDREQUEST_KIND, name) not in warned and ("Pod", spec.get("podName")) not in warned]

        deadline = time.monotonic() + 15
        while unwarned() and time.monotonic() < deadline:
            time.sleep(1)
        assert unwarned() == [], "bad BindRequests without a Warning event"
    finally:
        replicas.stop()
    created = {e["objectRef"].get("name") for e in world_audit(world) if e["verb"] == "create"
               and e["objectRef"].get("resource") == "pods" and not e["objectRef"].get("subresource")
               and e["objectRef"].get("namespace") == world.reservation_namespace}
    for name, (kind, _, spec) in bad.items():
        for group in spec.get("selectedGPUGroups") or []:
            assert reservation_name(spec.get("selectedNode", ""), group) not in created, (name, kind)
    print(f"fuzz: {len(written)} written ({len(bad)} bad), {len(refused)} refused by the schema "
          f"({sorted(set(refused))}); good ones bound in {[round(t, 1) for t in good]} s")
    assert max(good) <= 10.0
    must_bind = {pod for kind, pod, _ in written.values() if kind in ODD_BUT_VALID}
    scene = world.scene(binder_logs=replicas.logs,
                        invalid_pods={(world.namespace, f"z{i}") for i in range(200)} - {
                            (world.namespace, pod) for pod in must_bind})
    assert violations(world.client, world.plane, scene) == []


def write_good(world: World, name: str) -> float:
    pod = make_pod(world.client, world.namespace, name, fraction="0.5")
    started = time.monotonic()
    world.client.create(bindrequest_path(world.namespace),
                        bind_request_body(pod, world.nodes[0], world.sim.new_groups(1), 0.5))
    wait_for(f"good BindRequest {name} bound", lambda: world.client.get(
        f"/api/v1/namespaces/{world.namespace}/pods/{name}")["spec"].get("nodeName"), timeout=30)
    return time.monotonic() - started


def wait_all_bound_valid(world: World, pods: list[str]) -> None:
    wait_for(f"{len(pods)} odd but valid BindRequests bound", lambda: all(
        world.client.get(f"/api/v1/namespaces/{world.namespace}/pods/{p}")["spec"].get("nodeName") for p in pods),
        timeout=60, interval=1)


def world_audit(world: World) -> list[dict[str, Any]]:
    return [e for e in read_audit(world.plane) if e["t_received"] >= world.started]

