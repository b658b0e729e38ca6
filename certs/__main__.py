"""`python -m certs`: the admission webhook's certificates and registrations.

  ensure      create or renew the CA and the serving certificate in their Secrets, set caBundle on the webhooks,
              and register the webhooks once a backend answers (in cluster as a Job, or locally with
              --kubeconfig); idempotent
  register    only the registration, with the caBundle from the serving Secret's ca.crt (cert-manager installs)
  unregister  remove the webhooks from both configurations: the first step of an uninstall
  verify      check that every caBundle verifies the stored (and optionally the served) certificate
  escaped     list fraction pods created while the webhook was not registered (the cut-over check)
  generate    write ca.crt/ca.key and tls.crt/tls.key files (local runs and tests)
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
from collections.abc import Sequence

from certs import cutover, webhooks
from certs.ensure import Target, ensure, verify
from certs.kube import CertsApi, CertsApiError
from certs.pki import generate_directory
from certs.plan import Lifetimes, stored_bundle
from common.flags import (
    Parser,
    StartupError,
    UsageError,
    add_logging_flags,
    add_print_config,
    at_least,
    exit_with,
    kube_client,
    kubeconfig_path,
    log_startup,
    parse,
    resolve_log_level,
)
from common.kube.kubeconfig import own_namespace
from common.logs import configure_logging

DEFAULTS = Target()
log = logging.getLogger("certs")


def default_namespace() -> str:
    """POD_NAMESPACE, else the in-cluster service account's namespace, else fracgpu-system."""
    return own_namespace(DEFAULTS.namespace)


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


def _registration_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler-name", default=webhooks.names.DEFAULT_SCHEDULER_NAME,
                        help="only pods of this scheduler reach the webhooks (their matchCondition)")
    parser.add_argument("--failure-policy", choices=webhooks.FAILURE_POLICIES, default="Fail",
                        help="what the API server does when no webhook answers")
    parser.add_argument("--namespace-selector", default="",
                        help="JSON LabelSelector a pod's namespace must also match (kube-system and our own "
                             "namespace are always left out)")
    parser.add_argument("--webhook-url", default=None,
                        help="https:// base URL of a webhook outside the cluster network (instead of the Service)")
    parser.add_argument("--dra-namespace-selector", default="",
                        help="JSON LabelSelector of the namespaces whose pods of --dra-scheduler-name DRA mode "
                             "serves ({} for all; kube-system and our own namespace are always left out). Empty: "
                             "no DRA webhook")
    parser.add_argument("--dra-scheduler-name", default=webhooks.names.DEFAULT_DRA_SCHEDULER_NAME,
                        help="DRA mode: only pods of this scheduler reach its webhooks")
    parser.add_argument("--backend-timeout", type=at_least(0), default=300.0,
                        help="seconds to wait for a webhook backend before registering (then exit 1; a Job retries)")


def _parser() -> Parser:
    parser = Parser(program="certs", print_config=False, description="webhook certificates and registrations")
    commands = parser.add_subparsers(dest="command", required=True,
                                     metavar="{ensure,register,unregister,verify,escaped,generate}")
    ensure_cmd = commands.add_parser("ensure", help="create or renew certificates, Secrets and caBundle; register")
    _cluster_flags(ensure_cmd)
    _registration_flags(ensure_cmd)
    ensure_cmd.add_argument("--no-register", action="store_true",
                            help="only the Secrets and the caBundle of webhooks already registered")
    ensure_cmd.add_argument("--renew-before-days", type=at_least(0), default=30.0,
                            help="renew a certificate that expires within this many days")
    ensure_cmd.add_argument("--days", type=at_least(1, int), default=365, help="serving certificate validity (days)")
    ensure_cmd.add_argument("--ca-days", type=at_least(1, int), default=3650, help="CA validity (days)")
    verify_cmd = commands.add_parser("verify", help="check caBundle against the stored/served certificate")
    _cluster_flags(verify_cmd)
    verify_cmd.add_argument("--url", default=None, help="also verify the certificate this https:// URL serves")
    register_cmd = commands.add_parser("register", help="register the webhooks (caBundle: the Secret's ca.crt)")
    _cluster_flags(register_cmd)
    _registration_flags(register_cmd)
    unregister_cmd = commands.add_parser("unregister", help="remove the webhooks from both configurations")
    _cluster_flags(unregister_cmd)
    escaped_cmd = commands.add_parser("escaped", help="list fraction pods the webhook never saw")
    escaped_cmd.add_argument("--kubeconfig", type=kubeconfig_path, default=None,
                             help="kubeconfig path (default: in-cluster, then $KUBECONFIG / ~/.kube/config)")
    # In a fracgpu pod (`kubectl exec deploy/fracgpu-binder -- python -m certs escaped`) the release's own scheduler.
    escaped_cmd.add_argument("--scheduler-name", default=os.environ.get(webhooks.names.SCHEDULER_NAME_ENV) or
                             webhooks.names.DEFAULT_SCHEDULER_NAME,
                             help="the scheduler whose fraction pods are checked (default: $FRACGPU_SCHEDULER_NAME, "
                                  "set in fracgpu's pods, else kai-scheduler)")
    add_logging_flags(escaped_cmd)
    add_print_config(escaped_cmd)
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
    if args.command == "escaped":
        return args
    args.namespace = args.namespace or default_namespace()
    if args.command in ("ensure", "register"):
        try:  # a bad registration flag fails before anything is written
            args.registration = webhooks.Registration(
                namespace=args.namespace, service=args.service, scheduler_name=args.scheduler_name,
                failure_policy=args.failure_policy,
                namespace_selector=webhooks.parse_namespace_selector(args.namespace_selector), url=args.webhook_url,
                dra_namespace_selector=webhooks.parse_dra_namespace_selector(args.dra_namespace_selector),
                dra_scheduler_name=args.dra_scheduler_name)
        except ValueError as error:
            raise UsageError("webhook registration flags", str(error),
                             "fix --namespace-selector, --failure-policy, --webhook-url, --dra-namespace-selector "
                             "or --dra-scheduler-name") from None
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


def _register(api: CertsApi, args: argparse.Namespace, target: Target) -> int:
    """Register with the caBundle the serving Secret carries (ours, or cert-manager's ca.crt)."""
    registration = args.registration
    bundle = stored_bundle(api.read_secret(target.namespace, target.secret))
    if bundle is None:
        log.error("register failed: Secret %s/%s has no ca.crt yet", target.namespace, target.secret)
        return 1
    outcome = webhooks.register(api, target.configurations(), registration, bundle, args.backend_timeout)
    for action in outcome.actions:
        log.info("%s", action)
    if outcome.problem:
        log.error("%s", outcome.problem)
        return 1
    log.info("%s: the webhooks of %s are registered, calling %s", args.command,
             ", ".join(name for _, name in target.configurations()), registration.backend)
    return 0


def _cluster_command(args: argparse.Namespace) -> int:
    target = _target(args)
    try:
        client = kube_client(args.kubeconfig, qps=0, burst=1, user_agent="fracgpu-certs")
    except StartupError as error:
        return exit_with("certs", error)
    api = CertsApi(client)
    try:
        if args.command == "register":
            return _register(api, args, target)
        if args.command == "unregister":
            for action in webhooks.unregister(api, target.configurations()) or ["no webhooks were registered"]:
                log.info("unregister: %s", action)
            return 0
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
    if not report.ok or args.command != "ensure" or args.no_register:
        return 0 if report.ok else 1
    try:
        return _register(api, args, target)
    except (CertsApiError, ValueError) as error:
        log.error("register failed: %s", error)
        return 1


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
    if args.command == "escaped":
        return cutover.main(args.kubeconfig, args.scheduler_name)
    if args.command == "generate":
        return _generate(args)
    return _cluster_command(args)


if __name__ == "__main__":
    sys.exit(main())
