"""Our programs (and the stock kube-scheduler) as child processes: the one launcher base and each launcher."""
