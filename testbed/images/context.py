"""What goes into a Dockerfile build besides the Dockerfile: the build context's files, and this machine's pip trust.

The context is what `.dockerignore` lets in. Ours is an allow-list (`*`, then `!path` lines, then patterns to leave
out again, such as `**/__pycache__`), and `context_files` reads it that way, so the cache key covers exactly the
files the build can COPY; a `.dockerignore` of another shape is refused rather than guessed at.

pip inside the build must trust what pip on this machine trusts (a package index behind a proxy with its own CA, a
`find-links` directory, a timeout), yet none of it may end up in an image. `pip_trust` reads this machine's effective
pip configuration (`pip config list`: its files and PIP_* variables), writes it as one pip.conf, and names the host
files it refers to; the builder mounts that pip.conf and those files, read-only, into the RUN steps only.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from testbed.realnodes.images import ImageBuildError

# Where Debian (and the official python images) keep the CA bundle OpenSSL trusts: pip's own default is certifi's
# bundle, which knows nothing of a CA this machine added, so without a `cert` setting pip in the build gets this one.
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_PIP_CONF = "/etc/pip.conf"  # pip's global configuration file, read by every pip, the build venv's included
PATH_OPTIONS = ("cert", "client-cert")  # options whose value is a file pip opens


def context_files(root: Path) -> list[Path]:
    """The files of the build context under root, sorted, as `.dockerignore` admits them."""
    allowed, excluded = _read_dockerignore(root / ".dockerignore")
    files: list[Path] = []
    for entry in allowed:
        path = root / entry
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [file for file in path.rglob("*") if file.is_file()]
    return sorted(file for file in set(files) if not _excluded(file.relative_to(root).as_posix(), excluded))


def _read_dockerignore(path: Path) -> tuple[list[str], list[str]]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines or lines[0] != "*" or any(line.startswith("!") and "*" in line for line in lines):
        raise ImageBuildError(f"{path}: expected an allow-list (`*`, then `!path` lines, then patterns to leave out); "
                              "the image cache key reads it that way")
    allowed = [line[1:].strip("/") for line in lines[1:] if line.startswith("!")]
    excluded = [line for line in lines[1:] if not line.startswith("!")]
    return allowed, excluded


def _excluded(relative: str, patterns: list[str]) -> bool:
    parts = relative.split("/")
    for pattern in patterns:
        tail = pattern.removeprefix("**/")
        if tail != pattern:  # **/x matches x at any depth, as a file or as a directory above the file
            if any(fnmatch.fnmatchcase(part, tail) for part in parts):
                return True
        elif fnmatch.fnmatchcase(relative, pattern) or relative.startswith(pattern.rstrip("/") + "/"):
            return True
    return False


@dataclass(frozen=True)
class PipTrust:
    conf: str  # pip.conf text to mount at BUILD_PIP_CONF
    files: tuple[Path, ...]  # host files and directories it names, each mounted read-only at the same path


def pip_trust(python: str = sys.executable) -> PipTrust:
    """This machine's pip configuration as one pip.conf for the build, and the host paths it needs mounted."""
    sections = _effective_pip_config(python)
    files: list[Path] = []
    for options in sections.values():
        for option in PATH_OPTIONS:
            if option in options:
                files.append(_existing(Path(options[option]), option))
        if "find-links" in options:  # only local directories need a mount; URLs pass as they are
            links = options["find-links"].split()
            kept = [link for link in links if "://" in link or Path(link).is_dir()]
            files += [Path(link) for link in kept if "://" not in link]
            options["find-links"] = " ".join(kept)
            if not kept:
                del options["find-links"]
    general = sections.setdefault("global", {})
    if not any("cert" in options for options in sections.values()) and SYSTEM_CA_BUNDLE.is_file():
        general["cert"] = str(SYSTEM_CA_BUNDLE)
        files.append(SYSTEM_CA_BUNDLE)
    text = "# This machine's pip configuration, mounted into the image build's RUN steps only (testbed/images).\n"
    for section, options in sorted(sections.items()):
        if options:
            text += f"[{section}]\n" + "".join(f"{key} = {value}\n" for key, value in sorted(options.items()))
    return PipTrust(text, tuple(dict.fromkeys(files)))


def _effective_pip_config(python: str) -> dict[str, dict[str, str]]:
    """`pip config list`, later sources winning (files, then PIP_* variables), as {section: {option: value}}."""
    try:
        result = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                                check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ImageBuildError(f"reading this machine's pip configuration (pip config list): {error}") from error
    if result.returncode != 0:
        raise ImageBuildError(f"reading this machine's pip configuration (pip config list) failed: {result.stderr}")
    sections: dict[str, dict[str, str]] = {}
    for line in result.stdout.splitlines():
        name, _, quoted = line.partition("=")
        section, _, option = name.rpartition(".")
        if not option or not quoted:
            continue
        # PIP_* variables apply to every command, as [global] does; pip lists them under ":env:".
        section = "global" if section == ":env:" else section
        sections.setdefault(section, {})[option] = quoted.strip().strip("'\"")
    return sections


def _existing(path: Path, option: str) -> Path:
    if not path.is_file():
        raise ImageBuildError(f"pip's `{option}` on this machine is {path}, which does not exist: fix the pip "
                              "configuration (pip config list -v says where it is set)")
    return path
