"""fracgpu's DRA driver: GPU sharing through Dynamic Resource Allocation with consumable capacity (KEP-5075).

Two parts run on every GPU node: the ResourceSlice publisher (dradriver/slices.py builds the node's slice,
dradriver/publisher.py keeps it in the API) and the kubelet plugin (dradriver/kubeletplugin.py: plugin registration
and the DRA gRPC service), which turns each allocated claim into one CDI spec (dradriver/cdi.py) whose env edits
(dradriver/claims.py) are ConfigMap mode's: NVIDIA_VISIBLE_DEVICES, GPU_PORTION and CUDA_DEVICE_MEMORY_LIMIT.
GPUs are found through NVML (dradriver/devices.py).
"""
