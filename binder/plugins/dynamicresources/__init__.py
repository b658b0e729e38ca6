"""dynamicresources: allocates and reserves a pod's DRA ResourceClaims (the scheduler's DynamicResources)."""
