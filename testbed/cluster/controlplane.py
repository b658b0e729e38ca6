"""A real Kubernetes control plane (etcd + kube-apiserver, optionally kube-controller-manager).

``ControlPlane`` starts the binaries built by tools/build-k8s.sh on free 127.0.0.1 ports, with its
own CA, serving certificate, service-account signing key, RBAC authorization and a static token
file.  Service-account identities (``system:serviceaccount:<ns>:<sa>``) get static tokens when they
are declared before ``start()``; identities asked for later are served by client certificates
signed by the same CA, so any user can be minted at any time. Webhooks may call only loopback URLs
(testbed/cluster/loopback_policy.py, installed and enforced before ``start()`` returns).
"""

from __future__ import annotations

import atexit
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from testbed.cluster import loopback_policy
from testbed.cluster.binaries import BinariesMissingError, binaries_dir, find_binary
from testbed.cluster.pki import CertificateAuthority, CertPair, write_service_account_key
from testbed.programs.procs import free_ports, spawn, tail, terminate

ADMIN_USER = "testbed-admin"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
# Identities that always get a static token, so most tests need not declare anything up front.
WELL_KNOWN_SERVICE_ACCOUNTS: tuple[tuple[str, str], ...] = (
    ("default", "default"),
    ("fracgpu-system", "fracgpu-admission"),
    ("fracgpu-system", "fracgpu-binder"),
    ("testbed", "tester"),
    ("testbed", "tester-2"),
)
GC_CONTROLLERS: tuple[str, ...] = ("garbage-collector-controller",)
# What the session's controller manager runs: the garbage collector, and the quota controller (it fills a
# ResourceQuota's status, without which the API server's quota admission refuses every pod the quota covers).
SESSION_CONTROLLERS: tuple[str, ...] = (*GC_CONTROLLERS, "resourcequota-controller")


class ControlPlaneError(RuntimeError):
    """The control plane failed to start or to become ready."""


@dataclass(frozen=True)
class User:
    """A Kubernetes identity with the credentials the test bed issued for it."""

    name: str
    groups: tuple[str, ...] = ()
    token: str | None = None
    client_cert: CertPair | None = None


def service_account_username(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def service_account_groups(namespace: str) -> tuple[str, ...]:
    return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


class ControlPlane:
    """etcd + kube-apiserver (+ optional kube-controller-manager) in a private directory."""

    def __init__(
        self,
        workdir: Path | str | None = None,
        service_accounts: Iterable[tuple[str, str]] = (),
        controller_manager: bool = False,
        start_timeout: float = 180.0,
        extra_apiserver_args: Iterable[str] = (),
        binaries: Path | None = None,
        pod_network_address: str | None = None,
    ) -> None:
        # Pods on real nodes (testbed/realnodes) reach the apiserver through the `kubernetes` Service, whose
        # endpoint is the advertised address: a loopback one is the pod's own. With an address here the
        # apiserver listens and advertises there (a private address of this machine), keeps that endpoint
        # (lease reconciler), and admits pods as a cluster does (ServiceAccount admission: token volumes).
        self.pod_network_address = pod_network_address
        self.address = pod_network_address or "127.0.0.1"
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fracgpu-cp-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.start_timeout = start_timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        self._binaries = binaries or binaries_dir()
        self._want_controller_manager = controller_manager
        self._started = False
        self._service_accounts: list[tuple[str, str]] = []
        for ns, sa in (*WELL_KNOWN_SERVICE_ACCOUNTS, *service_accounts):
            self.add_service_account(ns, sa)
        self._users: dict[str, User] = {}
        self._procs: list[_Process] = []
        self._ca: CertificateAuthority | None = None
        self.port = 0
        self.etcd_url = ""
        self.loopback_policy_seconds = 0.0  # how long the start waited for the loopback policy to be enforced

    # ----------------------------------------------------------------- declaring identities
    def add_service_account(self, namespace: str, name: str) -> None:
        """Give ``system:serviceaccount:<namespace>:<name>`` a static token (before ``start()`` only)."""
        if self._started:
            raise ControlPlaneError(
                "static tokens are read when kube-apiserver starts; declare service accounts before "
                "start(), or use service_account() which falls back to a client certificate"
            )
        if (namespace, name) not in self._service_accounts:
            self._service_accounts.append((namespace, name))

    # ----------------------------------------------------------------- accessors
    @property
    def service_accounts(self) -> list[tuple[str, str]]:
        """(namespace, name) of every service account that has a static token."""
        return list(self._service_accounts)

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def admin(self) -> User:
        return self._users[ADMIN_USER]

    @property
    def admin_kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    def user(self, name: str) -> User:
        return self._users[name]

    def service_account(self, namespace: str, name: str) -> User:
        """Credentials for a service-account identity: its static token, or a fresh client cert."""
        username = service_account_username(namespace, name)
        if username in self._users:
            return self._users[username]
        return self.client_cert_user(username, service_account_groups(namespace))

    def client_cert_user(self, name: str, groups: Iterable[str] = ()) -> User:
        """Mint (once) a client certificate for an arbitrary user; works while the server runs."""
        if name in self._users:
            return self._users[name]
        if self._ca is None:
            raise ControlPlaneError("start() the control plane before minting users")
        stem = "user-" + "".join(c if c.isalnum() else "-" for c in name)
        user = User(name, tuple(groups), client_cert=self._ca.issue_client(stem, name, tuple(groups)))
        self._users[name] = user
        return user

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        if self._started:
            return self
        try:
            etcd_bin = find_binary("etcd", self._binaries)
            apiserver_bin = find_binary("kube-apiserver", self._binaries)
            if self._want_controller_manager:
                find_binary("kube-controller-manager", self._binaries)
        except BinariesMissingError:
            self.stop()
            raise
        self._started = True
        atexit.register(self.stop)
        try:
            self._prepare_files()
            self._start_etcd(etcd_bin)
            self._start_apiserver(apiserver_bin)
            self._install_loopback_policy()
            if self._want_controller_manager:
                self.start_controller_manager()
        except BaseException:
            self.stop(keep_workdir=True)  # keep the logs for a post-mortem
            raise
        return self

    def stop(self, keep_workdir: bool = False) -> None:
        """Terminate every process group (SIGTERM, then SIGKILL) and remove a temp workdir."""
        for proc in reversed(self._procs):
            terminate(proc.popen)
        for proc in self._procs:
            proc.popen.wait()
        self._procs.clear()
        atexit.unregister(self.stop)
        if self._owns_workdir and not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._started = False

    def process(self, name: str) -> subprocess.Popen[bytes]:
        """The running child called ``name`` ("etcd", "kube-apiserver", "kube-controller-manager")."""
        return next(p.popen for p in self._procs if p.name == name)

    def respawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start ``name`` again with its original argv (same ports, same data directory) once it has exited.

        The previous log is kept as ``<name>.<n>.log``; testbed/cluster/faults.py waits for readiness.
        """
        old = next(p for p in self._procs if p.name == name)
        if old.popen.poll() is None:
            raise ControlPlaneError(f"{name} is still running (pid {old.popen.pid}); kill it first")
        old.log.rename(old.log.with_suffix(f".{len(list(self.logs_dir.glob(name + '.*.log')))}.log"))
        popen = spawn(list(old.popen.args), old.log, self.workdir)  # type: ignore[arg-type]
        self._procs[self._procs.index(old)] = _Process(name, popen, old.log)
        return popen

    def log_tails(self, lines: int = 40) -> str:
        """The last ``lines`` lines of every process log, for error messages."""
        parts = [f"logs in {self.logs_dir}:"]
        for log in sorted(self.logs_dir.glob("*.log")):
            parts.append(f"----- {log} (last {lines} lines) -----\n{tail(log, lines)}")
        return "\n".join(parts)

    # ----------------------------------------------------------------- internals
    def _prepare_files(self) -> None:
        pki = self.workdir / "pki"
        self._ca = CertificateAuthority(pki)
        self._serving = self._ca.issue_serving(
            "apiserver",
            ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"],
            sorted({"127.0.0.1", self.address, SERVICE_IP}),
        )
        write_service_account_key(pki / "sa.key", pki / "sa.pub")
        self.logs_dir.mkdir(exist_ok=True)
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)  # always a fresh cluster
        self.port, etcd_client, etcd_peer = free_ports(3)
        self._etcd_ports = (etcd_client, etcd_peer)
        self.etcd_url = f"http://127.0.0.1:{etcd_client}"
        users = [User(ADMIN_USER, ("system:masters",), secrets.token_hex(24))]
        for ns, sa in self._service_accounts:
            username = service_account_username(ns, sa)
            users.append(User(username, service_account_groups(ns), secrets.token_hex(24)))
        rows = []
        for i, user in enumerate(users):
            self._users[user.name] = user
            rows.append(f'{user.token},{user.name},uid-{i},"{",".join(user.groups)}"')
        token_file = pki / "tokens.csv"
        token_file.write_text("\n".join(rows) + "\n")
        token_file.chmod(0o600)
        self.write_kubeconfig(self.admin_kubeconfig)

    def _spawn(self, name: str, argv: list[str]) -> _Process:
        log = self.logs_dir / f"{name}.log"
        proc = _Process(name, spawn(argv, log, self.workdir), log)
        self._procs.append(proc)
        return proc

    def _wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error: object = "not ready"
        while True:
            for proc in self._procs:
                code = proc.popen.poll()
                if code is not None:
                    raise ControlPlaneError(
                        f"{proc.name} exited with status {code} while waiting for {what}\n" + self.log_tails()
                    )
            try:
                if check():
                    return
            except requests.RequestException as exc:
                last_error = exc
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"timed out after {timeout:.0f} s waiting for {what} (last: {last_error})\n"
                    + self.log_tails()
                )
            time.sleep(0.3)

    def _start_etcd(self, binary: Path) -> None:
        client, peer = self._etcd_ports
        peer_url = f"http://127.0.0.1:{peer}"
        self._spawn("etcd", [
            str(binary), "--name=testbed", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=testbed={peer_url}", "--initial-cluster-state=new",
            "--unsafe-no-fsync", "--log-level=warn",
        ])
        session = requests.Session()
        session.trust_env = False

        def healthy() -> bool:
            response = session.get(f"{self.etcd_url}/health", timeout=5)
            return response.status_code == 200 and response.json().get("health") == "true"

        self._wait("etcd /health", healthy, self.start_timeout)

    def _start_apiserver(self, binary: Path) -> None:
        pki = self.workdir / "pki"
        self._spawn("kube-apiserver", [
            str(binary),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}", f"--secure-port={self.port}",
            f"--tls-cert-file={self._serving.cert}", f"--tls-private-key-file={self._serving.key}",
            f"--client-ca-file={self.ca_file}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            *(("--disable-admission-plugins=TaintNodesByCondition", "--kubelet-preferred-address-types=InternalIP")
              if self.pod_network_address else
              ("--endpoint-reconciler-type=none", "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition")),
            "--allow-privileged=true",
            "--profiling=false",
            *self.extra_apiserver_args,
        ])
        session = self._admin_session()

        def ready() -> bool:
            return session.get(f"{self.url}/readyz", timeout=10).status_code == 200

        def default_namespace() -> bool:
            return session.get(f"{self.url}/api/v1/namespaces/default", timeout=10).status_code == 200

        self._wait("kube-apiserver /readyz", ready, self.start_timeout)
        self._wait("the default namespace", default_namespace, self.start_timeout)

    def _install_loopback_policy(self) -> None:
        """No webhook configuration may make the apiserver dial off this machine
        (testbed/cluster/loopback_policy.py)."""
        try:
            self.loopback_policy_seconds = loopback_policy.install(self._admin_session(), self.url)
        except (loopback_policy.LoopbackPolicyError, requests.RequestException) as error:
            raise ControlPlaneError(f"{error}\n{self.log_tails()}") from error

    def _admin_session(self) -> requests.Session:
        session = requests.Session()
        session.trust_env = False
        session.verify = str(self.ca_file)
        session.headers["Authorization"] = f"Bearer {self.admin.token}"
        return session

    def start_controller_manager(self, controllers: Iterable[str] = SESSION_CONTROLLERS,
                                 extra_args: Iterable[str] = ()) -> None:
        """Start kube-controller-manager running only ``controllers`` (default: the garbage collector and the
        quota controller)."""
        if any(p.name == "kube-controller-manager" for p in self._procs):
            return
        if self._ca is None:
            raise ControlPlaneError("start() the control plane before the controller manager")
        binary = find_binary("kube-controller-manager", self._binaries)
        serving = self._ca.issue_serving("controller-manager", ["localhost"], ["127.0.0.1"])
        (port,) = free_ports(1)
        kubeconfig = str(self.admin_kubeconfig)
        self._spawn("kube-controller-manager", [
            str(binary), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            f"--controllers={','.join(controllers)}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
            *extra_args,
        ])
        session = requests.Session()
        session.trust_env = False
        session.verify = str(self.ca_file)

        def healthy() -> bool:
            return session.get(f"https://127.0.0.1:{port}/healthz", timeout=10).status_code == 200

        self._wait("kube-controller-manager /healthz", healthy, self.start_timeout)

    # ----------------------------------------------------------------- kubeconfigs
    def write_kubeconfig(self, path: Path | str, user: User | None = None) -> Path:
        """Write a kubeconfig for ``user`` (default: the admin) that points at this apiserver."""
        user = user or self.admin
        credentials: dict[str, str] = {}
        if user.token:
            credentials["token"] = user.token
        elif user.client_cert:
            credentials["client-certificate"] = str(user.client_cert.cert)
            credentials["client-key"] = str(user.client_cert.key)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "testbed", "cluster": {
                "server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": user.name, "user": credentials}],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": user.name}}],
            "current-context": "testbed",
        }
        path = Path(path)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path
