"""The Kubernetes machinery every program shares: a raw-path API client with one token bucket, list+watch
informers, a work queue, and the retry and fencing rules of every call."""
