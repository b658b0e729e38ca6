"""toolkitmemory: writes the container toolkit's GPU memory request and limit of a fractional pod into its ConfigMap."""
