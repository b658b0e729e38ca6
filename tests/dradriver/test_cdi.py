"""Per-claim CDI specs (dradriver/cdi.py) and the preparer's answers (dradriver/preparer.py): written whole or not at
all, read back for a repeated prepare, removed once, and NVIDIA's device added where its generated spec has it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dradriver import cdi
from dradriver.claims import ClaimError
from dradriver.devices import Gpu
from dradriver.preparer import Preparer

GPUS = [Gpu(0, "GPU-aaaa", "NVIDIA A100", 40960), Gpu(1, "GPU-bbbb", "NVIDIA A100", 40960)]


def _claim(uid: str = "u1", *results: dict) -> dict:
    results = results or ({"driver": "gpu.fracgpu.io", "pool": "n1", "device": "gpu-1", "request": "gpu/size-0",
                           "shareID": "s-1", "consumedCapacity": {"memory": "10Gi"}},)
    return {"metadata": {"namespace": "team", "name": "c1", "uid": uid},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def _preparer(tmp_path: Path, claims: dict, nvidia: set[str] | None = None, reads: list | None = None) -> Preparer:
    def read(namespace: str, name: str) -> dict | None:
        if reads is not None:
            reads.append((namespace, name))
        return claims.get((namespace, name))

    return Preparer(pool="n1", read_claim=read, gpus=lambda: GPUS, cdi_dir=str(tmp_path / "cdi"),
                    nvidia_devices=lambda: nvidia or set())


def test_prepare_writes_one_spec_whose_device_carries_the_env(tmp_path: Path) -> None:
    preparer = _preparer(tmp_path, {("team", "c1"): _claim()}, nvidia={"GPU-bbbb", "all"})
    answer = preparer.prepare("team", "u1", "c1")
    assert answer == [{"request_names": ["gpu"], "pool_name": "n1", "device_name": "gpu-1", "share_id": "s-1",
                       "cdi_device_ids": ["fracgpu.io/claim=u1-gpu", "nvidia.com/gpu=GPU-bbbb"]}]
    files = sorted(os.listdir(tmp_path / "cdi"))
    assert files == ["fracgpu.io-claim_u1.json"]
    spec = json.loads((tmp_path / "cdi" / files[0]).read_text())
    assert spec["kind"] == "fracgpu.io/claim" and spec["cdiVersion"] == cdi.CDI_VERSION
    assert spec["devices"] == [{"name": "u1-gpu", "containerEdits": {"env": [
        "NVIDIA_VISIBLE_DEVICES=GPU-bbbb", "GPU_PORTION=0.25", "CUDA_DEVICE_MEMORY_LIMIT=10240m"]}}]


def test_a_repeated_prepare_answers_from_disk_and_unprepare_is_idempotent(tmp_path: Path) -> None:
    reads: list = []
    claims = {("team", "c1"): _claim()}
    first = _preparer(tmp_path, claims, reads=reads).prepare("team", "u1", "c1")
    claims.clear()  # a restarted plugin, with the API away: the spec on disk answers
    again = _preparer(tmp_path, claims, reads=reads).prepare("team", "u1", "c1")
    assert again == first and reads == [("team", "c1")]
    preparer = _preparer(tmp_path, claims)
    preparer.unprepare("team", "u1", "c1")
    preparer.unprepare("team", "u1", "c1")
    assert cdi.prepared_claim_uids(tmp_path / "cdi") == []


def test_only_the_first_device_of_a_request_carries_the_claims_cdi_device(tmp_path: Path) -> None:
    results = [{"driver": "gpu.fracgpu.io", "pool": "n1", "device": f"gpu-{i}", "request": "gpu", "shareID": f"s{i}",
                "consumedCapacity": {"memory": "20Gi"}} for i in (0, 1)]
    answer = _preparer(tmp_path, {("team", "c1"): _claim("u1", *results)}).prepare("team", "u1", "c1")
    assert [d["cdi_device_ids"] for d in answer] == [["fracgpu.io/claim=u1-gpu"], []]


def test_a_claim_that_is_gone_or_malformed_fails_and_writes_nothing(tmp_path: Path) -> None:
    preparer = _preparer(tmp_path, {("team", "c1"): _claim(uid="other")})
    with pytest.raises(ClaimError, match="ResourceClaim team/gone not found"):
        preparer.prepare("team", "u9", "gone")
    with pytest.raises(ClaimError, match="it was replaced"):
        preparer.prepare("team", "u1", "c1")
    assert not (tmp_path / "cdi").exists() or os.listdir(tmp_path / "cdi") == []


def test_a_failed_write_leaves_no_file_behind(tmp_path: Path) -> None:
    blocker = tmp_path / "cdi"
    blocker.write_text("a file where the directory should be")
    with pytest.raises(cdi.CdiWriteError, match="could not write CDI spec"):
        _preparer(tmp_path, {("team", "c1"): _claim()}).prepare("team", "u1", "c1")
    directory = tmp_path / "dir"
    directory.mkdir()

    class Unserialisable:
        pass

    with pytest.raises(TypeError):
        cdi.write(directory, "u1", {"x": Unserialisable()})
    assert os.listdir(directory) == []  # the temporary file went with the failure


def test_an_unreadable_spec_is_prepared_again(tmp_path: Path) -> None:
    (tmp_path / "cdi").mkdir()
    cdi.spec_file(tmp_path / "cdi", "u1").write_text("{half")
    answer = _preparer(tmp_path, {("team", "c1"): _claim()}).prepare("team", "u1", "c1")
    assert answer[0]["device_name"] == "gpu-1"
    assert cdi.recorded_answer(tmp_path / "cdi", "u1") == answer


def test_nvidia_devices_are_read_from_the_toolkits_yaml_and_json_specs(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n"
                                     "- name: GPU-aaaa\n- name: all\ncontainerEdits: {}\n")
    (run / "other.json").write_text(json.dumps({"kind": "example.com/nic", "devices": [{"name": "GPU-bbbb"}]}))
    (run / "broken.yaml").write_text(": : :")
    assert cdi.nvidia_devices((str(etc), str(run), str(tmp_path / "absent"))) == {"0", "GPU-aaaa", "all"}


def test_the_pods_the_claim_is_reserved_for_are_told_which_device_and_how_much(tmp_path: Path) -> None:
    claim = _claim()
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "p1", "uid": "pod-uid"},
                                      {"resource": "jobs", "apiGroup": "batch", "name": "j", "uid": "x"}]
    told: list = []
    preparer = Preparer(pool="n1", read_claim=lambda ns, name: claim, gpus=lambda: GPUS,
                        cdi_dir=str(tmp_path / "cdi"), nvidia_devices=set, record_event=lambda *e: told.append(e))
    preparer.prepare("team", "u1", "c1")
    ((pod, kind, reason, message),) = told
    assert pod["metadata"] == {"namespace": "team", "name": "p1", "uid": "pod-uid"} and kind == "Normal"
    assert reason == "GPUSharePrepared"
    assert message == "GPU share prepared on node n1 for claim c1: gpu-1 (GPU-bbbb): 10240 MiB of 40960 MiB (0.25)"
    preparer.prepare("team", "u1", "c1")  # a repeated prepare (a restart) says nothing new
    assert len(told) == 1
