"""Fault proxies between a program and the API server: TCP, HTTP faults, crashes, flaky answers."""
