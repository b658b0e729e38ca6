"""The version of fracgpu and of the contracts it mirrors; every program's `--version` and build info read it here."""

from __future__ import annotations

from importlib import metadata

# The KAI-Scheduler commit whose admission webhook and binder fracgpu is wire-compatible with (v0.17 line).
KAI_CONTRACT_COMMIT = "d5bc503a"


def version() -> str:
    """The installed package's version; "0+unknown" when run from a tree that was never installed."""
    try:
        return metadata.version("fracgpu")
    except metadata.PackageNotFoundError:
        return "0+unknown"
