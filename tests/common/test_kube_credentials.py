"""The client's rotating credentials: read through the kubeconfig loader's hook, but not on every request."""

from __future__ import annotations

from pathlib import Path

import yaml

from common.kube.client import TOKEN_REFRESH_S, KubeClient, cached_token_source


def test_a_rotating_token_is_read_again_once_per_period() -> None:
    reads, clock = [], [100.0]

    def read() -> str:
        reads.append(clock[0])
        return f"token-{len(reads)}"

    token = cached_token_source(read, period_s=60.0, clock=lambda: clock[0])
    assert [token() for _ in range(50)] == ["token-1"] * 50
    clock[0] += 59.9
    assert token() == "token-1"
    clock[0] += 0.2
    assert token() == "token-2"
    assert reads == [100.0, 160.1]


def test_a_kubeconfig_token_is_sent(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "secret"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    client = KubeClient.from_kubeconfig(str(kubeconfig))
    assert client._token_source is not None  # the loader's hook, behind the cache
    assert [client._auth_headers()["Authorization"] for _ in range(3)] == ["Bearer secret"] * 3
    assert TOKEN_REFRESH_S >= 30
