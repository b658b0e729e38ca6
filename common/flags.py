"""Command-line conventions shared by both programs (pflag-compatible booleans and bind addresses)."""

from __future__ import annotations

import argparse

_TRUE = {"1", "t", "true", "y", "yes"}
_FALSE = {"0", "f", "false", "n", "no"}


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value {text!r}; use true or false")


def add_bool_flag(parser: argparse.ArgumentParser, name: str, default: bool, help_text: str) -> None:
    """A flag usable bare (`--x`), as `--x=true|false` or as `--x false`, like pflag booleans."""
    parser.add_argument(name, nargs="?", const=True, default=default, type=parse_bool, help=help_text)


def parse_bind_address(address: str) -> tuple[str, int] | None:
    """`:8080`, `0.0.0.0:8080` or `127.0.0.1:0` to (host, port); `0` or `` disables the endpoint."""
    if address in ("", "0"):
        return None
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise argparse.ArgumentTypeError(f"invalid bind address {address!r}; expected [host]:port")
    return (host.strip("[]") or "0.0.0.0", int(port))
