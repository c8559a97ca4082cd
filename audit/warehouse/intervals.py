"""Joining telemetry samples to the allocations that cover them, by the hour.

A sample belongs to an allocation when the host matches and the sample's time lies in
[start, end). Joined on the host alone, every sample meets every allocation the host ever
had (10M samples x 800 jobs per host at 100k runs: billions of pairs). Both sides are
therefore keyed by (host, hour): an allocation becomes one row per hour it covers, a
sample meets only the few allocations of its hour, and the exact time test runs on those.
Allocations are clipped to the telemetry's own span, so a job left open (no end) or one
from years before the first sample adds no rows.
"""

from __future__ import annotations

HOUR = "date_trunc('hour', {ts})"


def sample_hour(ts: str) -> str:
    return HOUR.format(ts=ts)


def allocation_hours(where: str = "TRUE") -> str:
    """Subquery: cluster, job_id, host, lo, hi, hour for each hour of each job's hosts."""
    return f"""(
        SELECT j.cluster, j.job_id, n.host, j.start_time AS lo,
               coalesce(j.end_time, TIMESTAMP '9999-12-31') AS hi,
               unnest(generate_series(
                   date_trunc('hour', greatest(j.start_time, span.first_ts)),
                   least(coalesce(j.end_time, span.last_ts), span.last_ts),
                   INTERVAL 1 HOUR)) AS hour
        FROM jobs j
        JOIN job_nodes n ON n.cluster = j.cluster AND n.job_id = j.job_id
        CROSS JOIN (SELECT min(ts) AS first_ts, max(ts) AS last_ts FROM gpu_samples) span
        WHERE {where}
    )"""


def window_hours(windows: str) -> str:
    """Subquery over a registered frame of windows (key, cluster, job_id, start, "end"):
    key, host, lo, hi, hour for each hour of each window's hosts."""
    return f"""(
        SELECT w.key, n.host, w.start AS lo, w."end" AS hi,
               unnest(generate_series(
                   date_trunc('hour', greatest(w.start, span.first_ts)),
                   least(w."end", span.last_ts),
                   INTERVAL 1 HOUR)) AS hour
        FROM {windows} w
        JOIN job_nodes n ON n.cluster = w.cluster AND n.job_id = w.job_id
        CROSS JOIN (SELECT min(ts) AS first_ts, max(ts) AS last_ts FROM gpu_samples) span
        WHERE w."end" > w.start
    )"""
