"""Oracles: the invariants every fault and soak run is checked against, written apart from the product."""
