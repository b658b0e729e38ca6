"""Binder plugins: run by the bind pipeline before and after the pod is bound (reference section 9)."""
