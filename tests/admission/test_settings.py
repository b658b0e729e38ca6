"""Flags and defaults of the webhook (reference admission §1)."""

import pytest

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
