"""Links between runs, jobs and checkpoints, recomputed inside every import transaction.

- run -> job: a run tag holding the Slurm job id (``[links] job_tag_keys``), else the one job
  of the same user whose allocation contains the run (± ``time_slack_minutes``).
- checkpoint -> run: the run's ``output_dir`` param contains the checkpoint, or the run id
  appears in the path, or the run's local ``artifact_uri`` contains it.
"""

from __future__ import annotations

from audit.config import Config


def refresh_links(con, config: Config) -> None:
    keys = config.values["links"]["job_tag_keys"]
    slack = float(config.values["links"]["time_slack_minutes"])
    con.execute("DELETE FROM run_jobs")
    con.execute(
        """
        INSERT INTO run_jobs
        SELECT DISTINCT ON (t.source_id, t.run_id) t.source_id, t.run_id, j.cluster, j.job_id, 'tag:' || t.key
        FROM tags t JOIN jobs j ON j.job_id = trim(t.value)
        WHERE list_contains(?, t.key)
        ORDER BY t.source_id, t.run_id, list_position(?, t.key), j.cluster
        """,
        [keys, keys],
    )
    con.execute(
        """
        INSERT INTO run_jobs
        SELECT r.source_id, r.run_id, any_value(j.cluster), any_value(j.job_id), 'user+time'
        FROM runs r
        JOIN jobs j ON j.user_name = r.user_id
             AND j.start_time <= r.start_time + to_minutes(CAST(? AS BIGINT))
             AND coalesce(j.end_time, r.end_time) >= coalesce(r.end_time, r.start_time) - to_minutes(CAST(? AS BIGINT))
        WHERE NOT EXISTS (SELECT 1 FROM run_jobs x WHERE x.source_id = r.source_id AND x.run_id = r.run_id)
        GROUP BY r.source_id, r.run_id
        HAVING count(*) = 1
        """,
        [round(slack), round(slack)],
    )
    prefixes = [
        (remote.rstrip("/"), config.local_path(local).rstrip("/"))
        for remote, local in config.values["links"]["path_prefixes"].items()
    ]
    con.execute("CREATE OR REPLACE TEMP TABLE audit_prefixes (remote VARCHAR, local VARCHAR)")
    if prefixes:
        con.executemany("INSERT INTO audit_prefixes VALUES (?, ?)", prefixes)
    con.execute("DELETE FROM checkpoint_runs")
    con.execute(
        r"""
        INSERT INTO checkpoint_runs
        WITH output_dirs AS (
            SELECT p.source_id, p.run_id, coalesce(
                (SELECT m.local || substr(rtrim(p.value, '/'), length(m.remote) + 1) FROM audit_prefixes m
                 WHERE rtrim(p.value, '/') = m.remote OR starts_with(p.value, m.remote || '/')
                 ORDER BY length(m.remote) DESC LIMIT 1),
                rtrim(p.value, '/')) AS dir
            FROM params p WHERE p.key = 'output_dir'
        ),
        -- each checkpoint with the folders above it (itself included): "path is under dir"
        -- becomes an equality join, not a prefix test of every checkpoint against every run
        ancestors AS (
            SELECT path, unnest(list_transform(
                       generate_series(2, len(string_split(path, '/'))),
                       lambda i: array_to_string(string_split(path, '/')[1:i], '/'))) AS dir
            FROM checkpoints
        ),
        artifact_dirs AS (
            SELECT source_id, run_id, rtrim(regexp_replace(artifact_uri, '^file://', ''), '/') AS dir
            FROM runs WHERE artifact_uri LIKE 'file://%' OR artifact_uri LIKE '/%'
        ),
        candidates AS (
            SELECT a.path, p.source_id, p.run_id, 'output_dir' AS method, 1 AS rank
            FROM ancestors a JOIN output_dirs p ON p.dir = a.dir
            UNION ALL
            SELECT c.path, r.source_id, r.run_id, 'run_id_in_path', 2
            FROM checkpoints c JOIN runs r
                 ON r.run_id = regexp_extract(c.path, '(?:^|/)([0-9a-f]{32})(?:/|$)', 1)
            UNION ALL
            SELECT a.path, r.source_id, r.run_id, 'artifact_uri', 3
            FROM ancestors a JOIN artifact_dirs r ON r.dir = a.dir AND a.dir <> a.path
        )
        SELECT DISTINCT ON (path) path, source_id, run_id, method FROM candidates
        ORDER BY path, rank, source_id, run_id
        """
    )
    con.execute("DROP TABLE audit_prefixes")
    _system_metrics_as_telemetry(con)


def _system_metrics_as_telemetry(con) -> None:
    """MLflow system metrics (system/gpu_N_*) of runs linked to a job become GPU samples.

    They land on the job's first host with origin 'mlflow'; runs without a job are left
    out, because a sample must belong to a host for the idle and utilisation rules.
    """
    con.execute("DELETE FROM gpu_samples WHERE origin = 'mlflow'")
    con.execute(
        r"""
        INSERT INTO gpu_samples (host, gpu, ts, util_pct, mem_used_mib, power_w, origin, source_id, run_id)
        WITH host_of AS (
            SELECT l.source_id, l.run_id, min(n.host) AS host
            FROM run_jobs l JOIN job_nodes n ON n.cluster = l.cluster AND n.job_id = l.job_id
            GROUP BY ALL
        ),
        points AS (
            SELECT m.source_id, m.run_id, m.ts, regexp_extract(m.key, '^system/gpu_(\d+)_', 1) AS gpu,
                   regexp_extract(m.key, '^system/gpu_\d+_(.*)$', 1) AS field, m.value
            FROM metrics m
            WHERE starts_with(m.key, 'system/gpu_') AND NOT isnan(m.value)
        )
        SELECT h.host, p.gpu, p.ts,
               max(p.value) FILTER (WHERE p.field = 'utilization_percentage'),
               max(p.value) FILTER (WHERE p.field = 'memory_usage_megabytes'),
               max(p.value) FILTER (WHERE p.field = 'power_usage_watts'),
               'mlflow', any_value(p.source_id), any_value(p.run_id)
        FROM points p JOIN host_of h USING (source_id, run_id)
        WHERE p.gpu <> ''
          AND NOT EXISTS (SELECT 1 FROM gpu_samples g WHERE g.host = h.host AND g.gpu = p.gpu AND g.ts = p.ts)
        GROUP BY h.host, p.gpu, p.ts
        """
    )
