"""Benchmarks: deterministic large histories and timings against MLflow's own search."""

import os

# MLflow's usage telemetry would try the network (there is none here) from the search being
# timed and from the servers the benchmarks start; off, so MLflow is timed doing its work.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
