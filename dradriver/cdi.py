"""One CDI spec per prepared claim, written atomically, and NVIDIA's CDI device for a GPU when the container toolkit
has generated its spec.

The spec (`<cdi dir>/fracgpu.io-claim_<claim uid>.json`, kind `fracgpu.io/claim`) has one CDI device per request of
the claim, named `<claim uid>-<request>`, whose only edits are env (dradriver/claims.py). It also records, in a spec
annotation, the devices the kubelet was answered with: a second prepare of the same claim (a kubelet or plugin
restart) answers from the file, the same way, without the API. A temporary file in the same directory whose name
the CDI registry ignores is renamed over the spec, so containerd never reads half a spec.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from common import names
from dradriver.claims import PreparedClaim

log = logging.getLogger("dradriver.cdi")

CDI_VERSION = "0.6.0"
PREPARED_ANNOTATION = "fracgpu.io/prepared-devices"
DEFAULT_CDI_DIR = "/var/run/cdi"
# Where NVIDIA's container toolkit writes its generated spec (nvidia-ctk cdi generate; the GPU operator).
NVIDIA_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


class CdiWriteError(OSError):
    """The spec could not be written; nothing half-written is left."""


def spec_file(cdi_dir: str | Path, claim_uid: str) -> Path:
    vendor, cdi_class = names.DRA_CDI_KIND.split("/")
    return Path(cdi_dir) / f"{vendor}-{cdi_class}_{claim_uid}.json"


def device_name(claim_uid: str, request: str) -> str:
    return f"{claim_uid}-{request}"


def device_id(claim_uid: str, request: str) -> str:
    """The fully qualified CDI name the kubelet hands to the runtime."""
    return f"{names.DRA_CDI_KIND}={device_name(claim_uid, request)}"


def spec(prepared: PreparedClaim, answer: list[dict[str, Any]]) -> dict[str, Any]:
    """The claim's spec; `answer` is what the kubelet is told (recorded for a repeated prepare)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": names.DRA_CDI_KIND,
        "annotations": {PREPARED_ANNOTATION: json.dumps(answer, sort_keys=True, separators=(",", ":"))},
        "devices": [
            {"name": device_name(prepared.uid, request),
             "containerEdits": {"env": [f"{key}={value}" for key, value in prepared.env(request).items()]}}
            for request in prepared.requests()
        ],
    }


def write(cdi_dir: str | Path, claim_uid: str, content: dict[str, Any]) -> Path:
    """Write the spec atomically (temporary file, fsync, rename, fsync of the directory)."""
    path = spec_file(cdi_dir, claim_uid)
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A leading dot and no .json/.yaml suffix: the CDI registry never loads the file being written.
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(content, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        temporary = None
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as error:
        raise CdiWriteError(f"could not write CDI spec {path}: {error.strerror or error}") from None
    finally:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
    return path


def recorded_answer(cdi_dir: str | Path, claim_uid: str) -> list[dict[str, Any]] | None:
    """The devices recorded by an earlier prepare of this claim, or None (no spec, or not one of ours)."""
    path = spec_file(cdi_dir, claim_uid)
    try:
        content = json.loads(path.read_text())
        answer = json.loads(content["annotations"][PREPARED_ANNOTATION])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("unreadable CDI spec, preparing again", extra={"fields": {"path": str(path), "error": str(error)}})
        return None
    return answer if isinstance(answer, list) else None


def remove(cdi_dir: str | Path, claim_uid: str) -> bool:
    """Delete the claim's spec; True if there was one. Deleting twice is fine (unprepare is idempotent)."""
    try:
        spec_file(cdi_dir, claim_uid).unlink()
    except FileNotFoundError:
        return False
    return True


def prepared_claim_uids(cdi_dir: str | Path) -> list[str]:
    """The claims whose specs are on disk."""
    vendor, cdi_class = names.DRA_CDI_KIND.split("/")
    prefix = f"{vendor}-{cdi_class}_"
    try:
        entries = sorted(Path(cdi_dir).iterdir())
    except FileNotFoundError:
        return []
    return [entry.name[len(prefix):-len(".json")] for entry in entries
            if entry.name.startswith(prefix) and entry.name.endswith(".json")]


def nvidia_devices(cdi_dirs: tuple[str, ...] = NVIDIA_CDI_DIRS) -> set[str]:
    """The names of the devices NVIDIA's generated specs define (a uuid is one of them under the toolkit's
    default naming), read from every spec of kind nvidia.com/gpu in `cdi_dirs`."""
    found: set[str] = set()
    for directory in cdi_dirs:
        try:
            entries = sorted(Path(directory).iterdir())
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            if entry.suffix not in (".json", ".yaml", ".yml") or entry.name.startswith("."):
                continue
            try:
                content = yaml.safe_load(entry.read_text())  # JSON is YAML too
            except (OSError, yaml.YAMLError):
                continue
            if not isinstance(content, dict) or content.get("kind") != names.NVIDIA_CDI_KIND:
                continue
            for device in content.get("devices") or []:
                if isinstance(device, dict) and isinstance(device.get("name"), str):
                    found.add(device["name"])
    return found
