"""The in-cluster end-to-end suite (issue 28, deliverable 4): fracgpu installed once with its Helm chart on the
session's in-cluster real nodes, every component a pod from the Dockerfile's image, and worked as an operator's
cluster is: binds on both paths, kills, a drain, an upgrade under load, the uninstall. A package, so that its
install (conftest.py, package scope) is removed before the other real-node suites run."""
