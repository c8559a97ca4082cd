"""Links between runs, jobs and checkpoints, derived inside every import transaction.

- run -> job: a run tag holding the Slurm job id (``[links] job_tag_keys``), else the one job
  of the same user whose allocation contains the run (± ``time_slack_minutes``).
- checkpoint -> run: the run's ``output_dir`` param contains the checkpoint, or the run id
  appears in the path, or the run's local ``artifact_uri`` contains it.

Links are always derived with the ``[links]`` settings in force, which are stored with
them. An import whose settings differ from the stored ones and would lose a link the
stored settings still give (say, an import run without the ``--config`` that maps
cluster paths) is refused with the list of what it would lose, and changes nothing;
``audit ingest links`` recomputes them on purpose. Links that end because the data
changed (a checkpoint deleted, a second job making a user+time match ambiguous) are never
a reason to refuse.

An import that changed only some runs (MLflow's, through ``changed``) refreshes only what
those runs can move, when the settings are the stored ones: a run's job link reads only
that run and the jobs; a checkpoint's link reads every run that is a candidate for it, so
the checkpoints linked to a changed run or now a candidate of one are derived again over
all runs; system-metric samples are grouped by host, so the hosts of the changed runs'
old and new jobs are derived again. Everything else is exactly what a full derivation
gives, because none of its inputs changed (tests/importers/test_links_incremental.py compares the
two on generated histories).

Readers use the relations ``run_jobs`` and ``checkpoint_runs``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from audit.config import Config
from audit.errors import InputError
from audit.text import counted

SETTINGS_KEY = "link_settings"
_DERIVED_JOBS = "audit_derived_run_jobs"
_DERIVED_CHECKPOINTS = "audit_derived_checkpoint_runs"


@dataclass(frozen=True)
class LinkSettings:
    """The ``[links]`` settings as links use them: local prefixes fully resolved."""

    job_tag_keys: tuple[str, ...]
    slack_minutes: int
    # (cluster prefix, local folder with symlinks resolved), longest cluster prefix first
    path_prefixes: tuple[tuple[str, str], ...]

    @classmethod
    def from_config(cls, config: Config) -> LinkSettings:
        links = config.links
        prefixes = {
            remote.rstrip("/"): os.path.realpath(config.local_path(local)).rstrip("/")
            for remote, local in links.path_prefixes.items()
        }
        return cls(
            job_tag_keys=tuple(links.job_tag_keys),
            slack_minutes=round(float(links.time_slack_minutes)),
            path_prefixes=tuple(sorted(prefixes.items(), key=lambda p: (-len(p[0]), p[0]))),
        )

    def as_json(self) -> str:
        return json.dumps(
            {
                "job_tag_keys": list(self.job_tag_keys),
                "time_slack_minutes": self.slack_minutes,
                "path_prefixes": dict(self.path_prefixes),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> LinkSettings:
        data = json.loads(text)
        return cls(
            job_tag_keys=tuple(data["job_tag_keys"]),
            slack_minutes=int(data["time_slack_minutes"]),
            path_prefixes=tuple(
                sorted(data["path_prefixes"].items(), key=lambda p: (-len(p[0]), p[0]))
            ),
        )

    def local_path(self, text: str) -> str:
        """A path as logged on the cluster (or a ``file://`` URI) as seen from here, resolved."""
        path = text.removeprefix("file://").rstrip("/") or "/"
        for remote, local in self.path_prefixes:
            if path == remote or path.startswith(remote + "/"):
                path = local + path[len(remote) :]
                break
        return os.path.realpath(path) if path.startswith("/") else path


@dataclass
class LinkChanges:
    checkpoints_before: int
    checkpoints_after: int
    runs_with_jobs_before: int
    runs_with_jobs_after: int


def refresh_links(
    con, config: Config, replace: bool = False, changed: dict[str, list[str]] | None = None
) -> LinkChanges:
    """Derive ``run_jobs`` and ``checkpoint_runs`` with the settings in force.

    ``changed`` (source id -> run ids), from an import that changed only those runs' rows
    (runs, params, tags, metrics) and nothing else links read: only what they can move is
    derived again, when the settings are the stored ones; else everything is.

    Raises InputError (and the import's transaction rolls back) when the settings differ
    from the stored ones and would lose links, unless ``replace``.
    """
    settings = LinkSettings.from_config(config)
    stored = _stored_settings(con)
    before = _counts(con, "checkpoint_runs", "run_jobs")
    if changed is not None and not replace and stored == settings:
        _refresh_for_runs(con, settings, changed)
        after = _counts(con, "checkpoint_runs", "run_jobs")
        return LinkChanges(before[0], after[0], before[1], after[1])
    compare = not replace and stored != settings
    if compare and stored is None:
        # links made before settings were stored: compare with them as they are
        con.execute(f"CREATE OR REPLACE TEMP TABLE audit_old_checkpoint_runs AS {_LIVE_CKP}")
        con.execute(f"CREATE OR REPLACE TEMP TABLE audit_old_run_jobs AS {_LIVE_JOBS}")
    elif compare:
        _derive(con, stored)
        con.execute(
            "CREATE OR REPLACE TEMP TABLE audit_old_checkpoint_runs AS "
            f"SELECT * FROM {_DERIVED_CHECKPOINTS}"
        )
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE audit_old_run_jobs AS SELECT * FROM {_DERIVED_JOBS}"
        )
    _derive(con, settings)
    if compare:
        try:
            _refuse_losses(con, config, settings, stored)
        finally:
            con.execute("DROP TABLE IF EXISTS audit_old_checkpoint_runs")
            con.execute("DROP TABLE IF EXISTS audit_old_run_jobs")
    con.execute("DELETE FROM run_jobs")
    con.execute(f"INSERT INTO run_jobs SELECT * FROM {_DERIVED_JOBS}")
    con.execute("DELETE FROM checkpoint_runs")
    con.execute(f"INSERT INTO checkpoint_runs SELECT * FROM {_DERIVED_CHECKPOINTS}")
    con.execute(f"DROP TABLE {_DERIVED_JOBS}")
    con.execute(f"DROP TABLE {_DERIVED_CHECKPOINTS}")
    con.execute("DELETE FROM audit_meta WHERE key = ?", [SETTINGS_KEY])
    con.execute("INSERT INTO audit_meta VALUES (?, ?)", [SETTINGS_KEY, settings.as_json()])
    _system_metrics_as_telemetry(con)
    after = _counts(con, "checkpoint_runs", "run_jobs")
    return LinkChanges(before[0], after[0], before[1], after[1])


def refresh_links_of_runs(con, config: Config, changed: dict[str, list[str]]) -> None:
    """After rows of only the ``changed`` runs were rewritten outside an import (one run
    refreshed from a tracking server): their links, when the settings in force are the
    stored ones. Otherwise nothing: the next import derives every link (and compares), as
    incremental refreshes build on links that are exactly what the stored settings give."""
    settings = LinkSettings.from_config(config)
    if _stored_settings(con) == settings:
        _refresh_for_runs(con, settings, changed)


def _counts(con, checkpoints: str, jobs: str) -> tuple[int, int]:
    return con.execute(
        f"SELECT (SELECT count(DISTINCT path) FROM {checkpoints}), "
        f"(SELECT count(DISTINCT (source_id, run_id)) FROM {jobs})"
    ).fetchall()[0]


def _stored_settings(con) -> LinkSettings | None:
    rows = con.execute("SELECT value FROM audit_meta WHERE key = ?", [SETTINGS_KEY]).fetchall()
    return LinkSettings.from_json(rows[0][0]) if rows else None


# existing links whose checkpoint, run and job are all still in the warehouse
_LIVE_CKP = """
    SELECT l.* FROM checkpoint_runs l
    WHERE EXISTS (SELECT 1 FROM checkpoints c WHERE c.path = l.path)
      AND EXISTS (SELECT 1 FROM runs r WHERE r.source_id = l.source_id AND r.run_id = l.run_id)
"""
_LIVE_JOBS = """
    SELECT l.* FROM run_jobs l
    WHERE EXISTS (SELECT 1 FROM runs r WHERE r.source_id = l.source_id AND r.run_id = l.run_id)
      AND EXISTS (SELECT 1 FROM jobs j WHERE j.cluster = l.cluster AND j.job_id = l.job_id)
"""


def _refuse_losses(con, config: Config, settings: LinkSettings, stored: LinkSettings | None):
    lost_checkpoints = con.execute(
        f"""
        SELECT o.path, o.run_id, o.method, r.name FROM audit_old_checkpoint_runs o
        LEFT JOIN runs r ON r.source_id = o.source_id AND r.run_id = o.run_id
        WHERE NOT EXISTS (SELECT 1 FROM {_DERIVED_CHECKPOINTS} n
                          WHERE n.path = o.path AND n.source_id = o.source_id AND n.run_id = o.run_id)
        ORDER BY o.path
        """
    ).fetchall()
    lost_jobs = con.execute(
        f"""
        SELECT o.run_id, o.job_id, o.method FROM audit_old_run_jobs o
        WHERE NOT EXISTS (SELECT 1 FROM {_DERIVED_JOBS} n
                          WHERE n.source_id = o.source_id AND n.run_id = o.run_id
                            AND n.cluster = o.cluster AND n.job_id = o.job_id)
        ORDER BY o.run_id
        """
    ).fetchall()
    if not lost_checkpoints and not lost_jobs:
        return
    losses = []
    if lost_checkpoints:
        path, run_id, method, name = lost_checkpoints[0]
        losses.append(
            f"{counted(len(lost_checkpoints), 'checkpoint')} from their runs (e.g. {path} from run "
            f"{name or run_id!r} via {method})"
        )
    if lost_jobs:
        run_id, job_id, method = lost_jobs[0]
        losses.append(
            f"{counted(len(lost_jobs), 'run')} from their Slurm jobs (e.g. run {run_id} from job {job_id} via {method})"
        )
    source = f"--config {config.path}" if config.path else "no --config (built-in defaults)"
    if stored is None:
        difference = (
            f"the links in the warehouse were made with other [links] settings than {source}"
        )
    else:
        difference = (
            f"the links in the warehouse were made with [links] {_describe(stored, settings)}; "
            f"this command runs with {source}: {_describe(settings, stored)}"
        )
    raise InputError(
        f"nothing was imported: this import would unlink {' and '.join(losses)}, because "
        f"{difference}. Pass the --config the earlier imports used, or run "
        "`audit ingest links` with this one to recompute the links on purpose"
    )


def _describe(settings: LinkSettings, other: LinkSettings) -> str:
    parts = []
    if settings.path_prefixes != other.path_prefixes:
        parts.append(f"path_prefixes {json.dumps(dict(settings.path_prefixes))}")
    if settings.job_tag_keys != other.job_tag_keys:
        parts.append(f"job_tag_keys {json.dumps(list(settings.job_tag_keys))}")
    if settings.slack_minutes != other.slack_minutes:
        parts.append(f"time_slack_minutes {settings.slack_minutes}")
    return ", ".join(parts)


def _derive(con, settings: LinkSettings) -> None:
    """The links ``settings`` give on the warehouse's current data, into the derived tables."""
    _derive_jobs(con, settings, only_runs=None)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {_DERIVED_CHECKPOINTS} AS SELECT * FROM checkpoint_runs LIMIT 0"
    )
    with _prefixes(con, settings):
        con.execute(f"INSERT INTO {_DERIVED_CHECKPOINTS} {_checkpoint_links()}")


def _derive_jobs(con, settings: LinkSettings, only_runs: str | None) -> None:
    """Run -> job links into ``_DERIVED_JOBS``, of the runs in table ``only_runs`` (source_id,
    run_id) or of all. A run's link reads only its own tags and row, and the jobs."""
    keys, slack = list(settings.job_tag_keys), settings.slack_minutes

    def of_runs(alias: str) -> str:
        return _of_runs(only_runs, alias)

    con.execute(f"CREATE OR REPLACE TEMP TABLE {_DERIVED_JOBS} AS SELECT * FROM run_jobs LIMIT 0")
    con.execute(
        f"""
        INSERT INTO {_DERIVED_JOBS}
        SELECT DISTINCT ON (t.source_id, t.run_id) t.source_id, t.run_id, j.cluster, j.job_id, 'tag:' || t.key
        FROM tags t JOIN jobs j ON j.job_id = trim(t.value)
        WHERE list_contains(?, t.key){of_runs("t")}
        ORDER BY t.source_id, t.run_id, list_position(?, t.key), j.cluster
        """,
        [keys, keys],
    )
    con.execute(
        f"""
        INSERT INTO {_DERIVED_JOBS}
        SELECT r.source_id, r.run_id, any_value(j.cluster), any_value(j.job_id), 'user+time'
        FROM runs r
        JOIN jobs j ON j.user_name = r.user_id
             AND j.start_time <= r.start_time + to_minutes(CAST(? AS BIGINT))
             AND coalesce(j.end_time, r.end_time) >= coalesce(r.end_time, r.start_time) - to_minutes(CAST(? AS BIGINT))
        WHERE NOT EXISTS (SELECT 1 FROM {_DERIVED_JOBS} x WHERE x.source_id = r.source_id AND x.run_id = r.run_id){of_runs("r")}
        GROUP BY r.source_id, r.run_id
        HAVING count(*) = 1
        """,
        [slack, slack],
    )


def _of_runs(table: str | None, alias: str) -> str:
    """A condition (`` AND ...``) keeping the rows of ``alias`` whose run is in ``table``."""
    if table is None:
        return ""
    return (
        f" AND EXISTS (SELECT 1 FROM {table} o "
        f"WHERE o.source_id = {alias}.source_id AND o.run_id = {alias}.run_id)"
    )


class _prefixes:
    """The settings' path prefixes as table ``audit_prefixes`` while the block runs."""

    def __init__(self, con, settings: LinkSettings):
        self.con, self.settings = con, settings

    def __enter__(self) -> None:
        self.con.execute(
            "CREATE OR REPLACE TEMP TABLE audit_prefixes (remote VARCHAR, local VARCHAR)"
        )
        if self.settings.path_prefixes:
            self.con.executemany(
                "INSERT INTO audit_prefixes VALUES (?, ?)", list(self.settings.path_prefixes)
            )

    def __exit__(self, *exc) -> None:
        self.con.execute("DROP TABLE IF EXISTS audit_prefixes")


# Folder names a training framework puts between its output folder and the checkpoints it
# saves (Lightning's lightning_logs/version_N/checkpoints, verl's global_step_N/actor,
# step_N, epoch_N ...): a run's output_dir claims checkpoints below it through these only.
# Any other folder in between is somebody else's (a run that logged a parent folder as its
# output_dir must not take over the runs, or the orphans, below it).
_CONTAINER = (
    r"(?:checkpoints?|ckpts?|lightning_logs|version_\d+|global_step_?\d+|(?:step|epoch|iter)"
    r"(?:ation)?[_-]?\d+|actor|critic|ref|reward_model|huggingface|hf|models?|weights|"
    r"saved_models?|final|best|last)"
)
_CONTAINERS = rf"{_CONTAINER}(?:/{_CONTAINER})*"


def _checkpoint_candidates(only_runs: str | None = None, only_paths: str | None = None) -> str:
    """SELECT of every (checkpoint, run) pair that could link, with its method, rank and
    closeness (the length of the claiming folder), of the runs in table ``only_runs`` and
    the checkpoints in table ``only_paths`` (or all).

    An ``output_dir`` claims the checkpoint it names, the checkpoints in it, and those in
    framework folders below it (``_CONTAINERS``)."""

    def of_runs(alias: str) -> str:
        return _of_runs(only_runs, alias)

    paths_filter = (
        ""
        if only_paths is None
        else f" WHERE EXISTS (SELECT 1 FROM {only_paths} q WHERE q.path = k.path)"
    )
    return rf"""
        WITH output_dirs AS (
            SELECT p.source_id, p.run_id, coalesce(
                (SELECT m.local || substr(rtrim(p.value, '/'), length(m.remote) + 1) FROM audit_prefixes m
                 WHERE rtrim(p.value, '/') = m.remote OR starts_with(p.value, m.remote || '/')
                 ORDER BY length(m.remote) DESC LIMIT 1),
                rtrim(p.value, '/')) AS dir
            FROM params p WHERE p.key = 'output_dir'{of_runs("p")}
        ),
        known AS (SELECT path, run_dir FROM checkpoints k{paths_filter}),
        -- each checkpoint with the folders above it (itself included): "path is under dir"
        -- becomes an equality join, not a prefix test of every checkpoint against every run
        ancestors AS (
            SELECT path, run_dir, unnest(list_transform(
                       generate_series(2, len(string_split(path, '/'))),
                       lambda i: array_to_string(string_split(path, '/')[1:i], '/'))) AS dir
            FROM known
        ),
        artifact_dirs AS (
            SELECT source_id, run_id, rtrim(regexp_replace(artifact_uri, '^file://', ''), '/') AS dir
            FROM runs r WHERE (artifact_uri LIKE 'file://%' OR artifact_uri LIKE '/%'){of_runs("r")}
        ),
        id_runs AS (SELECT source_id, run_id FROM runs r WHERE true{of_runs("r")})
        SELECT a.path, p.source_id, p.run_id, 'output_dir' AS method, 1 AS rank,
               length(a.dir) AS closeness
        FROM ancestors a JOIN output_dirs p ON p.dir = a.dir
        WHERE a.dir = a.path OR a.dir = a.run_dir
           OR (starts_with(a.run_dir, a.dir || '/')
               AND regexp_full_match(substr(a.run_dir, length(a.dir) + 2), '{_CONTAINERS}'))
        UNION ALL
        SELECT c.path, r.source_id, r.run_id, 'run_id_in_path', 2, 0
        FROM known c JOIN id_runs r
             ON r.run_id = regexp_extract(c.path, '(?:^|/)([0-9a-f]{{32}})(?:/|$)', 1)
        UNION ALL
        SELECT a.path, r.source_id, r.run_id, 'artifact_uri', 3, length(a.dir)
        FROM ancestors a JOIN artifact_dirs r ON r.dir = a.dir AND a.dir <> a.path
    """


def _checkpoint_links(only_paths: str | None = None) -> str:
    """SELECT of each checkpoint's link: its best candidate over all runs, the closest
    folder first among candidates of one method."""
    return (
        f"WITH candidates AS ({_checkpoint_candidates(only_paths=only_paths)}) "
        "SELECT DISTINCT ON (path) path, source_id, run_id, method FROM candidates "
        "ORDER BY path, rank, closeness DESC, source_id, run_id"
    )


def _refresh_for_runs(con, settings: LinkSettings, changed: dict[str, list[str]]) -> None:
    """``refresh_links`` after an import that changed only the runs ``changed``, with the
    stored settings: the module docstring says why the result equals a full derivation."""
    con.execute("CREATE OR REPLACE TEMP TABLE audit_link_runs (source_id VARCHAR, run_id VARCHAR)")
    rows = [(source_id, run_id) for source_id, ids in changed.items() for run_id in ids]
    if not rows:
        con.execute("DROP TABLE audit_link_runs")
        return
    _insert_pairs(con, rows)
    changed_runs = "true" + _of_runs("audit_link_runs", "l")
    # hosts whose system-metric samples can move: those of the changed runs' jobs, before
    con.execute(
        "CREATE OR REPLACE TEMP TABLE audit_link_hosts AS "
        f"SELECT DISTINCT n.host FROM run_jobs l JOIN job_nodes n USING (cluster, job_id) WHERE {changed_runs}"
    )
    _derive_jobs(con, settings, only_runs="audit_link_runs")
    con.execute(f"DELETE FROM run_jobs l WHERE {changed_runs}")
    con.execute(f"INSERT INTO run_jobs SELECT * FROM {_DERIVED_JOBS}")
    con.execute(f"DROP TABLE {_DERIVED_JOBS}")
    # ... and after
    con.execute(
        "INSERT INTO audit_link_hosts SELECT DISTINCT n.host FROM run_jobs l "
        f"JOIN job_nodes n USING (cluster, job_id) WHERE {changed_runs}"
    )
    # Every link is to a checkpoint in the inventory: none, nothing to derive (the
    # candidates' query reads every run's output_dir even for no checkpoint).
    if con.execute("SELECT 1 FROM checkpoints LIMIT 1").fetchall():
        _refresh_checkpoints_of_runs(con, settings, changed_runs)
    _system_metrics_as_telemetry(con, only_hosts="audit_link_hosts")
    for table in ("audit_link_runs", "audit_link_hosts"):
        con.execute(f"DROP TABLE {table}")


def _refresh_checkpoints_of_runs(con, settings: LinkSettings, changed_runs: str) -> None:
    """Checkpoint links that runs matching ``changed_runs`` (a condition on alias ``l``) can
    move: those linked to one, and those one is now a candidate for, over all runs."""
    with _prefixes(con, settings):
        con.execute(
            "CREATE OR REPLACE TEMP TABLE audit_link_paths AS "
            f"SELECT path FROM checkpoint_runs l WHERE {changed_runs} UNION "
            f"SELECT path FROM ({_checkpoint_candidates(only_runs='audit_link_runs')})"
        )
        if con.execute("SELECT 1 FROM audit_link_paths LIMIT 1").fetchall():
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE {_DERIVED_CHECKPOINTS} AS "
                f"{_checkpoint_links(only_paths='audit_link_paths')}"
            )
            con.execute(
                "DELETE FROM checkpoint_runs l WHERE EXISTS "
                "(SELECT 1 FROM audit_link_paths q WHERE q.path = l.path)"
            )
            con.execute(f"INSERT INTO checkpoint_runs SELECT * FROM {_DERIVED_CHECKPOINTS}")
            con.execute(f"DROP TABLE {_DERIVED_CHECKPOINTS}")
    con.execute("DROP TABLE audit_link_paths")


def _insert_pairs(con, rows: list[tuple[str, str]]) -> None:
    import polars as pl

    from audit.warehouse.frames import execute_on_frame

    execute_on_frame(
        con,
        "INSERT INTO audit_link_runs SELECT * FROM incoming_frame",
        pl.DataFrame(rows, schema={"source_id": pl.String, "run_id": pl.String}, orient="row"),
    )


def _system_metrics_as_telemetry(con, only_hosts: str | None = None) -> None:
    """MLflow system metrics (system/gpu_N_*) of runs linked to a job become GPU samples.

    They land on the job's first host with origin 'mlflow'; runs without a job are left
    out, because a sample must belong to a host for the idle and utilisation rules. A
    sample with a value no GPU reports (infinite, or outside the range telemetry files are
    held to: ``VALID_RANGES``) or a time outside the years they are held to is left out,
    as a telemetry file's line would be.
    Samples are grouped by host: with ``only_hosts`` (a table of hosts) only those hosts'
    samples are derived again.
    """
    of_hosts = "" if only_hosts is None else f" AND host IN (SELECT host FROM {only_hosts})"
    if only_hosts is not None and not con.execute(f"SELECT 1 FROM {only_hosts} LIMIT 1").fetchall():
        return
    import polars as pl

    from audit.importers.telemetry import valid_time, valid_value
    from audit.warehouse.samples import append_samples, delete_samples

    delete_samples(con, f"t.origin = 'mlflow'{of_hosts}")
    derived = con.sql(
        rf"""
        WITH host_of AS (
            SELECT l.source_id, l.run_id, min(n.host) AS host
            FROM run_jobs l JOIN job_nodes n ON n.cluster = l.cluster AND n.job_id = l.job_id
            GROUP BY ALL
        ),
        hosts AS (SELECT * FROM host_of WHERE true{of_hosts}),
        points AS (
            SELECT m.source_id, m.run_id, m.ts, regexp_extract(m.key, '^system/gpu_(\d+)_', 1) AS gpu,
                   regexp_extract(m.key, '^system/gpu_\d+_(.*)$', 1) AS field, m.value
            FROM metrics m
            WHERE starts_with(m.key, 'system/gpu_') AND NOT isnan(m.value)
        )
        SELECT h.host, p.gpu, p.ts,
               max(p.value) FILTER (WHERE p.field = 'utilization_percentage') AS util_pct,
               max(p.value) FILTER (WHERE p.field = 'memory_usage_megabytes') AS mem_used_mib,
               max(p.value) FILTER (WHERE p.field = 'power_usage_watts') AS power_w,
               'mlflow' AS origin, any_value(p.source_id) AS source_id,
               any_value(p.run_id) AS run_id
        FROM points p JOIN hosts h USING (source_id, run_id)
        WHERE p.gpu <> ''
          AND NOT EXISTS (SELECT 1 FROM gpu_samples g WHERE g.host = h.host AND g.gpu = p.gpu AND g.ts = p.ts)
        GROUP BY h.host, p.gpu, p.ts
        """
    ).pl()
    readings = ("util_pct", "mem_used_mib", "power_w")
    valid = pl.all_horizontal(valid_time("ts"), *(valid_value(c) for c in readings))
    append_samples(con, derived.filter(valid))


def relink(wh, config: Config) -> LinkChanges:
    """Recompute every link with ``config``, dropping those it no longer gives (on purpose)."""
    with wh.transaction() as con:
        return refresh_links(con, config, replace=True)
