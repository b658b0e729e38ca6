"""GPU-aware preemption: which pods to remove from a node so that a higher-priority GPU pod fits there."""
