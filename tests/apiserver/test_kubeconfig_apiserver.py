"""KubeClient.from_kubeconfig (common/kube/kubeconfig.py, no kubernetes package) against the real apiserver: the
identity the server sees is the one the kubeconfig names, for each way a kubeconfig can carry it."""

from __future__ import annotations

import base64
import json
import sys
import textwrap

import pytest
import yaml

from common.kube.client import KubeClient

pytestmark = pytest.mark.apiserver


def whoami(client: KubeClient) -> str:
    review = client.create("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return review["status"]["userInfo"]["username"]


def kubeconfig(path, control_plane, user: dict) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "tb",
        "clusters": [{"name": "tb", "cluster": {
            "server": control_plane.url,
            "certificate-authority-data": base64.b64encode(control_plane.ca_file.read_bytes()).decode()}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "tb", "context": {"cluster": "tb", "user": "u"}}]}))
    return str(path)


def test_inline_client_certificate(control_plane, tmp_path):
    user = control_plane.client_cert_user("kubeconfig-inline-user", ["testers"])
    data = {"client-certificate-data": base64.b64encode(user.client_cert.cert.read_bytes()).decode(),
            "client-key-data": base64.b64encode(user.client_cert.key.read_bytes()).decode()}
    client = KubeClient.from_kubeconfig(kubeconfig(tmp_path / "config", control_plane, data))
    assert whoami(client) == "kubeconfig-inline-user"


def test_exec_credential_plugin_token(control_plane, tmp_path):
    sa = control_plane.service_account("testbed", "tester")
    plugin = tmp_path / "plugin"
    plugin.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json
        print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                          "status": {{"token": {json.dumps(sa.token)}}}}}))
        """))
    plugin.chmod(0o755)
    config = kubeconfig(tmp_path / "config", control_plane,
                        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "./plugin"}})
    assert whoami(KubeClient.from_kubeconfig(config)) == "system:serviceaccount:testbed:tester"


def test_test_bed_kubeconfig_with_token_and_ca_file(control_plane):
    assert whoami(KubeClient.from_kubeconfig(str(control_plane.admin_kubeconfig))) == "testbed-admin"
