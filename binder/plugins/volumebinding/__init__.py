"""volumebinding: binds and provisions a pod's PersistentVolumeClaims for its node (the scheduler's VolumeBinding)."""
