# fracgpu developer and CI entry points.  See docs/testing.md.
PYTHON ?= python3

.PHONY: install k8s-binaries chart-tools promtool real-node-deps image-tools images test lock sbom reservation-venv

PIP := $(PYTHON) -m pip install --disable-pip-version-check -q
# uv resolves for every platform at once (--universal: amd64 and arm64 images, any developer's machine) and
# records the hash of every file of each pinned version; UV_CUSTOM_COMPILE_COMMAND names this target in the headers.
UV_COMPILE := UV_CUSTOM_COMPILE_COMMAND="make lock" $(PYTHON) -m uv pip compile --quiet --universal \
	--python-version 3.11 --generate-hashes

# Exactly the hash-locked versions of requirements/test.lock (the image's runtime.lock pins the same ones), then
# the project itself, editable, resolving nothing (its build backend is in the lock too). Re-runs change nothing.
install:
	$(PIP) --require-hashes --no-deps -r requirements/test.lock
	$(PIP) --no-deps --no-build-isolation -e .

# Re-resolve the locks after changing dependencies in pyproject.toml or requirements/*.in (needs PyPI).
lock:
	$(UV_COMPILE) pyproject.toml -o requirements/runtime.lock
	$(UV_COMPILE) requirements/build.in -o requirements/build.lock
	$(UV_COMPILE) requirements/reservation.in -c requirements/runtime.lock -o requirements/reservation.lock
	$(UV_COMPILE) pyproject.toml requirements/build.in --extra test -c requirements/runtime.lock \
		-c requirements/build.lock -o requirements/test.lock

# CycloneDX SBOMs of both images, made from their locks (every pinned version with the hashes of its files) and
# pyproject.toml (the root component), into $(SBOM_DIR). Reads only local files.
SBOM_DIR ?= build
sbom:
	mkdir -p $(SBOM_DIR)
	$(PYTHON) -m cyclonedx_py requirements requirements/runtime.lock --pyproject pyproject.toml \
		--output-reproducible --output-format JSON -o $(SBOM_DIR)/sbom-fracgpu.cdx.json
	$(PYTHON) -m cyclonedx_py requirements requirements/reservation.lock --pyproject pyproject.toml \
		--output-reproducible --output-format JSON -o $(SBOM_DIR)/sbom-fracgpu-reservation.cdx.json

# What the slim reservation image holds, in a fresh venv (no Docker needed): its lock, the fracgpu code, and
# its size; VENV=... to choose where. docs/benchmarks.md records the figures.
reservation-venv:
	tools/lock-venv.sh reservation $(VENV)

# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and etcd for the test bed;
# a no-op when the cache ($${FRACGPU_K8S_CACHE:-~/.cache/fracgpu/k8s-v1.35.4}) is complete.
k8s-binaries:
	tools/build-k8s.sh

# helm and kustomize for the chart and manifest tests (tools/build-helm.sh); a no-op when
# $${FRACGPU_HELM_CACHE:-~/.cache/fracgpu/helm-v3.20.2} holds both.
chart-tools:
	tools/build-helm.sh

# promtool (Prometheus v3.16.0) for the alert-rule checks of manifests/components/monitoring; a no-op when
# $${FRACGPU_PROMTOOL_CACHE:-~/.cache/fracgpu/promtool-v3.16.0}/promtool exists.
promtool:
	tools/build-promtool.sh

# containerd, runc, CNI plugins and busybox (apt) and kubelet + kube-proxy (the k8s build) for the test bed's
# real nodes (testbed/realnodes); idempotent, and a no-op on a machine that cannot run them (not Linux, not root).
real-node-deps:
	tools/install-real-node-deps.sh

# buildah and mmdebstrap (apt) for `make images`; idempotent. Needs Linux and root.
image-tools:
	tools/install-image-tools.sh

# Both Dockerfile targets (fracgpu, reservation) as OCI archives for `ctr images import`, built with buildah: no Docker
# daemon, no registry (PYTHON_IMAGE is a stand-in made from Debian bookworm's packages), this machine's pip settings
# and CA bundle mounted into the build. Cached in $${FRACGPU_IMAGE_CACHE:-~/.cache/fracgpu/dockerfile-images} by a
# hash of the inputs: a no-op when nothing changed (docs/images.md).
images: image-tools
	$(PYTHON) -m testbed.images

test: install k8s-binaries chart-tools promtool real-node-deps images
	$(PYTHON) -m pytest -q

.PHONY: demo
# The product end to end on a local control plane (stock kube-scheduler + extender); ARGS="--mode kai" for the
# KAI-scheduler contract, ARGS=--keep-running to stay up until Ctrl-C.
# ARGS=--in-cluster installs with the Helm chart instead (every program a pod): it also needs the images and helm.
demo: install k8s-binaries real-node-deps $(if $(findstring --in-cluster,$(ARGS)),images chart-tools)
	$(PYTHON) -m testbed.demo $(ARGS)
