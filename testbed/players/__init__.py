"""Stand-ins for the rest of a cluster: the kubelet model of played nodes, the scheduler simulator, devices, pod
bursts, slow clients."""
