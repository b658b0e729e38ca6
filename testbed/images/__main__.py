"""`python -m testbed.images [--cache DIR]`: build (or reuse) both Dockerfile images; `make images` runs it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from testbed.images import DEFAULT_CACHE, ImageBuildError, build_images


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.images",
                                     description="Build the Dockerfile's fracgpu and reservation images as OCI "
                                                 "archives, with buildah and no registry (cached by their inputs).")
    parser.add_argument("--cache", type=Path, default=None, help=f"the image cache (default {DEFAULT_CACHE})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        images = build_images(args.cache, report=lambda line: print(line, file=sys.stderr, flush=True))
    except ImageBuildError as error:
        print(f"make images: {error}", file=sys.stderr)
        return 1
    for image in images.values():
        print(f"{image.name}  {image.tarball}  {image.tarball.stat().st_size / 1e6:.1f} MB")
    print(f"images ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
