"""Where the API server is and who we are, read from a kubeconfig or the in-cluster service account.

This reads credentials with the standard library, `requests`' needs in mind (files for TLS material), and
PyYAML only when a kubeconfig file is YAML: no `kubernetes` package. That package (about 126 MB installed)
was used for nothing else by the programs, and the reservation program runs from a slim image on every GPU
node that carries only NVML and `requests`.

What it understands is what the programs meet:

* in-cluster: `KUBERNETES_SERVICE_HOST` / `_PORT` and the mounted service-account token and CA; the token is a
  projected one the kubelet rotates, so it is re-read once a minute, as client-go does;
* kubeconfig files: `$KUBECONFIG` may list several, merged as kubectl merges them (the first file naming a
  cluster, user or context wins; the first `current-context` wins); relative paths are relative to the file
  that holds them. Clusters: `server`, `certificate-authority(-data)`, `insecure-skip-tls-verify`. Users:
  `token`, `tokenFile`, `client-certificate(-data)`, `client-key(-data)`, `username` / `password`, and `exec`
  credential plugins (how EKS, GKE and AKS kubeconfigs authenticate), re-run when their token expires.

Refused with a message naming the field, rather than connecting somewhere else or as someone else than the
file says: `auth-provider` (removed from kubectl in 1.26), `tls-server-name` and `proxy-url`.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0  # client-go re-reads a projected token file about this often
EXEC_TIMEOUT_S = 60.0
UNSUPPORTED_CLUSTER_FIELDS = ("tls-server-name", "proxy-url")


class KubeconfigError(ValueError):
    """The configuration cannot be used; the message names the file and the field."""


class NotInCluster(KubeconfigError):
    """No in-cluster service account here (no KUBERNETES_SERVICE_HOST/PORT, or no token file)."""


@dataclass(frozen=True)
class Credentials:
    """What a client needs to reach the API server: TLS material as files, a token or a token source."""

    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    token: str | None = None
    token_source: Callable[[], str | None] | None = None


def own_namespace(fallback: str, environ: Mapping[str, str] | None = None,
                  directory: Path = SERVICE_ACCOUNT_DIR) -> str:
    """The namespace this program runs in: POD_NAMESPACE (the downward API), else the in-cluster service
    account's namespace file, else `fallback` (outside a cluster)."""
    environ = os.environ if environ is None else environ
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    try:
        return (directory / "namespace").read_text().strip() or fallback
    except OSError:
        return fallback


def load(path: str | None = None, environ: Mapping[str, str] | None = None,
         context: str | None = None) -> Credentials:
    """`path`; with None, the in-cluster service account, then $KUBECONFIG, then ~/.kube/config. A `context`
    names a kubeconfig context instead of the current one (and so skips the in-cluster service account)."""
    environ = os.environ if environ is None else environ
    if path:
        return from_kubeconfig([Path(path)], context)
    if not context:
        try:
            return in_cluster(environ)
        except NotInCluster:
            pass
    listed = [Path(p) for p in (environ.get("KUBECONFIG") or "").split(os.pathsep) if p]
    return from_kubeconfig(listed or [Path.home() / ".kube" / "config"], context)


# ---------------------------------------------------------------------------------------------- in-cluster
class FileToken:
    """A token file read again once it is older than `max_age` seconds (the kubelet rotates it in place)."""

    def __init__(self, path: Path, max_age: float = TOKEN_REREAD_S, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._read_at = 0.0

    def __call__(self) -> str | None:
        with self._lock:
            now = self._clock()
            if self._token is None or now - self._read_at >= self.max_age:
                self._token = self.path.read_text().strip() or None
                self._read_at = now
            return self._token


def in_cluster(environ: Mapping[str, str], directory: Path = SERVICE_ACCOUNT_DIR) -> Credentials:
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token_file = directory / "token"
    if not host or not port or not token_file.is_file():
        raise NotInCluster("not running in a pod: KUBERNETES_SERVICE_HOST/PORT or the service-account token "
                           f"{token_file} is missing")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ca_file = directory / "ca.crt"
    token = FileToken(token_file)
    token()  # an unreadable token fails here, at start, not at the first request
    return Credentials(f"https://{host}:{port}", ca_file=str(ca_file) if ca_file.is_file() else None,
                       token_source=token)


# ---------------------------------------------------------------------------------------------- kubeconfig
def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as error:
        raise KubeconfigError(f"kubeconfig {path}: {error.strerror or error}") from error
    try:
        document = json.loads(text)  # JSON is YAML too; try it first so YAML stays an optional import
    except ValueError:
        import yaml  # only kubeconfig files need it; the in-cluster path never imports it

        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise KubeconfigError(f"kubeconfig {path}: not YAML: {error}") from error
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a mapping")
    return document


def _resolve(value: str | None, base: Path) -> str | None:
    if not value:
        return value
    candidate = Path(value).expanduser()
    return str(candidate if candidate.is_absolute() else base / candidate)


def _entries(document: dict[str, Any], section: str, key: str, path: Path) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for entry in document.get(section) or []:
        if not isinstance(entry, dict) or "name" not in entry:
            raise KubeconfigError(f"kubeconfig {path}: an entry of {section} has no name")
        body = dict(entry.get(key) or {})
        body["_base"] = path.parent  # relative paths in this entry are relative to its own file
        found.setdefault(str(entry["name"]), body)
    return found


def merged(paths: list[Path]) -> dict[str, Any]:
    """The kubeconfig files merged as kubectl does: first name wins, first current-context wins."""
    result: dict[str, Any] = {"clusters": {}, "users": {}, "contexts": {}, "current-context": ""}
    present = [path for path in paths if path.is_file()] if len(paths) > 1 else paths
    if not present:
        raise KubeconfigError(f"no kubeconfig found in {os.pathsep.join(map(str, paths))}")
    for path in present:
        document = _read(path)
        for section, key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            for name, body in _entries(document, section, key, path).items():
                result[section].setdefault(name, body)
        if not result["current-context"]:
            result["current-context"] = document.get("current-context") or ""
    result["files"] = present
    return result


def from_kubeconfig(paths: list[Path], context_name: str | None = None) -> Credentials:
    config = merged(paths)
    where = os.pathsep.join(map(str, config["files"]))
    context_name = context_name or config["current-context"]
    if not context_name:
        raise KubeconfigError(f"kubeconfig {where}: no current-context")
    context = config["contexts"].get(context_name)
    if context is None:
        raise KubeconfigError(f"kubeconfig {where}: context {context_name!r} is not defined")
    cluster = config["clusters"].get(context.get("cluster") or "")
    if cluster is None or not cluster.get("server"):
        raise KubeconfigError(f"kubeconfig {where}: context {context_name!r} names no cluster with a server")
    for field in UNSUPPORTED_CLUSTER_FIELDS:
        if cluster.get(field):
            raise KubeconfigError(f"kubeconfig {where}: cluster field {field!r} is not supported")
    user = config["users"].get(context.get("user") or "", {"_base": Path(".")})
    ca_file = _material(cluster, "certificate-authority", where)
    credentials = _user_credentials(user, cluster, where)
    return Credentials(
        str(cluster["server"]),
        ca_file=ca_file,
        verify=not bool(cluster.get("insecure-skip-tls-verify")),
        **credentials,
    )


def _material(entry: dict[str, Any], field: str, where: str) -> str | None:
    """A file holding `field` (a path) or `field-data` (base64), which requests can hand to OpenSSL."""
    data = entry.get(f"{field}-data")
    if data:
        try:
            return _private_file(base64.b64decode(data, validate=True), field)
        except ValueError as error:
            raise KubeconfigError(f"kubeconfig {where}: {field}-data is not base64: {error}") from error
    return _resolve(entry.get(field), entry["_base"])


def _user_credentials(user: dict[str, Any], cluster: dict[str, Any], where: str) -> dict[str, Any]:
    if user.get("auth-provider"):
        raise KubeconfigError(f"kubeconfig {where}: user field 'auth-provider' is not supported (kubectl removed "
                              "it in 1.26); use an exec credential plugin")
    found: dict[str, Any] = {"cert_file": _material(user, "client-certificate", where),
                             "key_file": _material(user, "client-key", where)}
    if user.get("token"):
        found["token"] = str(user["token"])
    elif user.get("tokenFile"):
        found["token_source"] = FileToken(Path(_resolve(user["tokenFile"], user["_base"]) or ""))
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password') or ''}".encode()
        found["token"] = "Basic " + base64.b64encode(pair).decode()
    elif user.get("exec"):
        plugin = ExecPlugin(user["exec"], user["_base"], cluster, where)
        status = plugin.status()
        if status.get("clientCertificateData") and status.get("clientKeyData"):
            found["cert_file"] = _private_file(status["clientCertificateData"].encode(), "exec-client-certificate")
            found["key_file"] = _private_file(status["clientKeyData"].encode(), "exec-client-key")
        if status.get("token"):
            found["token_source"] = plugin.token
    return found


# ---------------------------------------------------------------------------------------------- exec plugins
class ExecPlugin:
    """An exec credential plugin (client.authentication.k8s.io): run it, cache its answer until it expires."""

    def __init__(self, spec: dict[str, Any], base: Path, cluster: dict[str, Any], where: str) -> None:
        self.where = where
        command = str(spec.get("command") or "")
        if not command:
            raise KubeconfigError(f"kubeconfig {where}: exec has no command")
        # kubectl: a command with a path separator is relative to the kubeconfig; a bare name is looked up in PATH.
        self.argv = [_resolve(command, base) if os.sep in command else command, *map(str, spec.get("args") or [])]
        self.api_version = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1")
        self.env = {str(e["name"]): str(e.get("value", "")) for e in spec.get("env") or []}
        request: dict[str, Any] = {"interactive": False}
        if spec.get("provideClusterInfo"):
            request["cluster"] = {k: v for k, v in cluster.items() if not k.startswith("_")}
        self.request = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": request}
        self._lock = threading.Lock()
        self._status: dict[str, Any] | None = None
        self._expires: datetime | None = None

    def _run(self) -> dict[str, Any]:
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(self.request)}
        try:
            result = subprocess.run(self.argv, env=env, capture_output=True, text=True, timeout=EXEC_TIMEOUT_S,
                                    stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise KubeconfigError(f"kubeconfig {self.where}: exec plugin {self.argv[0]}: {error}") from error
        if result.returncode != 0:
            raise KubeconfigError(f"kubeconfig {self.where}: exec plugin {self.argv[0]} exited "
                                  f"{result.returncode}: {result.stderr.strip()[-500:]}")
        try:
            status = json.loads(result.stdout)["status"]
        except (ValueError, KeyError, TypeError) as error:
            raise KubeconfigError(f"kubeconfig {self.where}: exec plugin {self.argv[0]} printed no "
                                  "ExecCredential status") from error
        if not isinstance(status, dict):
            raise KubeconfigError(f"kubeconfig {self.where}: exec plugin {self.argv[0]}: status is not a mapping")
        return status

    def status(self) -> dict[str, Any]:
        with self._lock:
            now = datetime.now(UTC)
            if self._status is None or (self._expires is not None and now >= self._expires):
                self._status = self._run()
                stamp = self._status.get("expirationTimestamp")
                self._expires = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None
            return self._status

    def token(self) -> str | None:
        return self.status().get("token")


# ---------------------------------------------------------------------------------------------- files
_private_dir: str | None = None
_private_lock = threading.Lock()


def _private_file(content: bytes, stem: str) -> str:
    """Write inline TLS material to a file only this user can read, removed when the process exits."""
    global _private_dir
    with _private_lock:
        if _private_dir is None:
            _private_dir = tempfile.mkdtemp(prefix="fracgpu-kubeconfig-")
            atexit.register(shutil.rmtree, _private_dir, True)
        handle, name = tempfile.mkstemp(prefix=f"{stem}-", dir=_private_dir)
    with os.fdopen(handle, "wb") as file:
        file.write(content)
    return name
