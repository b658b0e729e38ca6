"""Command-line conventions shared by every program: one parser, one error line, one way to show settings.

Every fracgpu program parses its flags with `Parser`, so they all behave alike: pflag-style booleans
(`--x`, `--x=false`, `--x false`), no abbreviations (`--gpu-sharing-enable` is an error, not a guess), the
defaults shown in `--help`, `--version`, `--print-config`, and every start-up error as one line

    fracgpu-<program>: <what>: <why>; <how to fix>

on stderr, exit status 2 for a command line that cannot work (`UsageError`) and 1 for anything else that
stops the start (`StartupError`: a port in use, a kubeconfig that does not load, a directory not writable).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from common import names
from common.version import KAI_CONTRACT_COMMIT, version

T = TypeVar("T")

_TRUE = {"1", "t", "true", "y", "yes"}
_FALSE = {"0", "f", "false", "n", "no"}
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"
# controller-runtime's --zap-log-level names (zap's own, plus the ones zap's parser also knows); a number
# N > 0 is "debug and N levels more verbose", which is all debug to us.
_ZAP_LEVELS = {"debug": "debug", "info": "info", "warn": "warning", "warning": "warning", "error": "error",
               "dpanic": "error", "panic": "error", "fatal": "error"}


class StartupError(Exception):
    """Start-up cannot go on. Printed as `fracgpu-<program>: <what>: <why>; <fix>`; exit status 1."""

    exit_code = 1

    def __init__(self, what: str, why: str, fix: str) -> None:
        super().__init__(f"{what}: {why}; {fix}")
        self.what, self.why, self.fix = what, why, fix


class UsageError(StartupError):
    """The command line itself cannot work (a bad value, two flags that contradict); exit status 2."""

    exit_code = 2


def error_line(program: str, error: StartupError) -> str:
    """The one line a program prints for `error`; newlines in a reason never split it."""
    return f"fracgpu-{program}: {error}".replace("\n", " ")


def exit_with(program: str, error: StartupError) -> int:
    """Print `error` as the program's one start-up line; the exit status to return from main()."""
    print(error_line(program, error), file=sys.stderr, flush=True)
    return error.exit_code


def kube_client(kubeconfig: str | None, **options: Any) -> Any:
    """`KubeClient.from_kubeconfig(kubeconfig, **options)`; any configuration problem (a missing or broken
    kubeconfig, no in-cluster account) as a StartupError, so start-up ends with one line, not a traceback."""
    from common.kube.client import KubeClient

    try:
        return KubeClient.from_kubeconfig(kubeconfig, **options)
    except Exception as error:  # noqa: BLE001 - whatever the loader raises is a configuration problem
        raise StartupError("Kubernetes client configuration", str(error) or type(error).__name__,
                           "pass --kubeconfig, or run it in a pod whose service account can reach the API "
                           "server") from None


def version_line(program: str) -> str:
    return f"fracgpu-{program} {version()} (KAI-Scheduler contract {KAI_CONTRACT_COMMIT})"


# ---------------------------------------------------------------------------------------------- value types
def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value {text!r}; use true or false")


def add_bool_flag(parser: argparse.ArgumentParser, name: str, default: bool, help_text: str | None) -> None:
    """A flag usable bare (`--x`), as `--x=true|false` or as `--x false`, like pflag booleans."""
    parser.add_argument(name, nargs="?", const=True, default=default, type=parse_bool, help=help_text)


def add_kai_contract_flags(parser: argparse.ArgumentParser, contract_help: str, nri_help: str) -> None:
    """`--kai-contract` and `--nri-plugin-enabled`, which the webhook and the binder both take (each says what the
    setting changes in it): a cluster sets them alike on both."""
    parser.add_argument("--kai-contract", choices=names.KAI_CONTRACTS, default=names.KAI_CONTRACT_V018,
                        help=contract_help)
    add_bool_flag(parser, "--nri-plugin-enabled", False, nri_help)


def parse_bind_address(address: str) -> tuple[str, int] | None:
    """`:8080`, `0.0.0.0:8080` or `127.0.0.1:0` to (host, port); `0` or `` disables the endpoint."""
    if address in ("", "0"):
        return None
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(
            f"invalid bind address {address!r}, expected [host]:port; write for example :8080 or "
            "127.0.0.1:8080, or 0 to turn the endpoint off")
    return (host.strip("[]") or "0.0.0.0", int(port))


def at_least(minimum: float, kind: type = float) -> Callable[[str], Any]:
    """An argparse type: a number of `kind` (int or float) that is `minimum` or more."""
    def convert(text: str) -> Any:
        value = _number(text, kind)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} is below {minimum:g}; give {minimum:g} or more")
        return value

    return convert


def above(minimum: float, kind: type = float) -> Callable[[str], Any]:
    """An argparse type: a number of `kind` strictly greater than `minimum`."""
    def convert(text: str) -> Any:
        value = _number(text, kind)
        if not value > minimum:
            raise argparse.ArgumentTypeError(f"{text} is not above {minimum:g}; give a number greater than "
                                             f"{minimum:g}")
        return value

    return convert


def between(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a float in [low, high]."""
    def convert(text: str) -> float:
        value = _number(text, float)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside {low:g}..{high:g}; give a number in that range")
        return value

    return convert


def _number(text: str, kind: type) -> Any:
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}; give {noun}") from None
    if value != value:  # NaN compares false with every bound, so it would pass them all
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a number")
    return value


def kubeconfig_path(text: str) -> str | None:
    """`--kubeconfig`: "" means unset; a path must name a file (a typo must not fall back to in-cluster)."""
    if text == "":
        return None
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(
            f"{text} does not exist or is not a file; give the path of a kubeconfig file, or leave --kubeconfig "
            "out to use the in-cluster configuration, then $KUBECONFIG, then ~/.kube/config")
    return text


# ---------------------------------------------------------------------------------------------- the parser
class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in `--help`, written as they would be typed: `true`, `""`; none for flags without one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or "(default" in text or not action.option_strings:
            return text
        default = action.default
        if default is None or default is argparse.SUPPRESS or isinstance(action, argparse._VersionAction):
            return text
        if isinstance(default, bool):
            if action.nargs == 0:  # store_true flags: their default says nothing
                return text
            shown = "true" if default else "false"
        elif default == "":
            shown = '""'
        elif isinstance(default, list):
            return text
        else:
            shown = str(default).replace("%", "%%")
        return f"{text} (default: {shown})" if text else f"(default: {shown})"


class Parser(argparse.ArgumentParser):
    """The argparse parser of every fracgpu program (see the module docstring)."""

    def __init__(self, *args: Any, program: str | None = None, print_config: bool = True, **kwargs: Any) -> None:
        if program is not None:
            kwargs.setdefault("prog", f"fracgpu-{program}")
            kwargs.setdefault("usage", "%(prog)s [flags]" if print_config else None)
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        # Subcommand parsers are built by argparse with only `prog` ("fracgpu-certs ensure"): name the program.
        self.program = program or self.prog.split()[0].removeprefix("fracgpu-")
        if program is not None:
            self.add_argument("--version", action="version", version=version_line(program),
                              help="print the version and exit")
        if program is not None and print_config:
            add_print_config(self)

    def error(self, message: str) -> NoReturn:
        """argparse's errors as the one start-up line; exit status 2."""
        what, why = "command line", message
        if message.startswith("argument ") and ": " in message:
            what, why = message.removeprefix("argument ").split(": ", 1)
            what = what.split("/")[-1]  # "-h/--help" style names: the long one
        if "; " in why:  # our value types say how to fix it themselves
            why, fix = why.split("; ", 1)
        else:
            fix = self._fix_for(message)
        self.fail(UsageError(what, why, fix))

    def fail(self, error: StartupError) -> NoReturn:
        sys.exit(exit_with(self.program, error))

    def _fix_for(self, message: str) -> str:
        if message.startswith("unrecognized arguments: "):
            unknown = message.removeprefix("unrecognized arguments: ").split()[0].split("=")[0]
            known = [option for action in self._all_actions() for option in action.option_strings]
            close = difflib.get_close_matches(unknown, known, n=1, cutoff=0.75)
            if close:
                return f"did you mean {close[0]}? (flags are never abbreviated)"
        return f"see {self.prog} --help"

    def _all_actions(self) -> list[argparse.Action]:
        actions = list(self._actions)
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    actions.extend(sub._actions)
        return actions


def add_print_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective settings (flags, defaults and what they resolve to) as JSON "
                             "and exit")


def add_logging_flags(parser: argparse.ArgumentParser, kai_compat: bool = False) -> None:
    """`--log-format` and `--log-level`; with `kai_compat`, KAI's controller-runtime `--zap-*` flags too."""
    parser.add_argument("--log-format", choices=("json", "text"), default="json",
                        help="json: one JSON object per line; text: for reading in a terminal")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                        help=f"(default: {DEFAULT_LOG_LEVEL}, or what --zap-log-level / --zap-devel ask for)"
                        if kai_compat else f"(default: {DEFAULT_LOG_LEVEL})")
    if not kai_compat:
        return
    parser.add_argument("--zap-log-level", type=_zap_level, default=None,
                        help="KAI's log level (debug, info, error, panic, or a verbosity N > 0 = debug); used "
                             "when --log-level is not given")
    add_bool_flag(parser, "--zap-devel", False, "KAI's development logging: debug level unless a level is given")
    # Accepted so KAI's command lines start us unchanged; the JSON format is ours whatever they say.
    for flag in ("--zap-encoder", "--zap-stacktrace-level", "--zap-time-encoding"):
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS)


def _zap_level(text: str) -> str:
    lowered = text.strip().lower()
    if lowered in _ZAP_LEVELS:
        return _ZAP_LEVELS[lowered]
    if lowered.isdigit() and int(lowered) > 0:
        return "debug"
    raise argparse.ArgumentTypeError(f"invalid log level {text!r}; use debug, info, error, panic or a number > 0")


def resolve_log_level(args: argparse.Namespace) -> str:
    """--log-level, else --zap-log-level, else debug for --zap-devel, else info."""
    if args.log_level:
        return args.log_level
    if getattr(args, "zap_log_level", None):
        return args.zap_log_level
    if getattr(args, "zap_devel", False):
        return "debug"
    return DEFAULT_LOG_LEVEL


def parse(parser: Parser, argv: Sequence[str] | None, build: Callable[[argparse.Namespace], T]) -> T:
    """Parse `argv`, turn the flags into settings with `build` (which raises UsageError for combinations
    that cannot work), and answer `--print-config` here, so every program does it the same way."""
    args = parser.parse_args(argv)
    try:
        settings = build(args)
    except UsageError as error:
        parser.fail(error)
    if getattr(args, "print_config", False):
        print(json.dumps(config_dict(settings), indent=2, sort_keys=True, default=str))
        sys.exit(0)
    return settings


# ---------------------------------------------------------------------------------------------- settings shown
def config_dict(settings: Any) -> Any:
    """Settings as plain JSON values: dataclasses and namespaces as objects, enums by value, and
    (host, port) pairs as `host:port`, the way they are written on the command line."""
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        return {f.name: config_dict(getattr(settings, f.name)) for f in dataclasses.fields(settings)}
    if isinstance(settings, argparse.Namespace):
        return {key: config_dict(value) for key, value in vars(settings).items() if key != "print_config"}
    if isinstance(settings, enum.Enum):
        return settings.value
    if isinstance(settings, tuple) and len(settings) == 2 and isinstance(settings[0], str) \
            and isinstance(settings[1], int):
        return f"{settings[0]}:{settings[1]}"
    if isinstance(settings, list | tuple):
        return [config_dict(item) for item in settings]
    if isinstance(settings, dict):
        return {str(key): config_dict(value) for key, value in settings.items()}
    return settings


def log_startup(log: logging.Logger, program: str, settings: Any) -> None:
    """The first line every program logs: what runs, which version, with which effective settings."""
    log.info("fracgpu-%s %s starting", program, version(), extra={"fields": {
        "program": f"fracgpu-{program}", "version": version(), "kai_contract": KAI_CONTRACT_COMMIT,
        "settings": config_dict(settings)}})
