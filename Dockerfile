# syntax=docker/dockerfile:1
# One image for every fracgpu program. The entry point is `python -m`; the first argument names the
# program, so the manifests run `admission ...`, `binder ...` and `certs ensure ...`. With no argument
# the image runs the reservation pod program (`binder.reservation`): the binder creates reservation
# pods from this image without a command, as the reference does with its own image.
#
# Runs as an unprivileged numeric user, writes nothing outside /tmp (mount an emptyDir there with a
# read-only root filesystem), and carries no compiler or package manager cache.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml ./
COPY common ./common
COPY admission ./admission
COPY binder ./binder
COPY certs ./certs
RUN python -m venv /opt/fracgpu \
    && /opt/fracgpu/bin/pip install --no-cache-dir --disable-pip-version-check . \
    && /opt/fracgpu/bin/python -m compileall -q /opt/fracgpu

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="fracgpu" \
      org.opencontainers.image.description="KAI-compatible GPU-sharing admission webhook, binder, reservation and certificate programs"
ENV PATH=/opt/fracgpu/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/fracgpu /opt/fracgpu
USER 65532:65532
WORKDIR /tmp
EXPOSE 9443 8080 8081
ENTRYPOINT ["python", "-m"]
CMD ["binder.reservation"]
