"""The scheduler extender: GPU placement for the stock kube-scheduler, bound through the binder."""
