"""Cost and attribution: what each run and job cost, and whose it was.

Every figure in a finding, a summary, a report, ``runs similar/compare`` and ``gate`` comes
from here, so spend and waste are priced and attributed the same way everywhere.

GPU count and type per run, from the best evidence of what it was *given* (the *cost
ladder*; a machine's GPU list is not a run's allocation):

1. ``slurm``: the linked Slurm job's allocation × its elapsed time;
2. ``devices``: the GPU list the run recorded itself (``[cost] gpu_list_keys``, e.g.
   ``CUDA_VISIBLE_DEVICES=4,5,6,7``) × the run's wall clock;
3. ``world_size``: the world size the framework reported while it ran (tag
   ``audit.world_size``, read by the importers from the run's console log, e.g. verl's
   ``model_world_size_4_rank_0.pt``) × the run's wall clock;
4. ``params``: the parallelism the run was configured with (``[cost] gpu_count_keys``;
   ``a*b`` multiplies two keys, as ``trainer.n_gpus_per_node*trainer.nnodes``);
5. ``activity``: the GPUs whose samples show the run's own activity (utilisation above 0
   at some point, or memory that changed). Tracker system metrics (MLflow ``system/gpu_N_*``,
   W&B ``gpu.N.*``) list every GPU of the *machine*: a GPU held at constant memory and 0 %
   through the run is another tenant's, an empty one nobody's; neither is this run's cost;
6. ``default``: ``[cost] default_gpus_per_run`` when the user set it;
7. ``unknown``: GPU-hours and dollars stay unknown (None), never zero; the run-hours are
   still known and reported.

Rungs 1-4 are an allocation (the GPUs the run held, idle or not); rung 5 is only what was
seen working, so the utilisation rules judge no idle GPU against it.

A run's wall clock ends at its end time, else at its last logged metric (a run killed
without an end record). One team, method and base model per run and per job, decided by
``team_of``/``Facts.load`` for spend and waste alike: the team is the first of
``[attribution] team_order`` that is known (run tag ``team_tag``, the Slurm account, the
user); a job with runs takes its first run's team, method and base model.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

import polars as pl

from audit.config import Config
from audit.facts.cost_basis import HOUR, Cost, hours_between, named_card, team_of
from audit.facts.jobs import JobFacts, JobTable, load_jobs
from audit.facts.prices import Prices
from audit.heap import long_lived
from audit.warehouse.values import RUN_SECONDS_TAG, WORLD_SIZE_TAG
from audit.windows import Window, started_in

MAX_GPUS = 1_000_000  # a GPU count above this is not a count (a typo, an id)
# an entry of CUDA_VISIBLE_DEVICES: an index, a GPU or MIG UUID
_GPU_ID = re.compile(r"\d{1,7}|(?:GPU|MIG)-[0-9A-Za-z/-]{1,80}")
# SQL: a GPU of a run's samples that shows the run's own activity: busy at some point, or
# memory that moved (another tenant's process holds its memory constant at 0 %; an empty
# GPU holds none). 256 MiB or 2 % of the card: below what a CUDA context and a model take.
ACTIVE_GPU = (
    "coalesce(util_max, 0) > 0 OR coalesce(mem_max - mem_min, 0) >= "
    "greatest(256, 0.02 * coalesce(mem_total, 0))"
)


@dataclass(slots=True)
class RunFacts:
    source_id: str
    run_id: str
    name: str | None
    status: str | None
    lifecycle_stage: str | None
    start_time: datetime | None
    end_time: datetime | None
    last_seen: datetime | None  # end time, else the last logged metric
    user_id: str | None
    experiment_id: str | None
    experiment: str | None
    entry_point: str | None
    parent_run_id: str | None
    team: str | None
    team_source: str | None  # tag | account | user
    method: str | None
    base_model: str | None
    cluster: str | None
    job_id: str | None
    job_start: datetime | None
    job_end: datetime | None
    job_state: str | None
    cost: Cost
    # GPUs in the run's own GPU samples or system metrics (a machine's list), 0 when none
    sampled_gpus: int = 0
    # how long it ran when its log says so but nothing places it in time (a copied
    # trainer-log folder: ``audit.run_seconds``); None when the times say it
    recorded_hours: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.source_id, self.run_id)

    @property
    def run_hours(self) -> float | None:
        return hours_between(self.start_time, self.last_seen) or self.recorded_hours

    @property
    def time_known(self) -> bool:
        """Whether the run is placed in time (else its points are placed by step only)."""
        return self.start_time is not None

    def subject(self) -> dict:
        """What a finding about the run names it by."""
        return {"run_id": self.run_id, "run_name": self.name}


def _streamed(result, batch: int = 50_000):
    """The rows of a query result a batch at a time: ``fetchall`` holds every row's tuple
    beside the facts built from them (1.1 GB more at peak when jobs were built so, at a
    million), and the freed tuples leave the facts' memory fragmented."""
    while rows := result.fetchmany(batch):
        yield from rows


class Facts:
    """Every run and GPU job with cost and attribution, read once per scan or report.

    The runs are objects; the jobs are a ``JobTable``, columns with a job's facts made
    when asked for (a million jobs are common, a million runs are not)."""

    def __init__(
        self,
        config: Config,
        runs: list[RunFacts],
        jobs: JobTable | list[JobFacts],
        text: _TextPool | None = None,
        by_key: dict[tuple[str, str], RunFacts] | None = None,
    ):
        self.config = config
        self.runs = runs
        self.jobs = jobs if isinstance(jobs, JobTable) else JobTable.of(jobs)
        # ``load`` gives the runs by key as it builds them (a run's ``key`` is a new tuple
        # on each call: 0.4 s at 100,000 runs)
        self._runs = by_key if by_key is not None else {r.key: r for r in runs}
        self._keys = {key: key for key in self._runs}
        # the facts' strings, for the per-run tables rules build beside them (``shared``)
        self.text = text or _TextPool()
        # the runs are ordered by start time, unknown starts last (``load``'s ORDER BY):
        # the runs started in a window are one slice, found by bisection
        self._run_starts = [r.start_time for r in runs if r.start_time is not None]

    def runs_in(self, window: Window) -> list[RunFacts]:
        """The runs started in ``window`` (every run for an unbounded window), by start."""
        return started_in(self.runs, self._run_starts, window)

    def run(self, source_id: str, run_id: str) -> RunFacts | None:
        return self._runs.get((source_id, run_id))

    def key_of(self, source_id: str, run_id: str) -> tuple[str, str]:
        """The run's key as the facts hold it: the per-run tables of a scan (benchmark
        values, series, params) then share one tuple per run instead of a tuple and two
        strings each (about 20 MB per table at 100,000 runs)."""
        key = (source_id, run_id)
        return self._keys.get(key, key)

    def job(self, cluster: str, job_id: str) -> JobFacts | None:
        position = self.jobs.position(cluster, job_id)
        return None if position is None else self.jobs[position]

    def jobs_by_id(self, job_id: str) -> list[JobFacts]:
        """The jobs of every cluster with this id (a finding's subject names the id)."""
        return self.jobs.with_job_id(job_id)

    def run_by_id(self, run_id: str) -> RunFacts | None:
        """The first run with this id in any source (a finding's subject names the id)."""
        if not hasattr(self, "_by_run_id"):
            self._by_run_id: dict[str, RunFacts] = {}
            for run in self.runs:
                self._by_run_id.setdefault(run.run_id, run)
        return self._by_run_id.get(run_id)

    @classmethod
    def load(cls, con, config: Config) -> Facts:
        attribution, cost_settings = config.attribution, config.cost
        order = list(attribution.team_order)
        count_keys = [WORLD_SIZE_TAG, *cost_settings.gpu_count_keys]
        list_keys = list(cost_settings.gpu_list_keys)
        type_keys = list(cost_settings.gpu_type_keys)
        team_tag = [attribution.team_tag]
        method_keys = list(attribution.method_keys)
        base_model_keys = list(attribution.base_model_keys)
        default_gpus = cost_settings.default_gpus_per_run
        default_type = cost_settings.default_gpu_type or None
        pool = _TextPool()
        same = pool.same
        price_of = Prices(config)
        # the keys whose first set value is an attribute: each a column of the runs' query
        pivoted = sorted({*method_keys, *base_model_keys, *team_tag, *type_keys, RUN_SECONDS_TAG})
        column = {key: f"k{index}" for index, key in enumerate(pivoted)}
        # the GPU-count keys' parts: read only for runs without a Slurm job's count
        count_parts = sorted(
            {part for key in count_keys for part in key.split("*")} | set(list_keys)
        )
        keys = sorted({*pivoted, *count_parts})
        # jobs as columns (``audit.facts.jobs``); those runs link to are made now, as
        # their runs are priced by them and give them their attribution
        jobs = load_jobs(con, order, price_of)
        linked_keys = con.execute("SELECT DISTINCT cluster, job_id FROM run_jobs").fetchall()
        jobs_by_key = jobs.linked(linked_keys)
        runs: list[RunFacts] = []
        by_key: dict[tuple[str, str], RunFacts] = {}
        no_job = (None, None, None)
        run_rows = con.execute(
            rf"""
            WITH attribute AS (  -- one row per run and key: its param, else its tag
                SELECT source_id, run_id, key, first(value ORDER BY pos) AS value
                FROM (
                    SELECT source_id, run_id, key, value, 0 AS pos FROM params
                    WHERE list_contains(?, key)
                    UNION ALL
                    SELECT source_id, run_id, key, value, 1 FROM tags WHERE list_contains(?, key)
                )
                GROUP BY ALL
            ),
            attributes AS (  -- one row per run: a column per pivoted key, the counts' parts
                -- one ordered aggregate per (run, key), not one per key and run: DuckDB sorts
                -- for each ordered aggregate (0.41 s against 0.25 s at 100,000 runs). The
                -- count parts are one JSON text of [key, value] pairs, not a column each: a
                -- column costs its pivot and its fetch for every run (0.1 s at 14 parts),
                -- and the pairs are parsed only for the few runs without a job's count.
                SELECT source_id, run_id,
                       {"".join(f"first(value) FILTER (WHERE key = ?) AS {column[k]}, " for k in pivoted)}
                       CAST(to_json(list([key, value]) FILTER (WHERE list_contains(?, key)))
                            AS VARCHAR) AS counts
                FROM attribute GROUP BY ALL
            ),
            links AS (
                SELECT source_id, run_id, min_by(cluster, job_id) AS cluster, min(job_id) AS job_id
                FROM run_jobs GROUP BY ALL
            ),
            seen AS (
                SELECT source_id, run_id, max(ts) AS last_metric,
                       bool_or(starts_with(key, 'system/gpu_')) AS has_system_gpus
                FROM latest_metrics GROUP BY ALL
            ),
            own_samples AS (  -- GPU samples a run logged itself (W&B system metrics)
                SELECT source_id, run_id, gpu, max(util_pct) AS util_max,
                       min(mem_used_mib) AS mem_min, max(mem_used_mib) AS mem_max,
                       max(mem_total_mib) AS mem_total, max(ts) AS last_sample
                FROM gpu_samples WHERE run_id IS NOT NULL GROUP BY ALL
            ),
            system_points AS (  -- MLflow system metrics of runs without samples of their own
                -- the regular expression only where the prefix matches (0.23 against
                -- 0.14 s at 500,000 metrics under FILTER)
                SELECT m.source_id, m.run_id,
                       regexp_extract(m.key, '^system/gpu_(\d+)_', 1) AS gpu,
                       regexp_extract(m.key, '^system/gpu_\d+_(.*)$', 1) AS field, m.value
                FROM metrics m
                WHERE starts_with(m.key, 'system/gpu_') AND isfinite(m.value)
                  AND EXISTS (SELECT 1 FROM seen s WHERE s.source_id = m.source_id
                              AND s.run_id = m.run_id AND s.has_system_gpus)
                  AND NOT EXISTS (SELECT 1 FROM own_samples o WHERE o.source_id = m.source_id
                                  AND o.run_id = m.run_id)
            ),
            per_gpu AS (
                SELECT source_id, run_id, gpu, util_max, mem_min, mem_max, mem_total
                FROM own_samples
                UNION ALL
                SELECT source_id, run_id, gpu,
                       max(value) FILTER (WHERE field = 'utilization_percentage'),
                       min(value) FILTER (WHERE field = 'memory_usage_megabytes'),
                       max(value) FILTER (WHERE field = 'memory_usage_megabytes'), NULL
                FROM system_points WHERE gpu <> '' GROUP BY ALL
            ),
            sampled AS (
                SELECT source_id, run_id, count(*) AS gpus,
                       count(*) FILTER (WHERE {ACTIVE_GPU}) AS active_gpus
                FROM per_gpu GROUP BY ALL
            ),
            last_samples AS (
                SELECT source_id, run_id, max(last_sample) AS last_sample
                FROM own_samples GROUP BY ALL
            )
            SELECT r.source_id, r.run_id, r.name, r.status, r.lifecycle_stage, r.start_time,
                   r.end_time, r.user_id, r.experiment_id, e.name AS experiment,
                   coalesce(nullif(r.source_name, ''), src.value) AS entry_point,
                   parent.value AS parent_run_id, l.cluster, l.job_id,
                   greatest(s.last_metric, ls.last_sample) AS last_metric,
                   coalesce(g.gpus, 0) AS sampled_gpus, coalesce(g.active_gpus, 0) AS active_gpus,
                   {_first_set(type_keys, column)}, {_first_set(team_tag, column)},
                   {_first_set(method_keys, column)}, {_first_set(base_model_keys, column)},
                   {_first_set([RUN_SECONDS_TAG], column)}, a.counts
            FROM runs r
            LEFT JOIN experiments e ON e.source_id = r.source_id AND e.experiment_id = r.experiment_id
            LEFT JOIN tags src ON src.source_id = r.source_id AND src.run_id = r.run_id
                 AND src.key = 'mlflow.source.name'
            LEFT JOIN tags parent ON parent.source_id = r.source_id AND parent.run_id = r.run_id
                 AND parent.key = 'mlflow.parentRunId'
            LEFT JOIN links l ON l.source_id = r.source_id AND l.run_id = r.run_id
            LEFT JOIN seen s ON s.source_id = r.source_id AND s.run_id = r.run_id
            LEFT JOIN sampled g ON g.source_id = r.source_id AND g.run_id = r.run_id
            LEFT JOIN last_samples ls ON ls.source_id = r.source_id AND ls.run_id = r.run_id
            LEFT JOIN attributes a ON a.source_id = r.source_id AND a.run_id = r.run_id
            ORDER BY r.start_time NULLS LAST, r.source_id, r.run_id
            """,
            [keys, keys, *pivoted, count_parts],
        )
        for row in _streamed(run_rows):
            source_id, run_id, name, status, lifecycle_stage, start_time, end_time = row[:7]
            user_id, experiment_id, experiment, entry_point, parent_run_id = row[7:12]
            cluster, job_id, last_metric, sampled_gpus, active_gpus = row[12:17]
            type_value, team_tag_value, method, base_model, run_seconds = row[17:22]
            source_id = same(source_id, source_id)
            job, allocated_type, host_model = (
                jobs_by_key.get((cluster, job_id), no_job) if job_id else no_job
            )
            last_seen = end_time or last_metric
            gpu_type = (named_card(allocated_type, host_model) if allocated_type else None) or (
                same(type_value, type_value) or default_type or host_model
            )
            price = price_of(gpu_type, cluster)
            recorded_hours = _recorded_hours(run_seconds)
            wall = hours_between(start_time, last_seen) or recorded_hours
            cost = _run_cost(
                job,
                row[22],
                count_keys,
                list_keys,
                default_gpus,
                wall,
                active_gpus,
                gpu_type,
                price.usd,
                price.key,
            )
            user_id = same(user_id, user_id)
            team, team_source = team_of(
                order,
                same(team_tag_value, team_tag_value),
                job and job.account,
                user_id or (job and job.user_name),
            )
            fact = RunFacts(
                source_id,
                run_id,
                name,
                same(status, status),
                same(lifecycle_stage, lifecycle_stage),
                start_time,
                end_time,
                last_seen,
                user_id,
                same(experiment_id, experiment_id),
                same(experiment, experiment),
                same(entry_point, entry_point),
                parent_run_id,
                team,
                team_source,
                same(lower := method.lower(), lower) if method else None,
                same(base_model, base_model),
                same(cluster, cluster),
                job_id,
                job and job.start_time,
                job and job.end_time,
                job and job.state,
                cost,
                sampled_gpus,
                recorded_hours,
            )
            runs.append(fact)
            by_key[(source_id, run_id)] = fact
            if job is not None:
                job.run_ids.append(run_id)
                if len(job.run_ids) == 1:  # a job takes the attribution of its first run
                    job.team, job.team_source = team, team_source
                    job.method, job.base_model = fact.method, fact.base_model
        jobs.attributed()
        return cls(config, runs, jobs, pool, by_key)

    def spend(self, window: Window) -> Spend:
        """What was paid for in the window: every GPU job once (by its start), plus runs
        that ran outside Slurm (by their start). Unknown costs stay None."""
        paid = (
            self.jobs.started(window)
            .filter((pl.col("gpus") > 0) & pl.col("elapsed_s").is_not_null())
            .select(
                has_run=pl.col("runs") > 0,
                team=pl.col("team"),
                method=pl.when(pl.col("runs") > 0).then(pl.col("method")).otherwise(pl.lit("none")),
                first_run_id=pl.col("first_run_id"),
                # as ``Cost.gpu_hours``, then ``Cost.usd``
                gpu_hours=pl.col("gpus").cast(pl.Float64) * pl.col("hours"),
                price=pl.col("price"),
                fallback_price=pl.col("price_key").str.starts_with("default"),
            )
            .with_columns(usd=pl.col("gpu_hours") * pl.col("price"))
            .collect()
        )
        spend = Spend(
            **{name: paid.get_column(name).to_list() for name in Spend.JOB_COLUMNS},
            run=[None if r is None else self.run_by_id(r) for r in paid["first_run_id"]],
            run_hours=[None] * paid.height,
        )
        for run in self.runs:
            if run.job_id is not None or not window.contains(run.start_time):
                continue
            spend.add(run)
        return spend


@dataclass(slots=True)
class Spend:
    """What was paid for in a window, as columns: one item per GPU job (by start), then one
    per run outside Slurm (by start); ``run`` is the run that attributes the item (a job's
    first run), ``run_hours`` a run's own hours (None for a job)."""

    JOB_COLUMNS: ClassVar = ("has_run", "team", "method", "gpu_hours", "usd", "fallback_price")
    has_run: list[bool]
    team: list[str | None]
    method: list[str | None]
    gpu_hours: list[float | None]
    usd: list[float | None]
    fallback_price: list[bool]
    run: list[RunFacts | None]
    run_hours: list[float | None]

    def add(self, run: RunFacts) -> None:
        self.has_run.append(True)
        self.team.append(run.team)
        self.method.append(run.method)
        self.gpu_hours.append(run.cost.gpu_hours)
        self.usd.append(run.cost.usd)
        self.fallback_price.append(run.cost.fallback_price)
        self.run.append(run)
        self.run_hours.append(run.run_hours)

    def __len__(self) -> int:
        return len(self.has_run)


def _run_cost(
    job: JobFacts | None,
    counts: str | None,
    count_keys: list[str],
    list_keys: list[str],
    default_gpus: float,
    wall: float | None,
    active_gpus: int,
    gpu_type: str | None,
    price: float,
    price_key: str,
) -> Cost:
    """The first known rung of the cost ladder (module docstring); ``wall`` is the run's
    own start to last-seen hours. ``counts`` is the run's values of the GPU-count and
    GPU-list keys, JSON [key, value] pairs: parsed only here, as most runs at scale have a
    Slurm job (0.18 s at 100,000 runs as dicts)."""
    if job is not None and job.gpus and job.elapsed_s is not None:
        return Cost(
            "slurm",
            float(job.gpus),
            gpu_type,
            job.elapsed_s / HOUR,
            price,
            price_key,
            f"Slurm job {job.job_id}",
        )
    found = dict(json.loads(counts)) if counts else {}
    listed = _device_list(found, list_keys)
    if listed is not None:
        key, devices = listed
        return Cost(
            "devices",
            float(len(devices)),
            gpu_type,
            wall,
            price,
            price_key,
            f"{key}={','.join(devices)}",
            devices,
        )
    counted = _gpu_count(found, count_keys)
    if counted is not None:
        key, gpus = counted
        if key == WORLD_SIZE_TAG:
            return Cost(
                "world_size", gpus, gpu_type, wall, price, price_key, "the world size it reported"
            )
        return Cost("params", gpus, gpu_type, wall, price, price_key, f"param {key}")
    if active_gpus:
        return Cost(
            "activity",
            float(active_gpus),
            gpu_type,
            wall,
            price,
            price_key,
            "the GPUs active in its system metrics",
        )
    if default_gpus:
        return Cost(
            "default",
            float(default_gpus),
            gpu_type,
            wall,
            price,
            price_key,
            "[cost] default_gpus_per_run",
        )
    return Cost("unknown", None, gpu_type, wall, price, price_key, "")


def _recorded_hours(text: str | None) -> float | None:
    try:
        seconds = float(text) if text else None
    except ValueError:
        return None
    return seconds / HOUR if seconds is not None and 0 < seconds < 1e9 else None


def _device_list(found: dict[str, str], keys: list[str]) -> tuple[str, tuple[str, ...]] | None:
    """The first configured key holding a GPU list (``0,1,2,3``, ``GPU-uuid,...``)."""
    for key in keys:
        value = found.get(key)
        if not value:
            continue
        devices = tuple(part.strip() for part in str(value).split(",") if part.strip())
        if devices and len(devices) <= MAX_GPUS and all(_GPU_ID.fullmatch(d) for d in devices):
            return key, devices
    return None


def _gpu_count(found: dict[str, str], keys: list[str]) -> tuple[str, float] | None:
    """The first configured key (or ``a*b`` product) whose values are positive counts."""
    for key in keys:
        parts = key.split("*")
        numbers = [_positive_count(found.get(part)) for part in parts]
        if all(n is not None for n in numbers):
            return key, float(math.prod(numbers))
    return None


def _positive_count(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        number = float(str(text).strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number <= 0 or number != int(number) or number > MAX_GPUS:
        return None
    return number


def _first_set(keys: list[str], column: dict[str, str]) -> str:
    """SQL: the value of the first of ``keys`` that is set (not NULL, not empty)."""
    if not keys:
        return "NULL"
    values = ", ".join(f"nullif(a.{column[key]}, '')" for key in keys)
    return f"coalesce({values}, NULL)"


class _TextPool:
    """One string object per distinct text. DuckDB hands out a new ``str`` for every value,
    so 100,000 runs held 100,000 copies of their source id, status, team and experiment
    (56 bytes and more each). Shared, their facts took 82 MB instead of 139 MB."""

    def __init__(self):
        self._known: dict = {}
        # ``same(text, text)``: the shared copy of ``text`` (a bound method: one call per
        # value, 1.4 M values per scan at 100,000 runs and jobs)
        self.same = self._known.setdefault

    def __call__(self, text):
        return self._known.setdefault(text, text)


def shared_facts(con, config: Config, shared: dict | None) -> Facts:
    """The facts of ``shared`` (the per-scan cache rules use), loading them once."""
    if shared is None:
        return Facts.load(con, config)
    if ("facts",) not in shared:
        with long_lived():
            shared[("facts",)] = Facts.load(con, config)
    return shared[("facts",)]
