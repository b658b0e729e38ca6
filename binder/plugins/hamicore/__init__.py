"""hamicore: writes the HAMi-core memory limit of a fractional pod into its ConfigMap."""
