"""The local cluster: etcd + kube-apiserver from the Kubernetes Go modules, its certificates and policy, the client
helpers, the manifests as the test bed applies them, and control-plane faults."""
