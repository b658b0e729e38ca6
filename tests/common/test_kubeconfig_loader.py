"""common/kube/kubeconfig.py: kubeconfig files and the in-cluster account, read without the kubernetes package."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from common.kube import kubeconfig
from common.kube.client import KubeClient
from common.kube.kubeconfig import FileToken, KubeconfigError, NotInCluster, load

ROOT = Path(__file__).resolve().parents[2]


def write_config(path: Path, user: dict, cluster: dict | None = None, current: str | None = "ctx",
                 name: str = "c") -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster or {"server": f"https://{name}.example:6443"}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": name, "user": name}}],
    }
    if current:
        config["current-context"] = current
    path.write_text(yaml.safe_dump(config))
    return path


def test_token_and_a_ca_path_relative_to_the_kubeconfig(tmp_path):
    (tmp_path / "conf").mkdir()
    path = write_config(tmp_path / "conf" / "config", {"token": "abc"},
                        {"server": "https://10.0.0.1:6443", "certificate-authority": "pki/ca.crt"})
    credentials = load(str(path))
    assert credentials.host == "https://10.0.0.1:6443"
    assert credentials.token == "abc"
    assert credentials.ca_file == str(tmp_path / "conf" / "pki" / "ca.crt")
    assert credentials.verify is True
    assert credentials.cert_file is None


def test_inline_tls_material_goes_to_files_only_we_can_read(tmp_path):
    ca, cert, key = b"CA PEM", b"CERT PEM", b"KEY PEM"
    encoded = {name: base64.b64encode(value).decode() for name, value in (("ca", ca), ("cert", cert), ("key", key))}
    path = write_config(tmp_path / "config",
                        {"client-certificate-data": encoded["cert"], "client-key-data": encoded["key"]},
                        {"server": "https://h:1", "certificate-authority-data": encoded["ca"]})
    credentials = load(str(path))
    assert Path(credentials.ca_file).read_bytes() == ca
    assert Path(credentials.cert_file).read_bytes() == cert
    assert Path(credentials.key_file).read_bytes() == key
    assert stat.S_IMODE(Path(credentials.key_file).stat().st_mode) == 0o600
    assert credentials.token is None and credentials.token_source is None


def test_insecure_skip_verify_and_basic_auth(tmp_path):
    path = write_config(tmp_path / "config", {"username": "ann", "password": "pw"},
                        {"server": "https://h:1", "insecure-skip-tls-verify": True})
    credentials = load(str(path))
    assert credentials.verify is False
    assert credentials.token == "Basic " + base64.b64encode(b"ann:pw").decode()


def test_json_kubeconfig_needs_no_yaml(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"clusters": [{"name": "c", "cluster": {"server": "https://j:1"}}],
                                "contexts": [{"name": "x", "context": {"cluster": "c"}}],
                                "current-context": "x"}))
    credentials = load(str(path))
    assert credentials.host == "https://j:1"
    assert credentials.token is None  # a context without a user is anonymous


def test_kubeconfig_list_is_merged_first_wins_and_missing_files_are_skipped(tmp_path):
    first = write_config(tmp_path / "a", {"token": "first"}, name="shared", current=None)
    second = write_config(tmp_path / "b", {"token": "second"}, name="shared", current="ctx")
    listed = f"{tmp_path / 'missing'}:{first}:{second}"
    credentials = load(None, environ={"KUBECONFIG": listed})
    assert credentials.token == "first"  # the first file naming the user wins
    assert credentials.host == "https://shared.example:6443"


@pytest.mark.parametrize(("user", "cluster", "current", "message"), [
    ({"auth-provider": {"name": "gcp"}}, None, "ctx", "auth-provider"),
    ({"token": "t"}, {"server": "https://h:1", "tls-server-name": "other"}, "ctx", "tls-server-name"),
    ({"token": "t"}, {"server": "https://h:1", "proxy-url": "http://proxy:3128"}, "ctx", "proxy-url"),
    ({"token": "t"}, None, None, "no current-context"),
    ({"token": "t"}, None, "elsewhere", "context 'elsewhere' is not defined"),
])
def test_what_would_connect_elsewhere_or_as_someone_else_is_refused(tmp_path, user, cluster, current, message):
    path = write_config(tmp_path / "config", user, cluster, current=current)
    with pytest.raises(KubeconfigError, match=message):
        load(str(path))


def test_missing_kubeconfig_names_the_file(tmp_path):
    with pytest.raises(KubeconfigError, match=str(tmp_path / "nope")):
        load(str(tmp_path / "nope"))


def test_token_file_is_read_again_once_a_minute(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("one\n")
    now = [0.0]
    token = FileToken(token_file, clock=lambda: now[0])
    assert token() == "one"
    token_file.write_text("two\n")  # the kubelet rotated it
    now[0] = 59.0
    assert token() == "one"
    now[0] = 60.0
    assert token() == "two"


def test_token_file_of_a_kubeconfig_user(tmp_path):
    (tmp_path / "token").write_text("from-file")
    path = write_config(tmp_path / "config", {"tokenFile": "token"})
    credentials = load(str(path))
    assert credentials.token is None
    assert credentials.token_source() == "from-file"


def test_in_cluster_account_comes_first_and_ipv6_hosts_get_brackets(tmp_path):
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_text("CA")
    credentials = kubeconfig.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
                                        tmp_path)
    assert credentials.host == "https://[fd00::1]:443"
    assert credentials.ca_file == str(tmp_path / "ca.crt")
    assert credentials.token_source() == "sa-token"


def test_outside_a_pod_the_kubeconfig_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", tmp_path / "absent")
    with pytest.raises(NotInCluster):
        kubeconfig.in_cluster({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, tmp_path / "absent")
    path = write_config(tmp_path / "config", {"token": "kc"})
    assert load(None, environ={"KUBECONFIG": str(path)}).token == "kc"


def exec_plugin(tmp_path: Path, expires: str | None) -> Path:
    """A credential plugin that counts its runs and echoes what kubectl would pass it."""
    script = tmp_path / "bin" / "plugin"
    script.parent.mkdir()
    status = {"token": "exec-token"}
    if expires:
        status["expirationTimestamp"] = expires
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, pathlib, sys
        runs = pathlib.Path({str(tmp_path / "runs")!r})
        runs.write_text(runs.read_text() + "x" if runs.exists() else "x")
        pathlib.Path({str(tmp_path / "info")!r}).write_text(os.environ["KUBERNETES_EXEC_INFO"] + "\\n"
                                                         + os.environ["PLUGIN_ENV"] + " " + " ".join(sys.argv[1:]))
        print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                          "status": {json.dumps(status)}}}))
        """))
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(("expires", "runs"), [("2000-01-01T00:00:00Z", 3), ("2999-01-01T00:00:00Z", 1), (None, 1)])
def test_exec_plugin_token_is_cached_until_it_expires(tmp_path, expires, runs):
    exec_plugin(tmp_path, expires)
    path = write_config(tmp_path / "config", {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "./bin/plugin", "args": ["--region", "x"],
        "env": [{"name": "PLUGIN_ENV", "value": "set"}], "provideClusterInfo": True}})
    credentials = load(str(path))
    assert credentials.token_source() == "exec-token"
    assert credentials.token_source() == "exec-token"
    assert len((tmp_path / "runs").read_text()) == runs  # expired: re-run on every use
    info, args = (tmp_path / "info").read_text().split("\n")
    request = json.loads(info)
    assert request["kind"] == "ExecCredential" and request["spec"]["interactive"] is False
    assert request["spec"]["cluster"]["server"] == "https://c.example:6443"
    assert args == "set --region x"


def test_failing_exec_plugin_names_it(tmp_path):
    path = write_config(tmp_path / "config", {"exec": {"command": "false"}})
    with pytest.raises(KubeconfigError, match="exec plugin false exited 1"):
        load(str(path))


def test_kube_client_takes_its_credentials_from_the_loader(tmp_path):
    path = write_config(tmp_path / "config", {"token": "abc"},
                        {"server": "https://h:6443/", "certificate-authority": "/ca.crt"})
    client = KubeClient.from_kubeconfig(str(path), user_agent="t")
    assert client.host == "https://h:6443"
    assert client.connections.verify == "/ca.crt"
    assert client._request_headers()["Authorization"] == "Bearer abc"


def test_reservation_program_loads_without_the_kubernetes_package(tmp_path):
    """The slim reservation image has no `kubernetes`: importing it is made to fail, and the program's
    client still loads a kubeconfig; every third-party module it pulled in is in the reservation lock."""
    path = write_config(tmp_path / "config", {"token": "abc"})
    probe = textwrap.dedent(f"""\
        import importlib.abc, json, sys
        before = set(sys.modules)  # what the interpreter and site loaded, not the program
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "kubernetes":
                    raise ImportError("kubernetes is not in the reservation image")
        sys.meta_path.insert(0, Block())
        import binder.reservation.program as program
        program.KubeClient.from_kubeconfig({str(path)!r})
        print(json.dumps(sorted({{name.split(".")[0] for name in set(sys.modules) - before}})))
        """)
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert "kubernetes" not in loaded
    distributions = importlib.metadata.packages_distributions()
    pulled_in = {canonicalize_name(dist) for name in loaded - set(sys.stdlib_module_names)
                 for dist in distributions.get(name, ())} - {"fracgpu"}
    locked = {canonicalize_name(name) for name in
              re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", (ROOT / "requirements" / "reservation.lock").read_text(),
                         re.MULTILINE)}
    assert pulled_in <= locked, pulled_in - locked
    assert "urllib3" in pulled_in and "requests" not in pulled_in  # the client is urllib3 alone


def test_own_namespace_is_pod_namespace_then_the_service_account_file_then_the_fallback(tmp_path):
    assert kubeconfig.own_namespace("fallback", {"POD_NAMESPACE": "from-env"}, tmp_path) == "from-env"
    assert kubeconfig.own_namespace("fallback", {}, tmp_path) == "fallback"  # outside a cluster: no file
    (tmp_path / "namespace").write_text("from-file\n")
    assert kubeconfig.own_namespace("fallback", {}, tmp_path) == "from-file"
    (tmp_path / "namespace").write_text("  \n")
    assert kubeconfig.own_namespace("fallback", {}, tmp_path) == "fallback"
