"""`python -m certs`: the admission webhook's certificates.

  ensure    create or renew the CA and the serving certificate in their Secrets and set caBundle on both
            webhook configurations (in cluster as a Job, or locally with --kubeconfig); idempotent
  verify    check that every caBundle verifies the stored (and optionally the served) certificate
  generate  write ca.crt/ca.key and tls.crt/tls.key files (local runs and tests)
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
from collections.abc import Sequence

from certs.ensure import Target, ensure, verify
from certs.kube import CertsApi, CertsApiError
from certs.pki import generate_directory
from certs.plan import Lifetimes
from common.flags import (
    Parser,
    StartupError,
    UsageError,
    add_logging_flags,
    add_print_config,
    at_least,
    exit_with,
    kubeconfig_path,
    log_startup,
    parse,
    resolve_log_level,
)
from common.kube.client import KubeClient
from common.logs import configure_logging

SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
DEFAULTS = Target()
log = logging.getLogger("certs")


def default_namespace() -> str:
    """POD_NAMESPACE, else the in-cluster service account's namespace, else fracgpu-system."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE_FILE) as handle:
            return handle.read().strip() or DEFAULTS.namespace
    except OSError:
        return DEFAULTS.namespace


def _cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", type=kubeconfig_path, default=None,
                        help="kubeconfig path (default: in-cluster, then $KUBECONFIG / ~/.kube/config)")
    parser.add_argument("--namespace", default=None, help="namespace of the Service and Secrets "
                        "(default: POD_NAMESPACE, the service account's namespace, else fracgpu-system)")
    parser.add_argument("--service", default=DEFAULTS.service, help="the webhook Service")
    parser.add_argument("--secret", default=DEFAULTS.secret, help="serving Secret (tls.crt, tls.key, ca.crt)")
    parser.add_argument("--ca-secret", default=DEFAULTS.ca_secret, help="CA Secret (ca.crt, ca.key)")
    parser.add_argument("--mutating-webhook-configuration", default=DEFAULTS.mutating,
                        help='MutatingWebhookConfiguration to set caBundle on ("" for none)')
    parser.add_argument("--validating-webhook-configuration", default=DEFAULTS.validating,
                        help='ValidatingWebhookConfiguration to set caBundle on ("" for none)')
    parser.add_argument("--host", action="append", default=[], dest="hosts",
                        help="extra DNS name or IP address for the serving certificate (repeatable)")
    add_logging_flags(parser)
    add_print_config(parser)


def _parser() -> Parser:
    parser = Parser(program="certs", print_config=False, description="webhook certificates")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{ensure,verify,generate}")
    ensure_cmd = commands.add_parser("ensure", help="create or renew certificates, Secrets and caBundle")
    _cluster_flags(ensure_cmd)
    ensure_cmd.add_argument("--renew-before-days", type=at_least(0), default=30.0,
                            help="renew a certificate that expires within this many days")
    ensure_cmd.add_argument("--days", type=at_least(1, int), default=365, help="serving certificate validity (days)")
    ensure_cmd.add_argument("--ca-days", type=at_least(1, int), default=3650, help="CA validity (days)")
    verify_cmd = commands.add_parser("verify", help="check caBundle against the stored/served certificate")
    _cluster_flags(verify_cmd)
    verify_cmd.add_argument("--url", default=None, help="also verify the certificate this https:// URL serves")
    generate = commands.add_parser("generate", help="write ca.crt/ca.key, tls.crt/tls.key")
    generate.add_argument("--dir", required=True, help="output directory (an existing CA there is reused)")
    generate.add_argument("--host", action="append", default=[], dest="hosts",
                          help="DNS name or IP address for the serving certificate (repeatable; "
                               "default: 127.0.0.1 and localhost)")
    generate.add_argument("--days", type=at_least(1, int), default=365, help="serving certificate validity")
    add_logging_flags(generate)
    add_print_config(generate)
    return parser


def _build(args: argparse.Namespace) -> argparse.Namespace:
    """Resolve what the flags leave open, and refuse lifetimes that cannot work before anything is read."""
    args.log_level = resolve_log_level(args)
    if args.command == "generate":
        args.hosts = args.hosts or ["127.0.0.1", "localhost"]
        return args
    args.namespace = args.namespace or default_namespace()
    if args.command == "ensure":
        try:
            args.lifetimes = Lifetimes(serving_days=args.days, ca_days=args.ca_days,
                                       renew_before=datetime.timedelta(days=args.renew_before_days))
        except ValueError as error:
            raise UsageError(f"--days {args.days} --ca-days {args.ca_days} --renew-before-days "
                             f"{args.renew_before_days:g}", str(error),
                             "keep --renew-before-days below --days, and --ca-days above both together") from None
    return args


def _target(args: argparse.Namespace) -> Target:
    return Target(namespace=args.namespace, service=args.service, secret=args.secret,
                  ca_secret=args.ca_secret, mutating=args.mutating_webhook_configuration,
                  validating=args.validating_webhook_configuration, extra_hosts=tuple(args.hosts))


def _cluster_command(args: argparse.Namespace) -> int:
    target = _target(args)
    try:
        client = KubeClient.from_kubeconfig(args.kubeconfig, qps=0, burst=1, user_agent="fracgpu-certs")
    except Exception as error:  # noqa: BLE001 - any config loading problem ends start-up with one line
        return exit_with("certs", StartupError(
            "Kubernetes client configuration", str(error) or type(error).__name__,
            "pass --kubeconfig, or run it in a pod whose service account can reach the API server"))
    api = CertsApi(client)
    try:
        if args.command == "ensure":
            report = ensure(api, target, args.lifetimes)
        else:
            report = verify(api, target, url=args.url)
    except (CertsApiError, ValueError) as error:
        log.error("%s failed: %s", args.command, error)
        return 1
    for action in report.actions:
        log.info("%s", action)
    for problem in report.problems:
        log.error("%s", problem)
    if report.ok:
        log.info("%s: caBundle of %s verifies the serving certificate for %s", args.command,
                 ", ".join(name for _, name in target.configurations()) or "(no configuration)",
                 ", ".join(target.hosts))
        if args.command == "ensure" and not report.actions:
            log.info("ensure: nothing to change")
    return 0 if report.ok else 1


def _generate(args: argparse.Namespace) -> int:
    try:
        generate_directory(args.dir, args.hosts, args.days)
    except OSError as error:
        return exit_with("certs", StartupError(
            f"--dir {args.dir}", f"cannot write the certificates ({error.strerror or error})",
            "choose a directory this user can create and write, or fix its permissions"))
    log.info("wrote %s/ca.crt and %s/tls.crt for %s", args.dir, args.dir, ", ".join(args.hosts),
             extra={"fields": {"dir": args.dir, "hosts": args.hosts}})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(_parser(), argv, _build)
    configure_logging(args.log_format, args.log_level)
    log_startup(log, f"certs {args.command}", args)
    if args.command == "generate":
        return _generate(args)
    return _cluster_command(args)


if __name__ == "__main__":
    sys.exit(main())
