"""The webhook's DRA mode (`--sharing-mode=dra`): a fractional pod's request becomes a ResourceClaimTemplate that
the stock kube-scheduler allocates against fracgpu's DRA driver's devices (dradriver/). No ConfigMaps, no reservation
pods, no BindRequest. claimtemplates.py is the translation; the API side (device sizes, template creation, the
consumable-capacity probe, the sweeper) lives beside it."""
