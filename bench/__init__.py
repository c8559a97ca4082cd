"""Benchmarks: deterministic large histories and timings against MLflow's own search."""
