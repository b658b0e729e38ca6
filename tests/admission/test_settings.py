"""Flags and defaults of the webhook (reference admission §1)."""

import json
import pathlib
import subprocess
import sys

import pytest
import yaml

from admission.settings import parse_settings


def test_defaults_match_the_reference():
    settings = parse_settings([])
    assert settings.scheduler_name == "kai-scheduler"
    assert (settings.gpu_sharing_enabled, settings.hami_core_enabled, settings.block_nvidia_visible_devices) == (
        False, False, False)
    assert settings.runtime_class_name == "nvidia"
    assert settings.webhook_port == 9443
    assert settings.cert_dir == "/tmp/k8s-webhook-server/serving-certs"
    assert settings.health_address == ("0.0.0.0", 8081)
    assert settings.metrics_address == ("0.0.0.0", 8080)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--gpu-sharing-enabled"], True),
        (["--gpu-sharing-enabled=true"], True),
        (["--gpu-sharing-enabled=false"], False),
        (["--gpu-sharing-enabled", "false"], False),
        (["--gpu-sharing-enabled=True"], True),
    ],
)
def test_boolean_flag_forms(argv, expected):
    assert parse_settings(argv).gpu_sharing_enabled is expected


def test_value_flag_forms():
    assert parse_settings(["--scheduler-name", "mine"]).scheduler_name == "mine"
    assert parse_settings(["--scheduler-name=mine", "--webhook-addr=1234"]).webhook_port == 1234


@pytest.mark.parametrize(
    ("argv", "runtime_class"),
    [
        ([], "nvidia"),
        (["--gpu-pod-runtime-class-name", "old"], "old"),
        (["--gpu-pod-runtime-class-name", "old", "--gpu-fraction-runtime-class-name", "new"], "new"),
        (["--gpu-fraction-runtime-class-name="], ""),
        (["--gpu-pod-runtime-class-name="], ""),
        (["--gpu-fraction-runtime-class-name=", "--gpu-pod-runtime-class-name=old"], ""),
    ],
)
def test_runtime_class_resolution(argv, runtime_class):
    assert parse_settings(argv).runtime_class_name == runtime_class


def test_reference_operator_flags_are_accepted():
    settings = parse_settings(["--qps", "20", "--burst", "100", "--zap-devel=false", "--leader-elect",
                               "--health-probe-bind-address", ":9", "--metrics-bind-address", "0"])
    assert settings.health_address == ("0.0.0.0", 9)
    assert settings.metrics_address is None


def test_bad_boolean_is_a_usage_error():
    with pytest.raises(SystemExit):
        parse_settings(["--hami-core-enabled=maybe"])


@pytest.mark.parametrize("drain", ["61", "inf", "-1", "nan"])
def test_a_shutdown_drain_outside_0_to_60_seconds_is_a_usage_error(drain, capsys):
    with pytest.raises(SystemExit):
        parse_settings(["--shutdown-drain-seconds", drain])
    assert "--shutdown-drain-seconds" in capsys.readouterr().err


def test_the_shutdown_drain_is_5_seconds_unless_given():
    assert parse_settings([]).connection_limits.shutdown_drain == 5.0
    assert parse_settings(["--shutdown-drain-seconds", "0"]).connection_limits.shutdown_drain == 0.0


# ------------------------------------------------------------------------------------------ GPU sharing mode
@pytest.mark.parametrize(("argv", "mode", "sharing", "hami_core"), [
    # Without --gpu-sharing-mode the flags resolve as KAI's resolveGpuSharingMode, and mean what they always did.
    ([], "Disabled", False, False),
    (["--gpu-sharing-enabled"], "NonMemoryEnforced", True, False),
    (["--gpu-sharing-enabled=false"], "Disabled", False, False),
    (["--gpu-sharing-enabled", "--hami-core-enabled"], "HamiCore", True, True),
    (["--hami-core-enabled"], "HamiCore", False, True),  # gpusharing still refuses fractions, as before v0.18
    (["--nv-fractions-enabled"], "NvFractions", True, False),
    (["--nv-fractions-enabled", "--hami-core-enabled", "--gpu-sharing-enabled"], "NvFractions", True, False),
    (["--nv-fractions-enabled=false", "--gpu-sharing-enabled"], "NonMemoryEnforced", True, False),
    # An explicit mode wins and sets both plugin flags.
    (["--gpu-sharing-mode", "NonMemoryEnforced"], "NonMemoryEnforced", True, False),
    (["--gpu-sharing-mode=HamiCore"], "HamiCore", True, True),
    (["--gpu-sharing-mode=NvFractions"], "NvFractions", True, False),
    (["--gpu-sharing-mode=Disabled", "--gpu-sharing-enabled", "--hami-core-enabled"], "Disabled", False, False),
    (["--gpu-sharing-mode=NonMemoryEnforced", "--hami-core-enabled", "--nv-fractions-enabled"],
     "NonMemoryEnforced", True, False),
    (["--gpu-sharing-mode=HamiCore", "--gpu-sharing-enabled=false"], "HamiCore", True, True),
])
def test_gpu_sharing_mode_resolution(argv, mode, sharing, hami_core):
    settings = parse_settings(argv)
    assert (settings.gpu_sharing_mode, settings.gpu_sharing_enabled, settings.hami_core_enabled) == (
        mode, sharing, hami_core)


@pytest.mark.parametrize(("argv", "ignored"), [
    ([], ()),
    (["--gpu-sharing-enabled", "--hami-core-enabled"], ()),
    (["--gpu-sharing-mode=HamiCore", "--gpu-sharing-enabled", "--hami-core-enabled"], ()),
    (["--gpu-sharing-mode=NvFractions", "--gpu-sharing-enabled", "--nv-fractions-enabled"], ()),
    (["--gpu-sharing-mode=Disabled", "--gpu-sharing-enabled"], ("--gpu-sharing-enabled",)),
    (["--gpu-sharing-mode=NonMemoryEnforced", "--hami-core-enabled", "--nv-fractions-enabled"],
     ("--hami-core-enabled", "--nv-fractions-enabled")),
    (["--gpu-sharing-mode=NvFractions", "--nv-fractions-enabled=false"], ("--nv-fractions-enabled",)),
    (["--nv-fractions-enabled", "--hami-core-enabled"], ("--hami-core-enabled",)),
    (["--nv-fractions-enabled", "--gpu-sharing-enabled=false"], ("--gpu-sharing-enabled",)),
])
def test_flags_a_mode_overrides_are_reported(argv, ignored):
    assert parse_settings(argv).ignored_flags == ignored


def test_the_shipped_deployment_resolves_to_the_reference_default():
    # manifests/admission/deployment.yaml passes --gpu-sharing-enabled=true: KAI's default mode, NonMemoryEnforced.
    assert parse_settings(["--gpu-sharing-enabled=true"]).gpu_sharing_mode == "NonMemoryEnforced"


def test_an_unknown_mode_is_a_usage_error():
    with pytest.raises(SystemExit):
        parse_settings(["--gpu-sharing-mode", "nvfractions"])


def test_binder_service_account_username():
    assert parse_settings([]).binder_service_account_username == "system:serviceaccount:fracgpu-system:fracgpu-binder"
    assert parse_settings(["--binder-service-account-username", "system:serviceaccount:kai-scheduler:binder"]) \
        .binder_service_account_username == "system:serviceaccount:kai-scheduler:binder"
    assert parse_settings(["--binder-service-account-username="]).binder_service_account_username == ""


def test_binder_service_account_matches_the_manifests():
    rbac = pathlib.Path(__file__).parents[2] / "manifests" / "binder" / "rbac.yaml"
    account = next(doc for doc in yaml.safe_load_all(rbac.read_text()) if doc and doc["kind"] == "ServiceAccount")
    expected = f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
    assert parse_settings([]).binder_service_account_username == expected


def test_an_overridden_flag_is_a_warning_at_start_up(tmp_path):
    result = subprocess.run([sys.executable, "-m", "admission", "--cert-dir", str(tmp_path),
                             "--gpu-sharing-mode=Disabled", "--gpu-sharing-enabled"],
                            cwd=pathlib.Path(__file__).parents[2], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2  # no certificate in tmp_path: the start stops after the start-up lines
    warnings = [json.loads(line) for line in result.stderr.splitlines() if '"warning"' in line]
    assert [entry["msg"] for entry in warnings] == [
        "--gpu-sharing-enabled is ignored: the GPU sharing mode is Disabled, which decides it"]
