"""`fracgpu` (also `kubectl fracgpu`): the operator's view of a fracgpu installation.

  fracgpu doctor     checks an installation, one pass/fail line each; exit status 1 when any fails
  fracgpu gpus       per node, each shared GPU: GPU id, reservation pod, member pods and shares, free share

Settings (scheduler name, runtime class, hamicore, reservation namespace and image) are read from the
fracgpu Deployments in --namespace; the options below override them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from common.kube.client import ApiError, KubeClient
from common.version import version
from fracgpuctl import doctor, gpus
from fracgpuctl.installed import DEFAULT_NAMESPACE, Installed, read_installed

PROGRAM = "fracgpu"
MARKS = {doctor.PASS: "PASS", doctor.FAIL: "FAIL", doctor.SKIP: "SKIP"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n", 1)[0], allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
    common.add_argument("--context", default=None, help="kubeconfig context")
    common.add_argument("-n", "--namespace", default=DEFAULT_NAMESPACE,
                        help="namespace of the fracgpu Deployments settings are read from (default: %(default)s)")
    common.add_argument("--reservation-namespace", default=None,
                        help="namespace of reservation pods (default: the binder's --resource-reservation-namespace)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = sub.add_parser("doctor", parents=[common], help="check the installation", allow_abbrev=False)
    check.add_argument("--check", action="append", choices=doctor.CHECK_NAMES, default=None, metavar="CHECK",
                       help=f"run only this check (repeatable; default: all): {', '.join(doctor.CHECK_NAMES)}")
    check.add_argument("--scheduler-name", default=None, help="default: the webhook's --scheduler-name")
    check.add_argument("--runtime-class-name", default=None,
                       help="default: the webhook's --gpu-fraction-runtime-class-name")
    check.add_argument("--hamicore", choices=("true", "false"), default=None,
                       help="default: on when the webhook or the binder turns it on")
    check.add_argument("--reservation-image-platforms", default=None,
                       help="os/arch list, comma-separated (default: the binder Deployment's annotation)")
    check.add_argument("--mutating-webhook-configuration", default=None, help="default: fracgpu-mutating-admission")
    check.add_argument("--validating-webhook-configuration", default=None,
                       help="default: fracgpu-validating-admission")
    check.add_argument("--probe-namespace", default="default",
                       help="namespace of the dry-run pod that tests the webhook end to end (default: %(default)s)")
    show = sub.add_parser("gpus", parents=[common], help="show which pods share which GPU", allow_abbrev=False)
    show.add_argument("-o", "--output", choices=("table", "json"), default="table", help="(default: %(default)s)")
    return parser


def _override(installed: Installed, args: argparse.Namespace) -> Installed:
    if args.reservation_namespace:
        installed.reservation_namespace = args.reservation_namespace
    if args.command != "doctor":
        return installed
    for attribute, value in (("scheduler_name", args.scheduler_name), ("runtime_class", args.runtime_class_name),
                             ("mutating_configuration", args.mutating_webhook_configuration),
                             ("validating_configuration", args.validating_webhook_configuration)):
        if value is not None:
            setattr(installed, attribute, value)
    if args.hamicore is not None:
        installed.hamicore = args.hamicore == "true"
    if args.reservation_image_platforms is not None:
        installed.reservation_platforms = [p.strip() for p in args.reservation_image_platforms.split(",") if p.strip()]
    return installed


def _doctor(client: KubeClient, installed: Installed, args: argparse.Namespace) -> int:
    source = (f"read from {', '.join(installed.found)} in {installed.namespace}" if installed.found
              else f"defaults: no fracgpu Deployment in {installed.namespace}")
    print(f"settings: scheduler {installed.scheduler_name}, runtime class {installed.runtime_class or '(none)'}, "
          f"hamicore {'on' if installed.hamicore else 'off'} ({source}; options override)")
    results = doctor.run_checks(client, installed, args.probe_namespace, args.check or ())
    width = max(len(result.check) for result in results)
    for result in results:
        print(f"{MARKS[result.status]}  {result.check.ljust(width)}  {result.message}")
    counts = {status: sum(1 for result in results if result.status == status) for status in MARKS}
    print(f"{counts[doctor.PASS]} passed, {counts[doctor.FAIL]} failed, {counts[doctor.SKIP]} skipped")
    return 1 if counts[doctor.FAIL] else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        client = KubeClient.from_kubeconfig(args.kubeconfig, context=args.context, user_agent=PROGRAM, timeout=30)
    except Exception as error:  # noqa: BLE001 - any kubeconfig problem is one line, not a traceback
        print(f"{PROGRAM}: cannot load Kubernetes client configuration: {error}; pass --kubeconfig or set "
              "KUBECONFIG", file=sys.stderr)
        return 2
    try:
        installed = _override(read_installed(client, args.namespace), args)
        if args.command == "doctor":
            return _doctor(client, installed, args)
        nodes, warnings, nominated = gpus.read_allocation(client, installed.reservation_namespace)
        for warning in warnings:
            print(f"{PROGRAM}: warning: {warning}", file=sys.stderr)
        sys.stdout.write(gpus.render(nodes, args.output, gpus.read_dra(client), nominated))
        return 0
    except ApiError as error:
        if error.transport:
            print(f"{PROGRAM}: cannot reach the API server {client.host}: {error.message}; check --kubeconfig and "
                  "--context", file=sys.stderr)
        else:
            print(f"{PROGRAM}: the API server refused a request: {error.message}", file=sys.stderr)
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
