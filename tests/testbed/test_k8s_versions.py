"""The one setting that chooses the test bed's Kubernetes version (FRACGPU_K8S_VERSION, tools/k8s/versions.tsv):
the build script and the test bed read the same table, refuse a version it does not list, and refuse a binary
cache that holds another version's binaries, naming the version found and the one expected."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from testbed.cluster import binaries
from testbed.cluster.binaries import (
    REPO_ROOT,
    UnsupportedVersionError,
    find_binary,
    selected_release,
    supported_releases,
)
from testbed.cluster.features import gate_flags, gate_specs

BUILD = REPO_ROOT / "tools" / "build-k8s.sh"


def test_the_table_has_one_default_and_the_compatibility_version_with_their_modules():
    releases = supported_releases()
    assert [(r.version, r.role) for r in releases] == [("v1.37.2", "default"), ("v1.35.4", "compatibility")]
    for release in releases:
        k8s_mod = (REPO_ROOT / "tools" / "k8s" / release.version / "go.mod").read_text()
        assert f"k8s.io/kubernetes {release.version}" in k8s_mod
        assert f"k8s.io/api => k8s.io/api v0.{release.minor}.{release.version.rsplit('.', 1)[1]}" in k8s_mod
        etcd_mod = (REPO_ROOT / "tools" / "etcd" / release.etcd / "go.mod").read_text()
        assert f"go.etcd.io/etcd/server/v3 {release.etcd}" in etcd_mod


def test_selection_by_setting_with_or_without_the_v():
    assert selected_release("").version == "v1.37.2"
    assert selected_release("v1.35.4").etcd == "v3.6.16"
    assert selected_release("1.35.4").version == "v1.35.4"
    with pytest.raises(UnsupportedVersionError, match=r"FRACGPU_K8S_VERSION=v1.36.0 is not a supported .*"
                                                      r"expected one of: v1.37.2, v1.35.4"):
        selected_release("v1.36.0")


def _fake_binary(directory: Path, name: str, output: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{output}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_binary_of_another_version_is_refused_naming_both(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(binaries, "K8S_VERSION", "v1.37.2")
    monkeypatch.setattr(binaries, "ETCD_VERSION", "v3.7.0")
    _fake_binary(tmp_path, "kube-apiserver", "Kubernetes v1.35.4")
    with pytest.raises(UnsupportedVersionError, match=r"kube-apiserver is version v1.35.4, expected v1.37.2"):
        find_binary("kube-apiserver", tmp_path)
    _fake_binary(tmp_path, "etcd", "etcd Version: 3.6.16\nGit SHA: x")
    with pytest.raises(UnsupportedVersionError, match=r"etcd is version v3.6.16, expected v3.7.0"):
        find_binary("etcd", tmp_path)


def test_every_binary_found_is_announced_with_its_version(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(binaries, "K8S_VERSION", "v1.37.2")
    path = _fake_binary(tmp_path, "kubelet", "Kubernetes v1.37.2")
    assert find_binary("kubelet", tmp_path) == path
    assert f"[testbed] kubelet v1.37.2 ({path})" in capsys.readouterr().err


def _build(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(BUILD)], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60)


def test_build_script_refuses_an_unsupported_version():
    result = _build({"FRACGPU_K8S_VERSION": "v1.36.0"})
    assert result.returncode == 2
    assert "FRACGPU_K8S_VERSION=v1.36.0 is not a supported Kubernetes version; expected one of: v1.37.2 v1.35.4" \
        in result.stderr


def test_build_script_refuses_a_cache_of_another_version(tmp_path):
    (tmp_path / "VERSION").write_text("kubernetes v1.35.4 etcd v3.6.16\n")
    result = _build({"FRACGPU_K8S_VERSION": "v1.37.2", "FRACGPU_K8S_CACHE": str(tmp_path)})
    assert result.returncode == 1
    assert "holds 'kubernetes v1.35.4 etcd v3.6.16', expected 'kubernetes v1.37.2 etcd v3.7.0'" in result.stderr


def test_build_script_refuses_an_unstamped_cache_whose_apiserver_is_another_version(tmp_path):
    _fake_binary(tmp_path, "kube-apiserver", "Kubernetes v1.35.4")
    result = _build({"FRACGPU_K8S_VERSION": "v1.37.2", "FRACGPU_K8S_CACHE": str(tmp_path)})
    assert result.returncode == 1
    assert "kube-apiserver is Kubernetes v1.35.4, expected v1.37.2" in result.stderr


@pytest.mark.parametrize(("version", "wanted", "flags"), [
    ("v1.35.4", {"DRAExtendedResource": True}, ["--feature-gates=DRAExtendedResource=true"]),  # alpha, off
    ("v1.37.2", {"DRAExtendedResource": True}, []),  # GA, locked on: passing it is not needed
    ("v1.35.4", {"DRAConsumableCapacity": True, "DRAExtendedResource": True},
     ["--feature-gates=DRAConsumableCapacity=true,DRAExtendedResource=true"]),
    ("v1.37.2", {"DRAConsumableCapacity": True}, []),  # beta, on by default from 1.36
    ("v1.37.2", {"DRAConsumableCapacity": False}, ["--feature-gates=DRAConsumableCapacity=false"]),
])
def test_feature_gates_are_read_from_each_versions_own_source(version, wanted, flags):
    assert gate_flags(wanted, version) == flags


def test_a_gate_a_version_lacks_or_locks_is_refused():
    assert "SchedulerQueueingHints" in gate_specs("v1.35.4")  # removed by 1.37: passing it would stop the binary
    with pytest.raises(ValueError, match="Kubernetes v1.37.2 has no feature gate SchedulerQueueingHints"):
        gate_flags({"SchedulerQueueingHints": True}, "v1.37.2")
    with pytest.raises(ValueError, match="Kubernetes v1.37.2 locks DRAExtendedResource to true"):
        gate_flags({"DRAExtendedResource": False}, "v1.37.2")
    specs = gate_specs("v1.37.2")
    assert specs["DynamicResourceAllocation"].stage == "GA" and specs["DynamicResourceAllocation"].locked
