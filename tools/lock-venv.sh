#!/usr/bin/env bash
# What an image's Python holds, shown without Docker: a fresh venv with one hash-locked requirement set and the
# fracgpu code (no dependency resolution), its size, and the program that image runs by default, started.
#
#   tools/lock-venv.sh reservation [DIR]   the slim reservation image: must have no `kubernetes` package
#   tools/lock-venv.sh runtime [DIR]       the full image
#
# Sizes are apparent sizes (du -sb) of the third-party packages plus fracgpu, without pip and setuptools (the
# venv's own), which the image does not carry (it installs with --target); the whole venv is printed too. docs/benchmarks.md
# records the figures.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LOCK=${1:?usage: tools/lock-venv.sh reservation|runtime [DIR]}
VENV=${2:-${TMPDIR:-/tmp}/fracgpu-$LOCK-venv}
PYTHON=${PYTHON:-python3}
[[ -f requirements/$LOCK.lock ]] || { echo "no requirements/$LOCK.lock" >&2; exit 2; }

BUILD=$VENV.build
rm -rf "$VENV" "$BUILD"
# The fracgpu wheel, built as the Dockerfile's build stage builds it: backend from requirements/build.lock.
"$PYTHON" -m venv "$BUILD"
"$BUILD/bin/python" -m pip install --disable-pip-version-check -q --require-hashes --no-deps -r requirements/build.lock
"$BUILD/bin/python" -m pip wheel --disable-pip-version-check -q --no-deps --no-build-isolation -w "$BUILD/wheels" .

"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps)
"${PIP[@]}" --require-hashes -r "requirements/$LOCK.lock"
"${PIP[@]}" "$BUILD"/wheels/fracgpu-*.whl
rm -rf "$BUILD"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')

bytes() { du -sb "$@" | awk '{s += $1} END {print s}'; }
shipped=$(find "$SITE" -mindepth 1 -maxdepth 1 \
    ! -name 'pip' ! -name 'pip-*' ! -name 'setuptools' ! -name 'setuptools-*' ! -name '_distutils_hack' \
    ! -name 'pkg_resources' ! -name 'distutils-precedence.pth' ! -name '__pycache__' -print0 | xargs -0 du -sb \
    | awk '{s += $1} END {print s}')
echo "requirements/$LOCK.lock in $VENV"
echo "  packages:  $("$VENV/bin/python" -m pip list --disable-pip-version-check --format=freeze \
    | grep -v -E '^(pip|setuptools)==' | tr '\n' ' ')"
echo "  shipped:   $shipped bytes ($((shipped / 1024 / 1024)) MiB): site-packages without pip and setuptools"
echo "  venv:      $(bytes "$VENV") bytes ($(( $(bytes "$VENV") / 1024 / 1024 )) MiB) in all"

cd "$VENV"  # away from the source tree: the installed code is what runs
if [[ $LOCK == reservation ]]; then
    if "$VENV/bin/python" -c 'import kubernetes' 2>/dev/null; then
        echo "the reservation set must not hold the kubernetes package" >&2; exit 1
    fi
    "$VENV/bin/python" -m binder.reservation --help >/dev/null
    echo "  python -m binder.reservation --help: ok; import kubernetes: fails, as it must"
else
    for program in admission binder certs extender binder.reservation; do
        "$VENV/bin/python" -m "$program" --help >/dev/null
    done
    echo "  python -m admission|binder|certs|extender|binder.reservation --help: ok"
fi
