"""volumebinding (priority 300): bind a pod's PersistentVolumeClaims on the selected node (reference 9.9).

The inner `VolumeBinding` plugin runs inside the Kubernetes-plugin wrapper (k8swrapper.py):

* relevant for any pod with volumes; PreFilter skips pods whose volumes use no claims;
* PreFilter: every claim (incl. generic ephemeral `<pod>-<volume>`) exists, is not being deleted, and is
  bound or waits for its first consumer (an unbound Immediate-mode claim is an error);
* Filter: a bound claim's PV admits the node; each WaitForFirstConsumer claim gets a matching free PV
  (static) or, failing that, dynamic provisioning by its StorageClass on this node;
* Allocate: the chosen PVs are held in this process so concurrent attempts do not pick the same one;
* Bind: PV `claimRef` for static bindings, `volume.kubernetes.io/selected-node` for provisioning, then a
  watch until every claim is bound, up to `bindTimeoutSeconds`;
* UnAllocate: what Bind changed and nobody has acted on yet is taken back.

docs/volumebinding.md says which part of the upstream scheduler plugin this covers.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from binder.plugins.base import BindContext
from binder.plugins.k8swrapper import CycleState, Deadline, K8sPluginWrapper
from binder.plugins.volumebinding import apply
from binder.plugins.volumebinding import plan as vp

NAME = "volumebinding"
INNER_NAME = "VolumeBinding"
log = logging.getLogger("binder.plugins.volumebinding")

_CLASSIFIED, _CLASSES, _PLAN = "classified", "classes", "plan"
_SELECTED, _BOUND_PVS = "selected_claims", "bound_pvs"


class PvLedger:
    """PVs chosen by attempts in this process between Allocate and the end of their Bind writes."""

    def __init__(self) -> None:
        self._holders: dict[str, str] = {}
        self._lock = threading.Lock()

    def hold(self, holder: str, pv_names: list[str]) -> None:
        with self._lock:
            for name in pv_names:
                other = self._holders.get(name, holder)
                if other != holder:
                    raise vp.VolumeBindingError(f"persistentvolume {name} is being bound for another pod")
            for name in pv_names:
                self._holders[name] = holder

    def release(self, holder: str) -> None:
        with self._lock:
            for name in [n for n, h in self._holders.items() if h == holder]:
                del self._holders[name]

    def held(self) -> dict[str, str]:
        with self._lock:
            return dict(self._holders)


def _uid(ctx: BindContext) -> str:
    return (ctx.pod.get("metadata") or {}).get("uid", "")


class VolumeBinding:
    name = INNER_NAME

    def __init__(self, bind_timeout_seconds: int, ledger: PvLedger | None = None) -> None:
        self.bind_timeout_seconds = bind_timeout_seconds
        self.ledger = ledger or PvLedger()

    def is_relevant(self, ctx: BindContext) -> bool:
        return bool((ctx.pod.get("spec") or {}).get("volumes"))

    def pre_filter(self, ctx: BindContext, cycle: CycleState) -> bool:
        wanted = vp.pod_claims(ctx.pod)
        if not wanted:
            return True
        found = apply.read_claims(ctx.client, ctx.namespace, wanted)
        for claim in wanted:
            vp.check_claim(ctx.pod, claim, found[claim.name])
        claims = [claim for claim in found.values() if claim is not None]  # check_claim refused a missing one
        classes = apply.read_classes(ctx.client, claims)
        cycle[_CLASSIFIED] = vp.classify(claims, classes)
        cycle[_CLASSES] = classes
        return False

    def filter(self, ctx: BindContext, cycle: CycleState) -> None:
        classified: vp.Classified = cycle[_CLASSIFIED]
        for claim in classified.bound:
            vp.check_bound_volume(claim, apply.read_pv(ctx.client, claim["spec"]["volumeName"]), ctx.node)
        pvs = apply.list_pvs(ctx.client) if classified.delayed else []
        cycle[_PLAN] = vp.plan_delayed(classified.delayed, cycle[_CLASSES], pvs, ctx.node)

    def allocate(self, ctx: BindContext, cycle: CycleState) -> None:
        plan: vp.Plan = cycle[_PLAN]
        self.ledger.hold(_uid(ctx), [pv["metadata"]["name"] for _, pv in plan.bindings])

    def bind(self, ctx: BindContext, cycle: CycleState) -> None:
        plan: vp.Plan = cycle[_PLAN]
        if plan.empty:
            return
        deadline = Deadline(self.bind_timeout_seconds)
        selected: list[str] = cycle.setdefault(_SELECTED, [])
        bound_pvs: list[tuple[str, dict[str, Any]]] = cycle.setdefault(_BOUND_PVS, [])
        try:
            for claim, pv in plan.bindings:
                apply.bind_pv(ctx.client, claim, pv)
                bound_pvs.append((pv["metadata"]["name"], claim))
                log.info("persistentvolume %s bound to persistentvolumeclaim %s", pv["metadata"]["name"],
                         claim["metadata"]["name"])
            for claim in plan.provisions:
                if apply.select_node(ctx.client, claim, ctx.node_name):
                    selected.append(claim["metadata"]["name"])
                    log.info("persistentvolumeclaim %s: provisioning asked on the node", claim["metadata"]["name"])
        finally:
            self.ledger.release(_uid(ctx))  # the PVs' claimRefs now keep other binds away
        expected: dict[str, str | None] = {c["metadata"]["name"]: pv["metadata"]["name"] for c, pv in plan.bindings}
        expected.update({c["metadata"]["name"]: None for c in plan.provisions})
        apply.wait_until_bound(ctx.client, ctx.namespace, expected, ctx.node_name, deadline)
        for claim in plan.provisions:
            current = apply.read_claim(ctx.client, ctx.namespace, claim["metadata"]["name"])
            volume = ((current or {}).get("spec") or {}).get("volumeName", "")
            vp.check_bound_volume(current or claim, apply.read_pv(ctx.client, volume), ctx.node)

    def unallocate(self, ctx: BindContext, cycle: CycleState) -> None:
        self.ledger.release(_uid(ctx))
        selected: list[str] = cycle.get(_SELECTED) or []
        while selected:
            name = selected[-1]
            if apply.clear_selected_node(ctx.client, ctx.namespace, name, ctx.node_name):
                log.info("persistentvolumeclaim %s: provisioning request taken back", name)
            selected.pop()
        bound_pvs: list[tuple[str, dict[str, Any]]] = cycle.get(_BOUND_PVS) or []
        while bound_pvs:
            pv_name, claim = bound_pvs[-1]
            if apply.release_pv(ctx.client, pv_name, claim):
                log.info("persistentvolume %s released", pv_name)
            bound_pvs.pop()

    def post_bind(self, ctx: BindContext, cycle: CycleState) -> None:
        self.ledger.release(_uid(ctx))


class VolumeBindingPlugin(K8sPluginWrapper):
    """The binder plugin `volumebinding`: the wrapper around one VolumeBinding."""

    def __init__(self, bind_timeout_seconds: int, ledger: PvLedger | None = None) -> None:
        self.bind_timeout_seconds = bind_timeout_seconds
        self.volume_binding = VolumeBinding(bind_timeout_seconds, ledger)
        super().__init__(NAME, [self.volume_binding])
