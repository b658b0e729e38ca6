"""nrimemory: the GPU memory request and limit of a ConfigMap-mode fraction pod as the annotations KAI's NRI plugin
(kai-scheduler/gpu-fractioning) reads."""
