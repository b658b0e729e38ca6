# fracgpu developer and CI entry points.  See docs/testing.md.
PYTHON ?= python3

.PHONY: install k8s-binaries promtool test

# Editable install with the test extras; pip makes re-runs a cheap no-op.
install:
	$(PYTHON) -m pip install --disable-pip-version-check -q -e '.[test]'

# kube-apiserver, kube-controller-manager, kube-scheduler and etcd for the test bed;
# a no-op when the cache ($${FRACGPU_K8S_CACHE:-~/.cache/fracgpu/k8s-v1.35.4}) is complete.
k8s-binaries:
	tools/build-k8s.sh

# promtool (Prometheus v3.16.0) for the alert-rule checks of manifests/components/monitoring; a no-op when
# $${FRACGPU_PROMTOOL_CACHE:-~/.cache/fracgpu/promtool-v3.16.0}/promtool exists.
promtool:
	tools/build-promtool.sh

test: install k8s-binaries promtool
	$(PYTHON) -m pytest -q

.PHONY: demo
# The product end to end on a local control plane (stock kube-scheduler + extender); ARGS="--mode kai" for the
# KAI-scheduler contract, ARGS=--keep-running to stay up until Ctrl-C.
demo: install k8s-binaries
	$(PYTHON) -m testbed.demo $(ARGS)
