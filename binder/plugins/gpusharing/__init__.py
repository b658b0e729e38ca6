"""gpusharing: fills a fractional pod's GPU-sharing ConfigMaps with the reserved GPU and its portion."""
