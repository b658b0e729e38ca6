"""nvfractions: the NvFractions memory annotations of a fractional pod (KAI v0.18)."""
