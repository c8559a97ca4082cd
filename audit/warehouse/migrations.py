"""Versioned schema migrations.

Each entry upgrades the warehouse from version ``n - 1`` to ``n``. Never edit a released
migration: append a new one. ``docs/schema.md`` documents the resulting tables.
"""

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

MIGRATIONS: list[str] = [V1]
