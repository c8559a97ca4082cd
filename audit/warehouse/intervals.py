"""Joining telemetry samples to the allocations that cover them, by the hour.

A sample belongs to an allocation when the host matches and the sample's time lies in
[start, end). Joined on the host alone, every sample meets every allocation the host ever
had (10M samples x 800 jobs per host at 100k runs: billions of pairs). Both sides are
therefore keyed by (host, hour): an allocation becomes one row per hour it covers, a
sample meets only the few allocations of its hour, and the exact time test runs on those.
Allocations are clipped to the telemetry's own span, so a job left open (no end) or one
from years before the first sample adds no rows. An allocation still longer than a year
after clipping (no Slurm job runs that long; a bogus Start of year 1 and End of year 9999
would mean 87 million hours) meets only the hours in which its hosts have samples, so the
rows stay bounded by the telemetry whatever the warehouse holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

HOUR = "date_trunc('hour', {ts})"
LONG_HOURS = 24 * 366  # beyond this an allocation is joined to sample hours, not expanded


def sample_hour(ts: str) -> str:
    return HOUR.format(ts=ts)


# A GPU labelled by its index, as nvidia-smi, DCGM and W&B label them: the index's own
# canonical text, so that "0" and "00" stay two labels as they are two distinct values.
_INDEX_LABEL = (
    "CASE WHEN length(gpu) <= 2 AND CAST(TRY_CAST(gpu AS UTINYINT) AS VARCHAR) = gpu"
    " AND TRY_CAST(gpu AS UTINYINT) < 64 THEN TRY_CAST(gpu AS UTINYINT) END"
)


def host_instants(where: str = "TRUE") -> str:
    """Subquery: host, ts, gpus (distinct GPU labels reporting), model, for each instant
    at which a host sent telemetry.

    ``count(DISTINCT gpu)`` per (host, ts) is the plain form and costs 4.6 s at 10 M
    samples (hashing labels within 1.3 M groups); ``count(*)`` is not a substitute, since
    two W&B runs sharing a node log the same GPU at the same second. Index labels (0-63,
    nearly every sample) are counted as the bits set in the OR of ``1 << index`` (0.6 s),
    and only the other labels (UUIDs, bus ids) by ``count(DISTINCT)``. The two label
    sets are disjoint, so their counts add up to ``count(DISTINCT gpu)`` exactly.
    ``labelled`` is read by both branches: NOT MATERIALIZED has each scan the samples
    instead of DuckDB storing every sample's labels once for both (140 MB more at 10 M
    samples for 0.1 s less).
    ``where`` is SQL of the caller (a window condition on ``ts`` with ``?`` parameters).
    """
    return f"""(
        WITH labelled AS NOT MATERIALIZED (
            SELECT host, ts, gpu, model, {_INDEX_LABEL} AS idx FROM gpu_samples WHERE {where}
        ),
        counted AS (
            SELECT host, ts, bit_count(bit_or(CAST(1 AS UBIGINT) << idx)) AS gpus,
                   any_value(model) AS model
            FROM labelled WHERE idx IS NOT NULL GROUP BY host, ts
            UNION ALL
            SELECT host, ts, count(DISTINCT gpu) AS gpus, any_value(model) AS model
            FROM labelled WHERE idx IS NULL GROUP BY host, ts
        )
        SELECT host, ts, CAST(sum(gpus) AS BIGINT) AS gpus, any_value(model) AS model
        FROM counted GROUP BY host, ts
    )"""


def _hours(spans: str, columns: str) -> str:
    """Each span (``columns``, host, lo, hi, first_hour, last_moment) once per hour it
    covers: expanded when short, joined to the host's sample hours when long."""
    return f"""(
        WITH spans AS ({spans}),
        long_spans AS (
            SELECT * FROM spans WHERE date_diff('hour', first_hour, last_moment) > {LONG_HOURS}
        ),
        sample_hours AS (  -- only for hosts of long spans: usually none, then not scanned
            SELECT DISTINCT host, {sample_hour("ts")} AS hour FROM gpu_samples
            WHERE host IN (SELECT host FROM long_spans)
        )
        SELECT {columns}, host, lo, hi,
               unnest(generate_series(first_hour, last_moment, INTERVAL 1 HOUR)) AS hour
        FROM spans WHERE date_diff('hour', first_hour, last_moment) <= {LONG_HOURS}
        UNION ALL
        SELECT {", ".join(f"s.{c.strip()}" for c in columns.split(","))}, s.host, s.lo, s.hi, h.hour
        FROM long_spans s JOIN sample_hours h
          ON h.host = s.host AND h.hour >= s.first_hour AND h.hour <= s.last_moment
    )"""


def allocation_hours(where: str = "TRUE") -> str:
    """Subquery: cluster, job_id, host, lo, hi, hour for each hour of each job's hosts."""
    return _hours(
        f"""
        SELECT j.cluster, j.job_id, n.host, j.start_time AS lo,
               coalesce(j.end_time, TIMESTAMP '9999-12-31') AS hi,
               date_trunc('hour', greatest(j.start_time, span.first_ts)) AS first_hour,
               least(coalesce(j.end_time, span.last_ts), span.last_ts) AS last_moment
        FROM jobs j
        JOIN job_nodes n ON n.cluster = j.cluster AND n.job_id = j.job_id
        CROSS JOIN (SELECT min(ts) AS first_ts, max(ts) AS last_ts FROM gpu_samples) span
        WHERE {where}
        """,
        "cluster, job_id",
    )


def window_hours(windows: str) -> str:
    """Subquery over a registered frame of windows (key, cluster, job_id, start, "end"):
    key, job_id, host, lo, hi, hour for each hour of each window's hosts."""
    return _hours(
        f"""
        SELECT w.key, w.job_id, n.host, w.start AS lo, w."end" AS hi,
               date_trunc('hour', greatest(w.start, span.first_ts)) AS first_hour,
               least(w."end", span.last_ts) AS last_moment
        FROM {windows} w
        JOIN job_nodes n ON n.cluster = w.cluster AND n.job_id = w.job_id
        CROSS JOIN (SELECT min(ts) AS first_ts, max(ts) AS last_ts FROM gpu_samples) span
        WHERE w."end" > w.start
        """,
        "key, job_id",
    )


@contextmanager
def materialised(con, name: str, subquery: str) -> Iterator[str]:
    """The rows of ``subquery`` (one of the above, or a caller's constant SQL that several
    of its queries read) as temporary table ``name`` while in use.

    Joined as a subquery, DuckDB misjudges the size of its UNION (an estimate of 33 M rows
    for a branch that is empty) and builds the join's hash table on the telemetry samples
    instead: over 14 GiB at 80 M samples. A table has an exact row count, so the hash table
    is built on the allocation hours (17 s and 0.5 GiB there). ``name`` is a constant of
    the caller, never user text.
    """
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT * FROM {subquery}")
    try:
        yield name
    finally:
        con.execute(f"DROP TABLE IF EXISTS {name}")
