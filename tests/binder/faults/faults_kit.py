"""The fault suite's kit: binder replicas as supervised child processes, a workload, and the checker's call.

`Replicas` runs `python -m binder` processes, each as its own user (a client certificate `binder-<x>` in
system:masters), so the apiserver's audit log tells their writes apart. A supervisor restarts a replica whose
process exited, as the kubelet would (restartPolicy Always), unless the test stopped it on purpose.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from binder.leader import lease_path
from common import names
from common.kube.client import ApiError, KubeClient, bindrequest_path, pod_path
from testbed.checks.invariants import Scene, check
from testbed.cluster.controlplane import ControlPlane, service_account_username
from testbed.cluster.faults import read_audit
from testbed.cluster.kube import WaitTimeout, wait_for
from testbed.players.schedsim import SchedulerSimulator
from testbed.proxies.faultproxy import HttpFaultProxy

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "binder" / "e2e"))  # the e2e kit: NodePlayer, make_pod
from binder_e2e_kit import NodePlayer  # noqa: E402

# The apiserver's own deadline for a request, scaled down from 60 s so ambiguous outcomes settle quickly.
APISERVER_REQUEST_TIMEOUT = 20
# Replicas behind an HTTP fault proxy need a bearer token (the proxy re-originates requests): these service
# accounts get static tokens and cluster-admin on the fault plane.
BINDER_SERVICE_ACCOUNTS = (("fracgpu-system", "binder-a"), ("fracgpu-system", "binder-b"))
LEASE = "2ad35f9c.kai.scheduler"
PRODUCTION_LEASE = (15.0, 10.0, 2.0)  # duration, renew deadline, retry period
log = logging.getLogger("faults")
P = TypeVar("P", bound=HttpFaultProxy)


@dataclass
class Replica:
    identity: str
    kubeconfig: Path
    log_dir: Path
    popen: subprocess.Popen | None = None
    incarnations: int = 0
    held: bool = False  # stopped on purpose: the supervisor leaves it down
    logs: list[Path] = field(default_factory=list)


class Replicas:
    def __init__(self, plane: ControlPlane, workdir: Path, reservation_namespace: str, lease_namespace: str,
                 count: int = 2, lease: tuple[float, float, float] = PRODUCTION_LEASE,
                 extra: tuple[str, ...] = (), kubeconfigs: list[Path] | None = None,
                 replica_extra: dict[str, tuple[str, ...]] | None = None, env: dict[str, str] | None = None,
                 fresh_identity: bool = False) -> None:
        """`replica_extra`: more flags for one replica (by identity), after `extra`; `env`: more environment;
        `fresh_identity`: each incarnation elects as `<identity>-<incarnation>`, as a restarted container does in
        production (hostname_uuid), so it cannot take back at once the lease its killed predecessor held."""
        self.plane = plane
        self.fresh_identity = fresh_identity
        self.replica_extra = dict(replica_extra or {})
        self.env = dict(env or {})
        self.lease = lease
        self.lease_namespace = lease_namespace
        self.argv = ["--resource-reservation-namespace", reservation_namespace,
                     "--leader-election-namespace", lease_namespace,
                     "--leader-election-lease-duration", str(lease[0]),
                     "--leader-election-renew-deadline", str(lease[1]),
                     "--leader-election-retry-period", str(lease[2]),
                     "--health-probe-bind-address", "127.0.0.1:0", "--metrics-bind-address", "0",
                     "--rate-limiter-base-delay", "0.2", "--rate-limiter-max-delay", "2", *extra]
        if count > 1 or "--leader-elect" in extra:
            self.argv.append("--leader-elect")
        self.replicas: list[Replica] = []
        for i in range(count):
            identity = f"binder-{chr(ord('a') + i)}"
            if kubeconfigs:
                kubeconfig = kubeconfigs[i]
            else:
                user = plane.client_cert_user(identity, ("system:masters",))
                kubeconfig = plane.write_kubeconfig(workdir / f"{identity}.kubeconfig", user)
            self.replicas.append(Replica(identity, kubeconfig, workdir))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="replica-supervisor", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Replicas:
        for replica in self.replicas:
            self._spawn(replica)
        self._supervisor.start()
        return self

    def _spawn(self, replica: Replica) -> None:
        replica.incarnations += 1
        path = replica.log_dir / f"{replica.identity}.{replica.incarnations}.log"
        replica.logs.append(path)
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.env}
        with open(path, "wb") as out:
            replica.popen = subprocess.Popen(
                [sys.executable, "-m", "binder", "--kubeconfig", str(replica.kubeconfig),
                 "--identity", self.election_identity(replica), *self.argv,
                 *self.replica_extra.get(replica.identity, ())],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        log.info("binder replica started", extra={"fields": {"identity": replica.identity,
                                                             "pid": replica.popen.pid,
                                                             "incarnation": replica.incarnations}})

    def _supervise(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                for replica in self.replicas:
                    if not replica.held and replica.popen is not None and replica.popen.poll() is not None:
                        self._spawn(replica)

    def stop(self) -> None:
        self._stop.set()
        self._supervisor.join(5)
        for replica in self.replicas:
            if replica.popen is not None and replica.popen.poll() is None:
                replica.popen.kill()
                replica.popen.wait(10)

    def election_identity(self, replica: Replica) -> str:
        return f"{replica.identity}-{replica.incarnations}" if self.fresh_identity else replica.identity

    # ------------------------------------------------------------------ faults
    def get(self, identity: str) -> Replica:
        return next(r for r in self.replicas if r.identity == identity)

    def signal(self, identity: str, signum: signal.Signals, hold: bool = False) -> None:
        with self._lock:
            replica = self.get(identity)
            replica.held = hold
            if replica.popen is not None and replica.popen.poll() is None:
                replica.popen.send_signal(signum)

    def resume(self, identity: str) -> None:
        """Let the supervisor restart a replica that was held down."""
        with self._lock:
            self.get(identity).held = False

    def killer(self, identity: str) -> Callable[[], None]:
        """A callable that SIGKILLs whatever process `identity` runs now (for testbed.proxies.crashproxy)."""
        return lambda: self.signal(identity, signal.SIGKILL)

    # ------------------------------------------------------------------ reading
    @property
    def logs(self) -> list[Path]:
        return [path for replica in self.replicas for path in replica.logs]

    @property
    def users(self) -> dict[str, float]:
        return {r.identity: self.lease[1] for r in self.replicas}

    def holder(self, client: KubeClient) -> str | None:
        """The replica (its identity, `binder-a`) whose process holds the lease now; None when none does."""
        try:
            holder = client.get(lease_path(self.lease_namespace, LEASE))["spec"].get("holderIdentity") or None
        except ApiError:
            return None
        return next((r.identity for r in self.replicas if r.popen is not None and self.election_identity(r) == holder),
                    None if self.fresh_identity else holder)


@dataclass
class World:
    plane: ControlPlane
    client: KubeClient
    namespace: str
    reservation_namespace: str
    lease_namespace: str
    nodes: list[str]
    player: NodePlayer
    sim: SchedulerSimulator
    workdir: Path
    started: float = field(default_factory=time.time)

    def scene(self, **kwargs: object) -> Scene:
        return Scene(namespaces=[self.namespace], reservation_namespace=self.reservation_namespace,
                     since=self.started, **kwargs)  # type: ignore[arg-type]


def replicas_behind_proxies(world: World, make_proxy: Callable[[str, int], P],
                            extra: tuple[str, ...] = ()) -> tuple[dict[str, P], Replicas]:
    """Two started replicas, each reaching the apiserver through its own HTTP fault proxy as its own service
    account, so the audit log names the replica behind every write. `make_proxy(token, index)` starts one."""
    proxies: dict[str, P] = {}
    for index, (namespace, identity) in enumerate(BINDER_SERVICE_ACCOUNTS):
        token = world.plane.service_account(namespace, identity).token
        assert token is not None
        proxies[identity] = make_proxy(token, index)
    kubeconfigs = [proxy.write_kubeconfig(world.workdir / f"{identity}.proxy.kubeconfig")
                   for identity, proxy in proxies.items()]
    replicas = Replicas(world.plane, world.workdir, world.reservation_namespace, world.lease_namespace, count=2,
                        kubeconfigs=kubeconfigs,
                        extra=("--apiserver-request-timeout", str(APISERVER_REQUEST_TIMEOUT), *extra)).start()
    return proxies, replicas


def stop_behind_proxies(proxies: dict[str, P], replicas: Replicas) -> None:
    replicas.stop()
    for proxy in proxies.values():
        proxy.stop()


def violations_behind_proxies(world: World, replicas: Replicas) -> list[str]:
    """The checker, told the replicas' audit-log users (their service accounts) and renew deadline for I6."""
    users = {service_account_username(ns, identity): replicas.lease[1] for ns, identity in BINDER_SERVICE_ACCOUNTS}
    return violations(world.client, world.plane, world.scene(replicas=users, binder_logs=replicas.logs))


def live_reservations(world: World, group: str | None = None) -> list[dict]:
    """Reservation pods that still hold a GPU (not finished, not being deleted); of one GPU group when given."""
    params = {"labelSelector": f"{names.GPU_GROUP_LABEL}={group}"} if group else None
    return [p for p in world.client.get(pod_path(world.reservation_namespace), params).get("items") or []
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")]


def terminal(bind_request: dict[str, Any]) -> bool:
    return (bind_request.get("status") or {}).get("phase") in (names.PHASE_SUCCEEDED, names.PHASE_FAILED)


def wait_all_bound(client: KubeClient, namespace: str, pods: list[str], timeout: float) -> float:
    """Wait until every pod is bound and every BindRequest in `namespace` is Succeeded; return the seconds."""
    started = time.monotonic()
    wanted = set(pods)

    def done() -> bool:
        try:
            pods = client.get(pod_path(namespace)).get("items") or []
            requests = client.get(bindrequest_path(namespace)).get("items") or []
        except ApiError as error:
            if not unanswered(error):
                raise
            return False  # the control plane is still recovering: the observer asks again
        bound = {p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")}
        return wanted <= bound and all((br.get("status") or {}).get("phase") == names.PHASE_SUCCEEDED
                                       for br in requests)

    wait_for(f"{len(wanted)} pods of {namespace} bound and reported", done, timeout, interval=0.5)
    took = time.monotonic() - started
    settle(client, namespace)
    return took


def unanswered(error: ApiError) -> bool:
    """A read the recovering control plane did not answer (timed out, refused, 5xx, throttled): the test's
    own observation, not the binder's, so it is asked again rather than failing the scenario."""
    return error.outcome_unknown or error.status == 429


def settle(client: KubeClient, namespace: str, timeout: float = 15.0) -> None:
    """Give the reports that follow a status write (PodBound condition, event) time to land; the checker then
    says what is still missing. Never fails by itself."""
    def conditions_written() -> bool:
        try:
            pods = client.get(pod_path(namespace)).get("items") or []
        except ApiError as error:
            if not unanswered(error):
                raise
            return False
        return all(any(c.get("type") == names.POD_BOUND_CONDITION for c in (p.get("status") or {}).get("conditions")
                       or []) for p in pods if p["spec"].get("nodeName"))

    try:
        wait_for("PodBound conditions", conditions_written, timeout, interval=0.5)
    except WaitTimeout:
        pass


def violations(client: KubeClient, plane: ControlPlane, scene: Scene) -> list[str]:
    """Run the checker; a violation list is printed so a failing run says why."""
    scene.audit = list(read_audit(plane))
    # Every pod a Succeeded BindRequest bound must carry its PodBound condition: success reports write it before
    # the status, so a replica that stops between the two leaves the BindRequest to the next leader.
    scene.require_condition = True
    found = check(client, scene)
    for line in found:
        print("VIOLATION", line)
    return found
