"""The scheduler extender (being built): GPU placement for the stock kube-scheduler through the binder."""
