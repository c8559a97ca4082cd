"""Versioned schema migrations.

Each entry upgrades the warehouse from version ``n - 1`` to ``n``. Never edit a released
migration: append a new one. ``docs/schema.md`` documents the resulting tables.
"""

from audit import redact

V1 = """
CREATE TABLE sources (
    source_id VARCHAR NOT NULL,          -- short stable hash of the location
    kind VARCHAR NOT NULL,               -- sqlite | postgres | file | http
    location VARCHAR NOT NULL,           -- URI or path with credentials removed
    first_imported_at TIMESTAMP,
    last_imported_at TIMESTAMP
);
CREATE TABLE experiments (
    source_id VARCHAR NOT NULL,
    experiment_id VARCHAR NOT NULL,
    name VARCHAR,
    artifact_location VARCHAR,
    lifecycle_stage VARCHAR,
    creation_time TIMESTAMP,
    last_update_time TIMESTAMP
);
CREATE TABLE runs (
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    experiment_id VARCHAR,
    name VARCHAR,
    user_id VARCHAR,
    status VARCHAR,                      -- RUNNING SCHEDULED FINISHED FAILED KILLED
    start_time TIMESTAMP,                -- UTC
    end_time TIMESTAMP,                  -- UTC
    lifecycle_stage VARCHAR,             -- active | deleted
    deleted_time TIMESTAMP,
    artifact_uri VARCHAR,
    source_name VARCHAR,
    source_type VARCHAR,
    source_commit VARCHAR,
    signature VARCHAR,                   -- change detector for incremental imports
    imported_at TIMESTAMP
);
CREATE TABLE params (
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    value VARCHAR,                       -- the raw string as logged
    value_num DOUBLE,                    -- parsed number (booleans: 1/0), else NULL
    value_norm VARCHAR                   -- canonical text: equal numbers compare equal
);
CREATE TABLE tags (
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    value VARCHAR
);
CREATE TABLE metrics (
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    value DOUBLE,
    step BIGINT,
    ts TIMESTAMP
);
CREATE TABLE latest_metrics (
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    value DOUBLE,
    step BIGINT,
    ts TIMESTAMP
);
CREATE TABLE dataset_inputs (
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    name VARCHAR,
    digest VARCHAR,
    source_type VARCHAR,
    source VARCHAR,
    context VARCHAR                      -- mlflow.data.context tag: train / eval / ...
);
CREATE TABLE model_versions (
    source_id VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    run_id VARCHAR,
    source VARCHAR,
    status VARCHAR,
    current_stage VARCHAR,
    creation_time TIMESTAMP
);
CREATE TABLE import_log (
    import_id BIGINT NOT NULL,
    source_id VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,
    started_at TIMESTAMP NOT NULL,
    finished_at TIMESTAMP NOT NULL,
    runs_seen BIGINT,
    runs_written BIGINT,
    runs_unchanged BIGINT,
    params BIGINT,
    tags BIGINT,
    metric_points BIGINT,
    datasets BIGINT,
    watermark TIMESTAMP,                 -- latest start/end time seen in the source
    seconds DOUBLE
);
"""


V2 = """
CREATE TABLE jobs (
    cluster VARCHAR NOT NULL,            -- --cluster name given at import ('default')
    job_id VARCHAR NOT NULL,             -- 123, 123_4 (array task), 123+0 (het component)
    array_job_id VARCHAR,
    name VARCHAR,
    user_name VARCHAR,
    account VARCHAR,
    partition VARCHAR,
    state VARCHAR,                       -- COMPLETED, CANCELLED, FAILED, TIMEOUT, ...
    state_detail VARCHAR,                -- as written, e.g. 'CANCELLED by 10314909'
    submit_time TIMESTAMP,               -- UTC (naive sacct times read in [cluster] timezone)
    start_time TIMESTAMP,
    end_time TIMESTAMP,
    elapsed_s BIGINT,
    timelimit_s BIGINT,                  -- NULL: UNLIMITED / Partition_Limit / unknown
    nnodes INTEGER,
    ncpus INTEGER,
    nodelist VARCHAR,
    gpus INTEGER,                        -- allocated (AllocTRES gres/gpu=N), 0 when none
    gpu_type VARCHAR,                    -- from the typed entry gres/gpu:TYPE=N
    req_gpus INTEGER,
    req_mem_bytes BIGINT,
    max_rss_bytes BIGINT,                -- max over steps
    max_gpu_util_pct DOUBLE,             -- max over steps of TRESUsageInMax gres/gpuutil
    max_gpu_mem_bytes BIGINT,            -- max over steps of TRESUsageInMax gres/gpumem
    steps INTEGER,
    source_file VARCHAR,
    imported_at TIMESTAMP
);
CREATE TABLE job_nodes (
    cluster VARCHAR NOT NULL,
    job_id VARCHAR NOT NULL,
    host VARCHAR NOT NULL                -- NodeList expanded (gpu-a[01-03] -> gpu-a01, ...)
);
CREATE TABLE gpu_samples (
    host VARCHAR NOT NULL,
    gpu VARCHAR NOT NULL,                -- index, else UUID, else PCI bus id
    ts TIMESTAMP NOT NULL,               -- UTC
    util_pct REAL,
    mem_used_mib REAL,
    mem_total_mib REAL,
    power_w REAL,
    model VARCHAR,
    uuid VARCHAR,
    job_label VARCHAR,                   -- job id from a DCGM hpc_job label
    pod VARCHAR,                         -- Kubernetes namespace/pod from DCGM labels
    origin VARCHAR NOT NULL              -- nvidia-smi | dcgm | prometheus
);
CREATE TABLE checkpoints (
    root VARCHAR NOT NULL,
    path VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,               -- hf | lightning | file
    step BIGINT,
    epoch BIGINT,
    bytes BIGINT NOT NULL,
    files INTEGER NOT NULL,
    mtime TIMESTAMP,
    is_best BOOLEAN,                     -- trainer_state.json best_model_checkpoint points here
    best_metric DOUBLE,
    run_dir VARCHAR,                     -- the training output folder holding it
    imported_at TIMESTAMP
);
CREATE TABLE run_jobs (
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    cluster VARCHAR NOT NULL,
    job_id VARCHAR NOT NULL,
    method VARCHAR NOT NULL              -- tag:<key> | user+time
);
CREATE TABLE checkpoint_runs (
    path VARCHAR NOT NULL,
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    method VARCHAR NOT NULL              -- output_dir | run_id_in_path | artifact_uri
);
CREATE TABLE file_imports (
    kind VARCHAR NOT NULL,               -- slurm | gpu | checkpoints
    location VARCHAR NOT NULL,
    imported_at TIMESTAMP NOT NULL,
    rows_read BIGINT,
    rows_written BIGINT,
    rows_skipped BIGINT,
    seconds DOUBLE
);
"""


V3 = """
CREATE TABLE scans (
    scan_id BIGINT NOT NULL,
    started_at TIMESTAMP NOT NULL,
    finished_at TIMESTAMP,
    config_hash VARCHAR,
    window_start TIMESTAMP,              -- --since (UTC), NULL: all history
    window_end TIMESTAMP,                -- --until (UTC)
    selection VARCHAR                    -- rules run, comma separated
);
CREATE TABLE findings (
    scan_id BIGINT NOT NULL,
    finding_id VARCHAR NOT NULL,         -- hash of rule + subject: stable across scans
    rule VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    severity VARCHAR NOT NULL,
    subject JSON NOT NULL,
    message VARCHAR NOT NULL,
    evidence JSON,
    gpu_hours DOUBLE,
    usd DOUBLE,
    bytes BIGINT,
    recommendation VARCHAR,
    team VARCHAR,
    method VARCHAR,
    happened_at TIMESTAMP,               -- when the waste happened (for weekly windows)
    suppressed BOOLEAN NOT NULL,
    suppressed_reason VARCHAR
);
CREATE TABLE rule_results (
    scan_id BIGINT NOT NULL,
    rule VARCHAR NOT NULL,
    status VARCHAR NOT NULL,             -- ok | skipped | error
    reason VARCHAR,
    findings INTEGER,
    notes JSON,                          -- per-subject skips ("no GPU telemetry for job 123")
    seconds DOUBLE
);
"""


V4 = """
CREATE TABLE prune_log (
    applied_at TIMESTAMP NOT NULL,
    plan VARCHAR NOT NULL,               -- the plan file applied
    path VARCHAR NOT NULL,
    rule VARCHAR,
    run_id VARCHAR,
    bytes BIGINT,                        -- freed (0 when skipped)
    status VARCHAR NOT NULL,             -- deleted | skipped | incomplete | failed
    reason VARCHAR                       -- why it was skipped
);
"""

V5 = """
-- a finding whose GPU count is unknown keeps gpu_hours and usd NULL and says how long the
-- runs ran instead; cost_basis names the evidence a figure stands on
ALTER TABLE findings ADD COLUMN run_hours DOUBLE;
ALTER TABLE findings ADD COLUMN cost_basis VARCHAR;
"""


V6 = """
ALTER TABLE jobs ADD COLUMN eligible_time TIMESTAMP;    -- UTC; queue wait = start - eligible
ALTER TABLE jobs ADD COLUMN ave_gpu_util_pct DOUBLE;    -- max over steps of TRESUsageInAve gres/gpuutil
ALTER TABLE jobs ADD COLUMN ave_gpu_mem_bytes BIGINT;   -- max over steps of TRESUsageInAve gres/gpumem
ALTER TABLE jobs ADD COLUMN admin_comment VARCHAR;      -- AdminComment as written (jobstats: JS1:...)
"""


V7 = """
-- GPU samples logged by a run itself (W&B system metrics, MLflow system/gpu_* metrics):
-- the run they belong to. NULL for host telemetry (nvidia-smi, DCGM, Prometheus).
ALTER TABLE gpu_samples ADD COLUMN source_id VARCHAR;
ALTER TABLE gpu_samples ADD COLUMN run_id VARCHAR;
CREATE TABLE run_files (
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    path VARCHAR NOT NULL,               -- the log read: a .wandb file
    size BIGINT NOT NULL,
    mtime TIMESTAMP NOT NULL,
    resume_offset BIGINT NOT NULL,       -- first byte not yet imported (a record boundary)
    state VARCHAR NOT NULL               -- JSON: what reading on from resume_offset needs
);
"""


# Times every reader can represent: Python's datetime covers the years 1 to 9999, DuckDB's
# TIMESTAMP far more. Importers before this version stored what sources said (a start time
# in microseconds became year 58845), after which every reader of that row failed. Such
# times are cleared; a run that had one loses its change signature, so the next import of
# its source reads it again and, if the source still says so, refuses it with the reason.
_OUT_OF_RANGE = "({c} < TIMESTAMP '0001-01-01' OR {c} > TIMESTAMP '9999-12-31 23:59:59.999999')"


def _clear_out_of_range_times(table: str, columns: list[str], extra: str = "") -> str:
    bad = " OR ".join(_OUT_OF_RANGE.format(c=c) for c in columns)
    sets = ", ".join(
        f"{c} = CASE WHEN {_OUT_OF_RANGE.format(c=c)} THEN NULL ELSE {c} END" for c in columns
    )
    return f"UPDATE {table} SET {sets}{extra} WHERE {bad};"


V8 = "\n".join(
    [
        _clear_out_of_range_times(
            "runs", ["start_time", "end_time", "deleted_time"], ", signature = NULL"
        ),
        _clear_out_of_range_times("experiments", ["creation_time", "last_update_time"]),
        _clear_out_of_range_times("metrics", ["ts"]),
        _clear_out_of_range_times("latest_metrics", ["ts"]),
        _clear_out_of_range_times("model_versions", ["creation_time"]),
        _clear_out_of_range_times("import_log", ["watermark"]),
        _clear_out_of_range_times(
            "jobs", ["submit_time", "start_time", "end_time", "eligible_time"]
        ),
        _clear_out_of_range_times("checkpoints", ["mtime"]),
        _clear_out_of_range_times("findings", ["happened_at"]),
        f"DELETE FROM gpu_samples WHERE {_OUT_OF_RANGE.format(c='ts')};",  # ts is the sample
        # a log's cursor without its time: the next import reads the log again from the start
        f"DELETE FROM run_files WHERE {_OUT_OF_RANGE.format(c='mtime')};",
    ]
)

# A weekly report's data as computed, so rendering it again after nothing changed costs
# a read instead of the week's scans and breakdowns (audit.reports.weekly.weekly_report).
V9 = """
CREATE TABLE report_models (
    window_start TIMESTAMP NOT NULL,
    window_end TIMESTAMP NOT NULL,
    window_label VARCHAR NOT NULL,  -- its title names it (--week or --since/--until)
    config_hash VARCHAR NOT NULL,
    code_hash VARCHAR NOT NULL,     -- the audit code that computed it (audit.reports.weekly)
    made_at TIMESTAMP NOT NULL,
    model VARCHAR NOT NULL,         -- JSON, times tagged (weekly.model_to_json)
    figures VARCHAR                 -- JSON: the HTML's charts once drawn (render.html_figures)
);
"""

# GPU samples as a series per GPU and labels plus its readings, behind a view of the same
# name and columns (why: audit.warehouse.samples). Rows move over unchanged.
_SERIES = "host, gpu, model, uuid, job_label, pod, origin, source_id, run_id"
V10 = f"""
CREATE TABLE gpu_series (
    series INTEGER NOT NULL,
    host VARCHAR NOT NULL,
    gpu VARCHAR NOT NULL,
    model VARCHAR,
    uuid VARCHAR,
    job_label VARCHAR,
    pod VARCHAR,
    origin VARCHAR NOT NULL,
    source_id VARCHAR,
    run_id VARCHAR
);
CREATE TABLE gpu_readings (
    series INTEGER NOT NULL,
    ts TIMESTAMP NOT NULL,
    util_pct REAL,
    mem_used_mib REAL,
    mem_total_mib REAL,
    power_w REAL
);
INSERT INTO gpu_series
SELECT (row_number() OVER (ORDER BY {_SERIES}))::INTEGER, *
FROM (SELECT DISTINCT {_SERIES} FROM gpu_samples);
INSERT INTO gpu_readings
SELECT s.series, g.ts, g.util_pct, g.mem_used_mib, g.mem_total_mib, g.power_w
FROM gpu_samples g JOIN gpu_series s
  ON {" AND ".join(f"s.{c} IS NOT DISTINCT FROM g.{c}" for c in _SERIES.split(", "))};
DROP TABLE gpu_samples;
CREATE VIEW gpu_samples AS
SELECT s.host, s.gpu, r.ts, r.util_pct, r.mem_used_mib, r.mem_total_mib, r.power_w,
       s.model, s.uuid, s.job_label, s.pod, s.origin, s.source_id, s.run_id
FROM gpu_readings r JOIN gpu_series s USING (series);
"""

# Evaluation results files (audit ingest evals): each value of a results file with what the
# file records about its setting, beside the run the file is (audit.importers.evals).
V11 = """
CREATE TABLE eval_results (
    source_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    task VARCHAR NOT NULL,
    metric VARCHAR NOT NULL,
    filter VARCHAR NOT NULL,             -- lm-eval's filter ('none', 'strict-match'); '' in 0.3
    value DOUBLE NOT NULL,               -- finite
    stderr DOUBLE,
    higher_is_better BOOLEAN,            -- as the file records it; NULL when it does not
    n_shot INTEGER,
    task_version VARCHAR,
    task_hash VARCHAR,
    limit_n DOUBLE,                      -- --limit: a count, or a fraction below 1
    samples BIGINT,                      -- n-samples effective
    is_group BOOLEAN NOT NULL,           -- a group's aggregate over its subtasks
    gen_kwargs VARCHAR                   -- the task's generation kwargs, canonical JSON
);
"""

# A finding's impact when it claims no waste, and whether it passed its materiality floor
# (audit.materiality); NULL in scans stored before: listed, as they were. IF NOT EXISTS:
# a warehouse written by main between 9fd271d and a8e7cdf has them already, as its V11.
V12 = """
ALTER TABLE findings ADD COLUMN IF NOT EXISTS risk_gpu_hours DOUBLE;
ALTER TABLE findings ADD COLUMN IF NOT EXISTS material BOOLEAN;
"""

# `audit watch` (audit/watch/): the GPU indices a job was given, the actions taken on live
# findings, each invocation, and how far each followed telemetry file has been read.
V13 = """
CREATE TABLE job_gpus (
    cluster VARCHAR NOT NULL,
    job_id VARCHAR NOT NULL,
    host VARCHAR NOT NULL,
    gpu VARCHAR NOT NULL                 -- the index on the host (gres_detail IDX), as telemetry names it
);
CREATE TABLE watch_invocations (
    invocation_id BIGINT NOT NULL,
    started_at TIMESTAMP NOT NULL,
    finished_at TIMESTAMP,
    host VARCHAR,
    pid INTEGER,
    enforce BOOLEAN NOT NULL,
    once BOOLEAN NOT NULL,
    intervals INTEGER,                   -- intervals completed
    config_hash VARCHAR,
    outcome VARCHAR                      -- running | stopped | interrupted | failed
);
CREATE TABLE watch_actions (
    action_id BIGINT NOT NULL,
    invocation_id BIGINT NOT NULL,
    acted_at TIMESTAMP NOT NULL,
    policy VARCHAR NOT NULL,             -- [watch.policy.NAME]
    kind VARCHAR NOT NULL,               -- idle | unstable | red_line | duplicate_launch
    finding_key VARCHAR NOT NULL,        -- stable id of the live finding
    cluster VARCHAR,
    job_id VARCHAR,
    run_id VARCHAR,
    user_name VARCHAR,
    team VARCHAR,
    action VARCHAR NOT NULL,             -- open | warn | remind | cancel | would_cancel | resolve
    recipient VARCHAR,                   -- whom a warn or remind went to
    status VARCHAR NOT NULL,             -- sending | sent | failed | interrupted | cancelling | cancelled | ended | done
    message VARCHAR,
    evidence JSON,
    gpus INTEGER,
    usd_per_hour DOUBLE,                 -- the allocation's price while it runs
    saved_gpu_hours DOUBLE,              -- cancel: GPUs x time left to the time limit (NULL: no limit)
    detail VARCHAR                       -- an error, or why nothing was done
);
CREATE TABLE watch_cursors (
    location VARCHAR NOT NULL,           -- a followed telemetry file
    size BIGINT NOT NULL,                -- bytes read (whole lines)
    head VARCHAR NOT NULL,               -- its first line: a rotated file starts again from 0
    updated_at TIMESTAMP NOT NULL
);
"""


def _scrub(table: str, columns: list[str], users: tuple[str, ...] = (), keyed: bool = False) -> str:
    """Rewrite the rows of ``table`` that may hold an e-mail address or a credential, with
    the redaction every import now applies (``audit.redact``; RE2 here, linear in the text)."""
    sets = [f"{c} = {redact.sql_redacted(c)}" for c in columns]
    sets += [f"{c} = {redact.sql_redacted_user(c)}" for c in users]
    if keyed:  # params and tags: a credential's name hides its whole value
        sets = [s for s in sets if not s.startswith("value =")]
        sets.append(f"value = {_NEW_PARAM_VALUE}")
    suspect = " OR ".join(redact.sql_suspect(c) for c in (*columns, *users))
    return f"UPDATE {table} SET {', '.join(sets)} WHERE {suspect};"


_NEW_PARAM_VALUE = (
    f"CASE WHEN {redact.sql_credential_key('key')} AND value IS NOT NULL "
    f"THEN '{redact.SECRET_MARK}' ELSE {redact.sql_redacted('value')} END"
)
# E-mail addresses and credentials scrubbed from what earlier versions stored: the run
# tables, dataset inputs, model versions, W&B run states (JSON text: values the patterns
# reach) and findings; derived tables are dropped and rebuilt by the next import or report.
V14 = "\n".join(
    [
        _scrub("runs", ["name", "source_name", "artifact_uri", "experiment_id"], ("user_id",)),
        _scrub("experiments", ["experiment_id", "name", "artifact_location"]),
        # value_norm first: SET reads the old value, and a rewritten text is its own norm
        "UPDATE params SET value_norm = trim(" + _NEW_PARAM_VALUE + ") "
        "WHERE value_num IS NULL AND ("
        + _NEW_PARAM_VALUE
        + ") IS DISTINCT FROM value AND ("
        + redact.sql_suspect("key")
        + " OR "
        + redact.sql_suspect("value")
        + ");",
        _scrub("params", ["key", "value"], keyed=True),
        _scrub("tags", ["key", "value"], keyed=True),
        _scrub("metrics", ["key"]),
        _scrub("latest_metrics", ["key"]),
        _scrub("dataset_inputs", ["name", "source", "context"]),
        _scrub("model_versions", ["name", "source"]),
        _scrub("run_files", ["state"]),
        "UPDATE findings SET message = "
        + redact.sql_redacted("message")
        + ", subject = "
        + redact.sql_redacted("subject::VARCHAR")
        + "::JSON, evidence = "
        + redact.sql_redacted("evidence::VARCHAR")
        + "::JSON, team = "
        + redact.sql_redacted_user("team")
        + " WHERE "
        + " OR ".join(
            redact.sql_suspect(c)
            for c in ("message", "subject::VARCHAR", "evidence::VARCHAR", "team")
        )
        + ";",
        "DELETE FROM report_models;",
        "DROP TABLE IF EXISTS search_runs;",
    ]
)

# Rollups from a metrics server (audit ingest prometheus) beside raw samples: a series'
# bucket width (NULL: raw samples) and a reading's highest utilisation in its bucket, with
# the bucket's mean in util_pct and its memory peak in mem_used_mib. The view gains both.
V15 = """
ALTER TABLE gpu_series ADD COLUMN IF NOT EXISTS bucket_s INTEGER;
ALTER TABLE gpu_readings ADD COLUMN IF NOT EXISTS util_max REAL;
CREATE OR REPLACE VIEW gpu_samples AS
SELECT s.host, s.gpu, r.ts, r.util_pct, r.mem_used_mib, r.mem_total_mib, r.power_w,
       s.model, s.uuid, s.job_label, s.pod, s.origin, s.source_id, s.run_id,
       r.util_max, s.bucket_s
FROM gpu_readings r JOIN gpu_series s USING (series);
"""

MIGRATIONS: list[str] = [V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11, V12, V13, V14, V15]
