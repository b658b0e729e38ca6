"""Real nodes for the test bed: containerd + kubelet + a fake NVIDIA device plugin on this machine."""
