# syntax=docker/dockerfile:1
# Two images, each for linux/amd64 and linux/arm64 (docs/operations.md §6):
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/fracgpu:0.1.0 --push .
#   docker buildx build --platform linux/amd64,linux/arm64 --target reservation \
#       -t REGISTRY/fracgpu-reservation:0.1.0 --push .
#
# fracgpu (the last stage, the default): every program. The entry point is `python -m`; the first argument names
# the program, so the manifests run `admission ...`, `binder ...`, `certs ensure ...` and `extender ...`. With no
# argument it runs the reservation pod program (`binder.reservation`), as the reference's image does.
# reservation: only the reservation pod program, pulled onto every GPU node: NVML, urllib3 and PyYAML, no
# `kubernetes`, Flask or cryptography. Point the binder's --resource-reservation-pod-image at it.
#
# Reproducible: third-party code comes only from requirements/*.lock (`make lock`), every file checked against its
# hash (--require-hashes) and only as wheels. The build stage runs on the builder's own platform ($BUILDPLATFORM,
# no emulation): the target's wheels are chosen with pip's --platform, from TARGETARCH, for the glibc of the base
# image (Debian bookworm: 2.36), and unpacked with --target into a directory the final stages copy.
#
# Both images run as an unprivileged numeric user, write nothing outside /tmp (mount an emptyDir there with a
# read-only root filesystem), and carry no compiler or package cache.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM --platform=$BUILDPLATFORM ${PYTHON_IMAGE} AS build
ARG TARGETARCH
WORKDIR /src
COPY requirements ./requirements
RUN python -m venv /opt/build \
    && /opt/build/bin/python -m pip install --no-cache-dir --disable-pip-version-check --require-hashes --no-deps \
        -r requirements/build.lock
COPY pyproject.toml ./
COPY common ./common
COPY admission ./admission
COPY binder ./binder
COPY certs ./certs
COPY dradriver ./dradriver
COPY extender ./extender
RUN /opt/build/bin/python -m pip wheel --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation \
        -w /wheels .
# One image's site-packages per lock: runtime -> /opt/runtime (fracgpu), reservation -> /opt/reservation.
# ${platforms} is a list of options, split on purpose.
# hadolint ignore=SC2086
RUN case "${TARGETARCH}" in \
        amd64) arch=x86_64 ;; \
        arm64) arch=aarch64 ;; \
        *) echo "unsupported TARGETARCH '${TARGETARCH}': build for linux/amd64 or linux/arm64" >&2; exit 1 ;; \
    esac \
    && platforms="--platform manylinux2014_${arch} --platform manylinux2010_${arch} --platform manylinux1_${arch}" \
    && for glibc in $(seq 36 -1 5); do platforms="--platform manylinux_2_${glibc}_${arch} ${platforms}"; done \
    && for set in runtime reservation; do \
        /opt/build/bin/python -m pip install --no-cache-dir --disable-pip-version-check --no-compile \
            --require-hashes --no-deps --only-binary=:all: ${platforms} \
            --implementation cp --python-version 3.11 --abi cp311 \
            --target "/opt/${set}" -r "requirements/${set}.lock" \
        && /opt/build/bin/python -m pip install --no-cache-dir --disable-pip-version-check --no-compile --no-deps \
            --target "/opt/${set}" /wheels/fracgpu-*.whl \
        && rm -rf "/opt/${set}/bin" \
        && python -m compileall -q "/opt/${set}" || exit 1; \
    done

FROM ${PYTHON_IMAGE} AS reservation
LABEL org.opencontainers.image.title="fracgpu-reservation" \
      org.opencontainers.image.description="fracgpu GPU reservation pod program: reports its GPU's UUID, then holds it"
ENV PYTHONPATH=/opt/fracgpu \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/reservation /opt/fracgpu
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["python", "-m"]
CMD ["binder.reservation"]

FROM ${PYTHON_IMAGE} AS fracgpu
LABEL org.opencontainers.image.title="fracgpu" \
      org.opencontainers.image.description="KAI-compatible GPU-sharing admission webhook, binder, extender, reservation and certificate programs"
ENV PYTHONPATH=/opt/fracgpu \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/runtime /opt/fracgpu
USER 65532:65532
WORKDIR /tmp
EXPOSE 9443 8080 8081
ENTRYPOINT ["python", "-m"]
CMD ["binder.reservation"]
