"""The command line every program shares (common/flags.py): one error line, no abbreviations, defaults in
--help, --version, --print-config, range and cross-flag checks, and KAI's --zap-* flags mapped."""

from __future__ import annotations

import json
import re

import pytest

from admission.settings import parse_settings as admission_settings
from binder.reservation.program import _parser as reservation_parser
from binder.settings import parse_settings as binder_settings
from certs.__main__ import _build as certs_build
from certs.__main__ import _parser as certs_parser
from common.flags import Parser, UsageError, add_logging_flags, error_line, parse, parse_bind_address
from common.version import version
from extender.settings import parse_settings as extender_settings

ONE_LINE = re.compile(r"^fracgpu-(?P<program>[a-z-]+): (?P<what>[^\n]+?): (?P<why>[^\n;]+); (?P<fix>[^\n]+)\n$")


def usage_error(capsys: pytest.CaptureFixture[str], parse_call) -> re.Match[str]:
    """Run a parse that must fail; the match of its one stderr line (exit status 2, nothing on stdout)."""
    with pytest.raises(SystemExit) as exited:
        parse_call()
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    match = ONE_LINE.match(err)
    assert match, err
    return match


@pytest.mark.parametrize(("parse_call", "program", "what"), [
    (lambda: binder_settings(["--max-concurrent-reconciles", "-5"]), "binder", "--max-concurrent-reconciles"),
    (lambda: binder_settings(["--qps", "fast"]), "binder", "--qps"),
    (lambda: binder_settings(["--report-qps-share", "2"]), "binder", "--report-qps-share"),
    (lambda: binder_settings(["--client-timeout", "0"]), "binder", "--client-timeout"),
    (lambda: binder_settings(["--metrics-bind-address", "localhost"]), "binder", "--metrics-bind-address"),
    (lambda: admission_settings(["--metrics-bind-address", "localhost"]), "admission", "--metrics-bind-address"),
    (lambda: admission_settings(["--health-probe-bind-address", ":70000"]), "admission",
     "--health-probe-bind-address"),
    (lambda: admission_settings(["--workers", "0"]), "admission", "--workers"),
    (lambda: admission_settings(["--webhook-addr", "99999"]), "admission", "--webhook-addr"),
    (lambda: admission_settings(["--idle-timeout", "nan"]), "admission", "--idle-timeout"),
    (lambda: admission_settings(["--zap-log-level", "loud"]), "admission", "--zap-log-level"),
    (lambda: extender_settings(["--bind-timeout", "0"]), "extender", "--bind-timeout"),
    (lambda: extender_settings(["--bind-address", "0"]), "extender", "--bind-address"),
    (lambda: certs_parser().parse_args(["ensure", "--days", "0"]), "certs", "--days"),
    (lambda: certs_parser().parse_args(["ensure", "--renew-before-days", "-1"]), "certs", "--renew-before-days"),
])
def test_out_of_range_values_are_one_line_usage_errors(capsys, parse_call, program, what):
    match = usage_error(capsys, parse_call)
    assert (match["program"], match["what"]) == (program, what)


@pytest.mark.parametrize(("argv", "what"), [
    (["--leader-election-lease-duration", "5"], "--leader-election-lease-duration 5"),
    (["--leader-election-renew-deadline", "2", "--leader-election-retry-period", "2"],
     "--leader-election-renew-deadline 2"),
    (["--rate-limiter-base-delay", "10", "--rate-limiter-max-delay", "5"], "--rate-limiter-base-delay 10"),
])
def test_binder_flags_that_contradict_each_other_are_refused(capsys, argv, what):
    match = usage_error(capsys, lambda: binder_settings(argv))
    assert match["what"] == what


def test_lease_timings_that_client_go_accepts_are_accepted():
    settings = binder_settings(["--leader-election-lease-duration", "4", "--leader-election-renew-deadline", "3",
                                "--leader-election-retry-period", "0.5"])
    assert (settings.lease_duration_s, settings.renew_deadline_s, settings.retry_period_s) == (4, 3, 0.5)


def test_certs_lifetimes_that_cannot_work_are_refused_before_reading_anything(capsys):
    match = usage_error(capsys, lambda: parse(certs_parser(), ["ensure", "--days", "10"], certs_build))
    assert match["program"] == "certs" and "renewal window" in match["why"]


@pytest.mark.parametrize(("parse_call", "suggestion"), [
    (lambda: admission_settings(["--gpu-sharing-enable"]), "--gpu-sharing-enabled"),
    (lambda: binder_settings(["--max-concurrent-reconcile=3"]), "--max-concurrent-reconciles"),
    (lambda: extender_settings(["--placement-polic", "spread"]), "--placement-policy"),
    (lambda: certs_parser().parse_args(["ensure", "--renew-before-day", "3"]), "--renew-before-days"),
])
def test_abbreviations_are_refused_and_the_full_flag_suggested(capsys, parse_call, suggestion):
    match = usage_error(capsys, parse_call)
    assert match["why"].startswith("unrecognized arguments: ")
    assert match["fix"] == f"did you mean {suggestion}? (flags are never abbreviated)"


@pytest.mark.parametrize(("parse_call", "program"), [
    (lambda: admission_settings(["--version"]), "admission"),
    (lambda: binder_settings(["--version"]), "binder"),
    (lambda: extender_settings(["--version"]), "extender"),
    (lambda: certs_parser().parse_args(["--version"]), "certs"),
    (lambda: reservation_parser().parse_args(["--version"]), "resource-reservation"),
])
def test_every_program_prints_its_version(capsys, parse_call, program):
    with pytest.raises(SystemExit) as exited:
        parse_call()
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"fracgpu-{program} {version()} (KAI-Scheduler contract d5bc503a)\n"


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        binder_settings(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-concurrent-reconciles MAX_CONCURRENT_RECONCILES BindRequest workers (default: 10)" in text
    assert "--leader-elect [LEADER_ELECT] hold a coordination.k8s.io Lease before binding (default: false)" in text
    assert "--runtime-class-name RUNTIME_CLASS_NAME runtimeClassName of reservation pods (empty: not set) " \
           '(default: "")' in text
    assert "(default: None)" not in text


def test_print_config_shows_the_effective_settings_and_exits(capsys):
    with pytest.raises(SystemExit) as exited:
        admission_settings(["--print-config", "--gpu-pod-runtime-class-name", "old", "--zap-devel",
                            "--metrics-bind-address", "127.0.0.1:9090"])
    assert exited.value.code == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["runtime_class_name"] == "old"  # resolved from the deprecated alias
    assert shown["log_level"] == "debug"  # --zap-devel
    assert shown["metrics_address"] == "127.0.0.1:9090"
    assert shown["connection_limits"]["idle_timeout"] == 120.0


@pytest.mark.parametrize(("argv", "level"), [
    ([], "info"),
    (["--zap-devel"], "debug"),
    (["--zap-devel=false"], "info"),
    (["--zap-log-level", "error"], "error"),
    (["--zap-log-level=panic"], "error"),
    (["--zap-log-level", "3"], "debug"),
    (["--zap-log-level", "info", "--zap-devel"], "info"),  # an explicit level wins over development mode
    (["--zap-log-level", "debug", "--log-level", "warning"], "warning"),  # our flag wins over KAI's
])
def test_kai_zap_flags_set_the_log_level(argv, level):
    assert admission_settings(argv).log_level == level
    assert binder_settings(argv).log_level == level


def test_parse_bind_address():
    assert parse_bind_address(":8080") == ("0.0.0.0", 8080)
    assert parse_bind_address("[::1]:9") == ("::1", 9)
    assert parse_bind_address("0") is None and parse_bind_address("") is None
    for bad in ("localhost", "8080", "host:http", ":65536"):
        with pytest.raises(Exception, match="expected \\[host\\]:port"):
            parse_bind_address(bad)


def test_a_usage_error_raised_while_building_settings_is_one_line(capsys):
    parser = Parser(program="demo")
    add_logging_flags(parser)

    def build(_args):
        raise UsageError("--thing 3", "is odd", "give an even number")

    match = usage_error(capsys, lambda: parse(parser, [], build))
    assert match.groups() == ("demo", "--thing 3", "is odd", "give an even number")


def test_error_lines_never_span_lines():
    line = error_line("binder", UsageError("--x", "first\nsecond", "fix"))
    assert "\n" not in line and line == "fracgpu-binder: --x: first second; fix"
