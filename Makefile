# fracgpu developer and CI entry points.  See docs/testing.md.
PYTHON ?= python3

.PHONY: install k8s-binaries k8s-binaries-compat suite-builds test-builds test-compat chart-tools promtool kueue real-node-deps image-tools images test lock sbom reservation-venv

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

# The Kubernetes version the test bed builds and runs is FRACGPU_K8S_VERSION, or the default row of
# tools/k8s/versions.tsv (v1.37.2); make, the test bed, the demo and the benchmarks all read that one setting.
# The compatibility version (v1.35.4) runs the compatibility set below (docs/compatibility.md).
K8S_COMPAT_VERSION := $(shell awk -F'\t' '$$4 == "compatibility" {print $$1}' tools/k8s/versions.tsv)
# What proves that what we ship works on the compatibility version: the binder's apiserver suites and the
# KAI-contract end-to-end tests (no fault injection), the extender with the real kube-scheduler, the real nodes,
# the shipped RBAC, webhook registrations and CRDs on a real API server, and the chart rendered for that version.
COMPAT_TESTS := tests/binder tests/extender/e2e tests/realnodes tests/apiserver/test_controlplane.py \
	tests/apiserver/test_served_apis.py \
	tests/apiserver/test_rbac.py tests/apiserver/test_webhook_through_apiserver.py tests/charts
# DRA mode needs consumable capacity, on by default from v1.36 only: its real-node tests stay out. So does the
# Kueue proof: Kueue is not what we ship, and one version shows that its quota counts our shares.
COMPAT_MARKS := not faults and not dra and not kueue

# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and etcd of the chosen version for
# the test bed; a no-op when its cache ($${FRACGPU_K8S_CACHE:-~/.cache/fracgpu/k8s-<version>}) is complete.
k8s-binaries:
	tools/build-k8s.sh

# The same for the compatibility version, in its own cache beside the default one.
k8s-binaries-compat:
	FRACGPU_K8S_VERSION=$(K8S_COMPAT_VERSION) tools/build-k8s.sh

# helm and kustomize for the chart and manifest tests (tools/build-helm.sh); a no-op when
# $${FRACGPU_HELM_CACHE:-~/.cache/fracgpu/helm-v3.20.2} holds both.
chart-tools:
	tools/build-helm.sh

# promtool (Prometheus v3.16.0) for the alert-rule checks of manifests/components/monitoring; a no-op when
# $${FRACGPU_PROMTOOL_CACHE:-~/.cache/fracgpu/promtool-v3.16.0}/promtool exists.
promtool:
	tools/build-promtool.sh

# Kueue's manager (v0.17.0) and its install for the test that proves a ClusterQueue's quota on the countable shares
# (tools/build-kueue.sh); a no-op when $${FRACGPU_KUEUE_CACHE:-~/.cache/fracgpu/kueue-v0.17.0} holds both.
kueue:
	tools/build-kueue.sh

# containerd, runc, CNI plugins and busybox (apt) and kubelet + kube-proxy (the k8s build) for the test bed's
# real nodes (testbed/realnodes); idempotent, and a no-op on a machine that cannot run them (not Linux, not root).
real-node-deps: k8s-binaries
	tools/install-real-node-deps.sh

# buildah and mmdebstrap (apt) for `make images`; idempotent. Needs Linux and root.
image-tools:
	tools/install-image-tools.sh

# Both Dockerfile targets (fracgpu, reservation) as OCI archives for `ctr images import`, built with buildah: no Docker
# daemon, no registry (PYTHON_IMAGE is a stand-in made from Debian bookworm's packages), this machine's pip settings
# and CA bundle mounted into the build. Cached in $${FRACGPU_IMAGE_CACHE:-~/.cache/fracgpu/dockerfile-images} by a
# hash of the inputs: a no-op when nothing changed (docs/images.md).
images: install image-tools
	$(PYTHON) -m testbed.images

# What the whole suite needs, built three at a time: on a fresh machine the Go builds (the default Kubernetes
# version, promtool, helm, containerd) leave a core idle while they link or wait on one big package, and pip, apt and
# the image build wait mostly on the network and the disk, so overlapping them saves minutes (docs/testing.md). Each
# build script logs with its own prefix, line by line; apt runs are serialised by tools/lib/apt.sh.
SUITE_BUILDS := install image-tools k8s-binaries images promtool chart-tools real-node-deps
# What only the later parts of `make test` need (the compatibility version, Kueue): `make test` builds them while the
# whole suite runs, at idle CPU priority (SCHED_IDLE: they get only the cycles the suite leaves, and the suite waits
# on its API servers and fault timers much of the time), so a fresh machine does not wait for them first.
LATER_BUILDS := k8s-binaries-compat kueue

suite-builds:
	$(MAKE) --no-print-directory -j3 --output-sync=line $(SUITE_BUILDS)

# Everything `make test` needs, at once.
test-builds:
	$(MAKE) --no-print-directory -j3 --output-sync=line $(SUITE_BUILDS) $(LATER_BUILDS)

# The whole suite on the chosen (default) version but the Kueue test; then, once the later builds are done, the Kueue
# test and the compatibility set on the compatibility version. All parts always run, and any failing fails the target.
# Each run's JUnit report goes to build/test-results/, and the failed tests of all are listed last (a CI log that
# keeps only its tail still says which test broke); the later builds log to build/later-builds.log.
test: suite-builds
	rm -rf build/test-results; mkdir -p build/test-results; status=0; \
	chrt --idle 0 $(MAKE) --no-print-directory -j2 --output-sync=line $(LATER_BUILDS) \
		> build/later-builds.log 2>&1 & later=$$!; \
	$(PYTHON) -m pytest -q -m "not kueue" --junitxml=build/test-results/whole.xml || status=$$?; \
	wait $$later || { status=1; echo "the later builds failed:"; tail -40 build/later-builds.log; }; \
	$(PYTHON) -m pytest -q -m kueue --junitxml=build/test-results/kueue.xml || status=$$?; \
	$(MAKE) --no-print-directory test-compat || status=$$?; \
	$(PYTHON) -m testbed.failures build/test-results/whole.xml build/test-results/kueue.xml \
		build/test-results/compat.xml; exit $$status

# Only the compatibility set, on the compatibility version (after `make test`'s builds, or with them).
test-compat: install k8s-binaries-compat chart-tools real-node-deps images
	mkdir -p build/test-results
	FRACGPU_K8S_VERSION=$(K8S_COMPAT_VERSION) $(PYTHON) -m pytest -q -m "$(COMPAT_MARKS)" $(COMPAT_TESTS) \
		--junitxml=build/test-results/compat.xml

.PHONY: demo
# The product end to end on a local control plane (stock kube-scheduler + extender); ARGS="--mode kai" for the
# KAI-scheduler contract, ARGS=--keep-running to stay up until Ctrl-C.
# ARGS=--in-cluster installs with the Helm chart instead (every program a pod): it also needs the images and helm.
demo: install k8s-binaries real-node-deps $(if $(findstring --in-cluster,$(ARGS)),images chart-tools)
	$(PYTHON) -m testbed.demo $(ARGS)
