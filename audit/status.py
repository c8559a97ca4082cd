"""What the warehouse holds, as plain data (used by ``audit status`` and reports)."""

from __future__ import annotations

from audit.warehouse import SCHEMA_VERSION, Warehouse
from audit.warehouse.intervals import allocation_hours, materialised, sample_hour
from audit.watch.records import recent


def warehouse_status(wh: Warehouse) -> dict:
    sources = wh.con.execute(
        """
        SELECT s.source_id, s.kind, s.location,
               (SELECT count(*) FROM experiments e WHERE e.source_id = s.source_id),
               (SELECT count(*) FROM runs r WHERE r.source_id = s.source_id),
               (SELECT count(*) FROM runs r WHERE r.source_id = s.source_id
                  AND r.lifecycle_stage = 'deleted'),
               strftime(s.last_imported_at, '%Y-%m-%d %H:%M:%S')
        FROM sources s ORDER BY s.location
        """
    ).fetchall()
    keys = [
        "source_id",
        "kind",
        "location",
        "experiments",
        "runs",
        "deleted_runs",
        "last_imported_at",
    ]
    first, last = wh.con.execute(
        "SELECT strftime(min(start_time), '%Y-%m-%d %H:%M'), strftime(max(start_time), '%Y-%m-%d %H:%M') FROM runs"
    ).fetchall()[0]
    files = wh.con.execute(
        """
        SELECT kind, count(DISTINCT location), sum(rows_written),
               strftime(max(imported_at), '%Y-%m-%d %H:%M:%S')
        FROM file_imports WHERE kind NOT IN (SELECT DISTINCT kind FROM sources)
        GROUP BY kind ORDER BY kind
        """
    ).fetchall()
    return {
        "schema_version": SCHEMA_VERSION,
        "sources": [dict(zip(keys, row, strict=True)) for row in sources],
        # cluster logs and other file imports (Slurm, GPU telemetry, checkpoints), by kind
        "file_sources": [
            {"kind": kind, "files": n, "rows_written": rows or 0, "last_imported_at": at}
            for kind, n, rows, at in files
        ],
        "totals": {
            "runs": wh.scalar("SELECT count(*) FROM runs"),
            "deleted_runs": wh.scalar(
                "SELECT count(*) FROM runs WHERE lifecycle_stage = 'deleted'"
            ),
            "params": wh.scalar("SELECT count(*) FROM params"),
            "tags": wh.scalar("SELECT count(*) FROM tags"),
            "metric_points": wh.scalar("SELECT count(*) FROM metrics"),
            "dataset_inputs": wh.scalar("SELECT count(*) FROM dataset_inputs"),
            "eval_results": wh.scalar("SELECT count(*) FROM eval_results"),
            "eval_runs": wh.scalar(
                "SELECT count(*) FROM (SELECT DISTINCT source_id, run_id FROM eval_results)"
            ),
        },
        "first_run": first,
        "last_run": last,
        "cluster": _cluster_status(wh),
        "watch": recent(wh.con),
        "runs_by_status": wh.con.execute(
            "SELECT coalesce(status, 'unknown'), count(*) FROM runs GROUP BY 1 ORDER BY 1"
        ).fetchall(),
    }


# A telemetry sample belongs to a job when its host and time fall inside exactly one job's
# allocation on that host, or a DCGM hpc_job label names the job. The GPUs of a host share
# the answer at each instant, so instants are judged once (8x fewer rows to range-join).
# It reads the allocation hours as table ``audit_allocation_hours`` and the instants
# (``SAMPLE_INSTANTS``) as table ``audit_sample_instants`` (``materialised``).
SAMPLE_INSTANTS = "(SELECT host, ts, job_label, count(*) AS samples FROM gpu_samples GROUP BY ALL)"
SAMPLE_ATTACHMENT_SQL = f"""
WITH instants AS (SELECT * FROM audit_sample_instants),
holders AS (  -- jobs: 1 when one job holds the instant, 2 when several
    -- all (cluster, job_id) pairs are one pair exactly when both parts' min equals their
    -- max: no hashing of pairs per instant, as count(DISTINCT) does (0.8 -> 0.64 s at L)
    SELECT i.host, i.ts,
           CASE WHEN min(a.cluster) = max(a.cluster) AND min(a.job_id) = max(a.job_id)
                THEN 1 ELSE 2 END AS jobs
    FROM instants i JOIN audit_allocation_hours a
      ON a.host = i.host AND a.hour = {sample_hour("i.ts")} AND i.ts >= a.lo AND i.ts < a.hi
    GROUP BY i.host, i.ts
)
SELECT i.host, i.ts, i.samples,
       CASE WHEN i.job_label IS NOT NULL AND EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = i.job_label)
            THEN 'attached'
            WHEN h.jobs = 1 THEN 'attached'
            WHEN h.jobs > 1 THEN 'ambiguous'
            ELSE 'unattached' END AS attachment
FROM instants i LEFT JOIN holders h ON h.host = i.host AND h.ts = i.ts
"""


def _cluster_status(wh: Warehouse) -> dict:
    jobs = wh.con.execute(
        "SELECT count(*), count(*) FILTER (WHERE gpus > 0), "
        "strftime(min(start_time), '%Y-%m-%d %H:%M'), strftime(max(end_time), '%Y-%m-%d %H:%M') FROM jobs"
    ).fetchall()[0]
    samples = wh.con.execute(
        # (host, gpu) pairs as a grouping, not as text joined by '/': no hashing of 10 M new
        # strings, and host 'a/b' with GPU 'c' is not host 'a' with GPU 'b/c'
        "SELECT count(*), count(DISTINCT host), "
        "(SELECT count(*) FROM (SELECT DISTINCT host, gpu FROM gpu_samples)), "
        "strftime(min(ts), '%Y-%m-%d %H:%M'), strftime(max(ts), '%Y-%m-%d %H:%M') FROM gpu_samples"
    ).fetchall()[0]
    # the instants are read twice: aggregating the samples once (0.3 s at 10 M samples)
    with (
        materialised(wh.con, "audit_allocation_hours", allocation_hours()),
        materialised(wh.con, "audit_sample_instants", SAMPLE_INSTANTS),
    ):
        attachment = dict(
            wh.con.execute(
                f"SELECT attachment, sum(samples) FROM ({SAMPLE_ATTACHMENT_SQL}) GROUP BY 1"
            ).fetchall()
        )
        coverage = wh.con.execute(
            f"""
            SELECT
              (SELECT count(*) FROM runs),
              (SELECT count(DISTINCT (source_id, run_id)) FROM run_jobs),
              (SELECT count(*) FROM jobs WHERE gpus > 0),
              (SELECT count(DISTINCT (a.cluster, a.job_id))
               FROM (SELECT DISTINCT host, ts FROM audit_sample_instants) s
               JOIN audit_allocation_hours a
                 ON a.host = s.host AND a.hour = {sample_hour("s.ts")} AND s.ts >= a.lo AND s.ts < a.hi
               JOIN jobs j ON j.cluster = a.cluster AND j.job_id = a.job_id AND j.gpus > 0),
              (SELECT count(*) FROM checkpoints),
              (SELECT count(DISTINCT path) FROM checkpoint_runs)
            """
        ).fetchall()[0]
    checkpoints = wh.con.execute(
        "SELECT count(*), coalesce(sum(bytes), 0) FROM checkpoints"
    ).fetchall()[0]
    methods = wh.con.execute(
        "SELECT method, count(*) FROM run_jobs GROUP BY 1 ORDER BY 1"
    ).fetchall()
    return {
        "jobs": jobs[0],
        "gpu_jobs": jobs[1],
        "jobs_from": jobs[2],
        "jobs_to": jobs[3],
        "samples": samples[0],
        "hosts": samples[1],
        "gpus": samples[2],
        "samples_from": samples[3],
        "samples_to": samples[4],
        "attached": attachment.get("attached", 0),
        "unattached": attachment.get("unattached", 0),
        "ambiguous": attachment.get("ambiguous", 0),
        "checkpoints": checkpoints[0],
        "checkpoint_bytes": checkpoints[1],
        "runs": coverage[0],
        "runs_with_job": coverage[1],
        "link_methods": methods,
        "gpu_jobs_with_telemetry": coverage[3],
        "checkpoints_with_run": coverage[5],
    }
