"""buildah, as `make images` runs it: as root, with no daemon, its own storage, and no registry ever asked.

The storage is a private one under the image cache (`vfs` driver: it needs no overlay mounts or FUSE, so it works
inside the test bed's VM and inside CI's), RUN steps use `chroot` isolation (no runc, no namespaces to set up), and
every image a build starts FROM must already be in that storage (`--pull=never`): a FROM that would go to a registry
fails at once, naming the image.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from testbed.realnodes.images import ImageBuildError

INSTALL = "make image-tools (tools/install-image-tools.sh: apt-get install buildah mmdebstrap)"
# buildah's run-time state (locks, mounts), not worth keeping across boots; one per storage, as two storages sharing
# a run root would share its lock files and mount records.
RUNROOT = Path("/run/fracgpu-buildah")


def tool(name: str) -> str:
    """The path of a build tool, or an ImageBuildError that says how to install it."""
    if found := shutil.which(name):
        return found
    raise ImageBuildError(f"step: find {name}: {name} is not installed; fix: {INSTALL}")


def run(argv: list[str], step: str, fix: str, timeout: float = 1800, cwd: Path | None = None) -> str:
    """Run a build step; on failure raise ImageBuildError naming the step, the end of its output and the fix."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout, cwd=cwd,
                                stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ImageBuildError(f"step: {step}: {error}; fix: {fix}") from error
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-4000:]
        raise ImageBuildError(f"step: {step} failed (exit {result.returncode}):\n{output}\nfix: {fix}")
    return result.stdout


class Buildah:
    """buildah with the image cache's own storage."""

    def __init__(self, storage: Path) -> None:
        runroot = RUNROOT / hashlib.sha256(str(storage.resolve()).encode()).hexdigest()[:16]
        self.argv = [tool("buildah"), "--storage-driver", "vfs", "--root", str(storage), "--runroot", str(runroot)]

    def version(self) -> str:
        return run([*self.argv, "--version"], "buildah --version", INSTALL).strip()

    def has_image(self, name: str) -> bool:
        result = subprocess.run([*self.argv, "inspect", "--type", "image", name], capture_output=True, check=False,
                                stdin=subprocess.DEVNULL)
        return result.returncode == 0

    def tags(self, repository: str) -> list[str]:
        """Every repository:tag of repository in the storage."""
        listing = run([*self.argv, "images", "--format", "{{.Name}}:{{.Tag}}"], "buildah images", INSTALL)
        return [line for line in listing.split() if line.startswith(f"{repository}:")]

    def import_rootfs(self, tarball: Path, name: str, env: list[str], cmd: str) -> None:
        """An image of one layer, the root file system in tarball, under name (a base image buildah can build FROM)."""
        fix = f"check the disk space under {tarball.parent}, then run make images again"
        container = run([*self.argv, "from", "--pull=never", "scratch"], "buildah from scratch", fix).strip()
        try:
            run([*self.argv, "add", container, str(tarball), "/"], f"unpacking {tarball.name} into {name}", fix)
            config = [arg for value in env for arg in ("--env", value)]
            run([*self.argv, "config", *config, "--cmd", cmd, container], f"configuring {name}", fix)
            run([*self.argv, "commit", "--quiet", "--rm", container, name], f"committing {name}", fix)
        finally:
            subprocess.run([*self.argv, "rm", container], capture_output=True, check=False, stdin=subprocess.DEVNULL)

    def build(self, context: Path, target: str, tag: str, build_args: dict[str, str],
              volumes: list[tuple[Path, str]], log: Path) -> None:
        """`buildah bud --target target` of context/Dockerfile, tagged tag; its whole output goes to log."""
        argv = [*self.argv, "bud", "--isolation", "chroot", "--pull=never", "--tag", tag, "--target", target]
        for key, value in build_args.items():
            argv += ["--build-arg", f"{key}={value}"]
        for host, inside in volumes:  # bind mounts of the RUN steps only: never part of a layer
            argv += ["--volume", f"{host}:{inside}:ro"]
        with open(log, "w") as out:
            result = subprocess.run([*argv, str(context)], stdout=out, stderr=subprocess.STDOUT, check=False,
                                    stdin=subprocess.DEVNULL, timeout=1800)
        if result.returncode != 0:
            tail = "\n".join(log.read_text().splitlines()[-40:])
            raise ImageBuildError(
                f"step: buildah bud --target {target} (the Dockerfile) failed (exit {result.returncode}); its last "
                f"lines (all of them in {log}):\n{tail}\nfix: the step above names the Dockerfile instruction; a "
                "pip step that cannot reach the package index needs this machine's pip configuration to work "
                "(pip config list -v)")

    def push_archive(self, image: str, archive: Path, name: str) -> None:
        """Write image as an OCI archive that `ctr images import` takes under name."""
        run([*self.argv, "push", "--quiet", image, f"oci-archive:{archive}:{name}"], f"writing {archive.name}",
            f"check the disk space under {archive.parent}, then run make images again")

    def remove_image(self, image: str) -> None:
        """Drop an image from the storage (vfs keeps every layer as a full copy)."""
        subprocess.run([*self.argv, "rmi", "--force", image], capture_output=True, check=False,
                       stdin=subprocess.DEVNULL)
