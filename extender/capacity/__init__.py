"""Node capacity in the countable shares (docs/decisions.md 2.17): what each GPU node has of `fracgpu.io/milligpu`
and `fracgpu.io/gpu-memory-mib`, decided from its labels and allocatable GPUs (desired.py) and written into its
status (writer.py)."""
