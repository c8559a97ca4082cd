"""Every GPU job as columns, with a job's facts made only when a rule asks for that job.

A Python object per job (``JobFacts`` and its ``Cost``) was half of a scan at a million
jobs: 14 CPU-s and 1.3 GB to build, then again in every rule that walked them. The
``JobTable`` keeps the jobs as one polars frame in the facts' order (start, unknown starts
last, then cluster and id) with their cost and attribution as columns. What is judged of
every job (spend, queue waits, time limits, which jobs have usage evidence) is read from
the columns; ``JobFacts`` are made for the jobs a finding, a note or a run names, and kept,
so a job asked for twice is one object.

Cost and attribution are decided as for runs (``audit.costs``): a job's GPUs × elapsed
time at its card's price; its card is its allocation's type, said more precisely by its
hosts' reported model (``named_card``); its team is the first known of ``[attribution]
team_order`` (account, user), or its first run's (``Facts.load`` sets those).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from audit.facts.cost_basis import HOUR, Cost, hours_between, named_card, team_of
from audit.facts.prices import Prices
from audit.windows import Window

# The jobs columns that rules read beyond JobFacts' own fields: the queue wait's start
# (QUE001) and sacct's and jobstats' usage figures (audit.usage).
JOB_EXTRA_COLUMNS = ("eligible_time", "max_gpu_util_pct", "max_gpu_mem_bytes", "admin_comment")


@dataclass(slots=True)
class JobFacts:
    cluster: str
    job_id: str
    name: str | None
    user_name: str | None
    account: str | None
    partition: str | None
    state: str | None
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    elapsed_s: int | None
    timelimit_s: int | None
    gpus: int
    gpu_type: str | None  # allocation type, else the card model its hosts reported
    hosts: list[str]
    run_ids: list[str]  # runs linked to the job, earliest first
    team: str | None
    team_source: str | None
    method: str | None
    base_model: str | None
    cost: Cost
    # JOB_EXTRA_COLUMNS of the job's jobs row, as read by the queue and usage rules
    eligible_time: datetime | None = None
    max_gpu_util_pct: float | None = None
    max_gpu_mem_bytes: int | None = None
    admin_comment: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.cluster, self.job_id)

    @property
    def hours(self) -> float | None:
        if self.elapsed_s is not None:
            return self.elapsed_s / HOUR
        return hours_between(self.start_time, self.end_time)

    def subject(self) -> dict:
        subject = {"cluster": self.cluster, "job_id": self.job_id}
        if self.run_ids:
            subject["run_id"] = self.run_ids[0]
        return subject


# The frame's columns: JobFacts' fields in their order (``run_ids`` and ``cost`` apart),
# then what the cost is made of, what a run linked to the job needs to price itself, and
# the job's runs. ``position`` is the job's place in the facts' order.
FIELDS = (
    "cluster", "job_id", "name", "user_name", "account", "partition", "state",
    "submit_time", "start_time", "end_time", "elapsed_s", "timelimit_s", "gpus",
    "gpu_type", "hosts", "team", "team_source", "method", "base_model", *JOB_EXTRA_COLUMNS,
)  # fmt: skip
COLUMNS = (
    "position", *FIELDS, "hours", "price", "price_key", "allocated_type", "host_model",
    "runs", "first_run_id",
)  # fmt: skip
_HOURS, _PRICE, _PRICE_KEY = (COLUMNS.index(c) for c in ("hours", "price", "price_key"))
SCHEMA = {
    "position": pl.Int64, "cluster": pl.String, "job_id": pl.String, "name": pl.String,
    "user_name": pl.String, "account": pl.String, "partition": pl.String,
    "state": pl.String, "submit_time": pl.Datetime("us"), "start_time": pl.Datetime("us"),
    "end_time": pl.Datetime("us"), "elapsed_s": pl.Int64, "timelimit_s": pl.Int64,
    "gpus": pl.Int64, "gpu_type": pl.String, "hosts": pl.List(pl.String),
    "team": pl.String, "team_source": pl.String, "method": pl.String,
    "base_model": pl.String, "eligible_time": pl.Datetime("us"),
    "max_gpu_util_pct": pl.Float64, "max_gpu_mem_bytes": pl.Int64,
    "admin_comment": pl.String, "hours": pl.Float64, "price": pl.Float64,
    "price_key": pl.String, "allocated_type": pl.String, "host_model": pl.String,
    "runs": pl.Int64, "first_run_id": pl.String,
}  # fmt: skip


class JobTable(Sequence):
    """The jobs in the facts' order: a frame of columns, and ``JobFacts`` made on demand.

    ``table[i]`` and ``take`` make (and keep) the facts of the jobs asked for; iterating
    makes every job's, which a scan never does (tests and small histories may)."""

    def __init__(self, frame: pl.DataFrame):
        self.frame = frame
        self._made: dict[int, JobFacts] = {}
        # a job's runs price themselves by it: made when the facts are loaded
        self._by_key: dict[tuple[str, str], int] = {}

    @classmethod
    def of(cls, jobs: list[JobFacts]) -> JobTable:
        """A table of jobs already made (a test's, in the facts' order)."""
        rows = [
            {
                "position": position,
                **{name: getattr(job, name) for name in FIELDS},
                "hours": job.cost.hours,
                "price": job.cost.price,
                "price_key": job.cost.price_key,
                "allocated_type": job.gpu_type,
                "host_model": None,
                "runs": len(job.run_ids),
                "first_run_id": job.run_ids[0] if job.run_ids else None,
            }
            for position, job in enumerate(jobs)
        ]
        table = cls(pl.DataFrame(rows, schema=SCHEMA, orient="row"))
        table._made = dict(enumerate(jobs))
        table._by_key = {job.key: position for position, job in enumerate(jobs)}
        return table

    def __len__(self) -> int:
        return self.frame.height

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.take(range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.take([index])[0]

    def __iter__(self) -> Iterator[JobFacts]:
        batch = 50_000
        for start in range(0, len(self), batch):
            yield from self.take(range(start, min(start + batch, len(self))))

    def take(self, positions: Iterable[int]) -> list[JobFacts]:
        """The facts of the jobs at ``positions``, made once each."""
        positions = list(positions)
        missing = [p for p in positions if p not in self._made]
        if missing:
            for row in self.frame[missing].iter_rows():
                self._made[row[0]] = _job_facts(row)
        return [self._made[p] for p in positions]

    def position(self, cluster: str, job_id: str) -> int | None:
        """The job's place in the table, if it is one of them."""
        if (cluster, job_id) in self._by_key:
            return self._by_key[cluster, job_id]
        found = self._positions((pl.col("cluster") == cluster) & (pl.col("job_id") == job_id))
        return found[0] if found else None

    def with_job_id(self, job_id: str) -> list[JobFacts]:
        """The jobs of every cluster with this id, in the facts' order."""
        return self.take(self._positions(pl.col("job_id") == job_id))

    def _positions(self, condition: pl.Expr) -> list[int]:
        return (
            self.frame.lazy().filter(condition).select("position").collect()["position"].to_list()
        )

    def started(self, window: Window) -> pl.LazyFrame:
        """The jobs ``window.contains`` by start, lazily: select the columns you read, and
        filter, before ``collect``, so that only those are copied (the whole frame is
        180 MB at a million jobs)."""
        frame = self.frame.lazy()
        if window.since is None and window.until is None:
            return frame  # the unbounded window holds unknown starts too (Window.contains)
        return frame.filter(window.holds("start_time"))

    def linked(
        self, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[JobFacts, str | None, str | None]]:
        """The jobs runs link to, each with its allocation's card type and its hosts' card
        model (a run is priced by them), made now: their runs give them their attribution
        (``attributed`` copies it into the columns)."""
        wanted = pl.DataFrame(
            list(set(keys)), schema={"cluster": pl.String, "job_id": pl.String}, orient="row"
        )
        found = (
            self.frame.join(wanted, on=["cluster", "job_id"], how="semi")
            .select("position", "allocated_type", "host_model")
            .rows()
        )
        jobs = self.take(position for position, _, _ in found)
        out = {}
        for (position, allocated, model), job in zip(found, jobs, strict=True):
            self._by_key[job.key] = position
            out[job.key] = (job, allocated, model)
        return out

    def attributed(self) -> None:
        """Copy the team, method, base model and runs that runs gave their jobs (through
        ``linked``) into the columns, so sums by team and method see them."""
        positions = sorted(self._by_key.values())
        if not positions:
            return
        jobs = self.take(positions)
        values = {
            "team": [j.team for j in jobs],
            "team_source": [j.team_source for j in jobs],
            "method": [j.method for j in jobs],
            "base_model": [j.base_model for j in jobs],
            "runs": [len(j.run_ids) for j in jobs],
            "first_run_id": [j.run_ids[0] if j.run_ids else None for j in jobs],
        }
        index = pl.Series(positions, dtype=pl.Int64)
        self.frame = self.frame.with_columns(
            self.frame.get_column(name)
            .clone()
            .scatter(index, pl.Series(name, column, dtype=SCHEMA[name]))
            for name, column in values.items()
        )


# the places in a frame row of JobFacts' fields before ``run_ids``, those between it and
# ``cost``, and those after
_BEFORE_RUNS = slice(COLUMNS.index("cluster"), COLUMNS.index("hosts") + 1)
_ATTRIBUTION = slice(COLUMNS.index("team"), COLUMNS.index("base_model") + 1)
_AFTER_COST = slice(COLUMNS.index(JOB_EXTRA_COLUMNS[0]), COLUMNS.index(JOB_EXTRA_COLUMNS[-1]) + 1)
_JOB_ID, _GPUS, _GPU_TYPE = (COLUMNS.index(c) for c in ("job_id", "gpus", "gpu_type"))


def _job_facts(row: tuple) -> JobFacts:
    """A job's facts from its frame row (``COLUMNS``' order)."""
    return JobFacts(
        *row[_BEFORE_RUNS],
        [],  # run_ids: a job with runs is made by ``linked`` and given them
        *row[_ATTRIBUTION],
        Cost(
            "slurm",
            float(row[_GPUS]),
            row[_GPU_TYPE],
            row[_HOURS],
            row[_PRICE],
            row[_PRICE_KEY],
            f"Slurm job {row[_JOB_ID]}",
        ),
        *row[_AFTER_COST],
    )


def load_jobs(con, order: list[str], prices: Prices) -> JobTable:
    """Every job of the warehouse with its card, price, hours and (runless) team."""
    frame = con.sql(
        f"""
        WITH host_models AS (  -- the card model each host's telemetry reported
            SELECT host, min(model) AS model FROM gpu_samples
            WHERE model IS NOT NULL GROUP BY host
        ),
        nodes AS (  -- a job's hosts, sorted, and the model of the first with telemetry
            SELECT n.cluster, n.job_id, list(n.host ORDER BY n.host) AS hosts,
                   arg_min(m.model, n.host) FILTER (WHERE m.model IS NOT NULL) AS host_model
            FROM job_nodes n LEFT JOIN host_models m ON m.host = n.host
            GROUP BY ALL
        )
        SELECT j.cluster, j.job_id, j.name, j.user_name, j.account, j.partition, j.state,
               j.submit_time, j.start_time, j.end_time, j.elapsed_s, j.timelimit_s,
               coalesce(j.gpus, 0) AS gpus, coalesce(n.hosts, []::VARCHAR[]) AS hosts,
               {", ".join(f"j.{c}" for c in JOB_EXTRA_COLUMNS)},
               j.gpu_type AS allocated_type, n.host_model
        FROM jobs j
        LEFT JOIN nodes n ON n.cluster = j.cluster AND n.job_id = j.job_id
        ORDER BY j.start_time NULLS LAST, j.cluster, j.job_id
        """
    ).pl()
    frame = frame.with_row_index("position").with_columns(
        pl.col("position").cast(pl.Int64), pl.col("gpus").cast(pl.Int64)
    )
    # the card, its price and the team of a job without runs: a few distinct names each
    frame = _decided(frame, ["allocated_type", "host_model"], {"gpu_type": pl.String}, _card_of)
    frame = _decided(
        frame,
        ["gpu_type", "cluster"],
        {"price": pl.Float64, "price_key": pl.String},
        lambda card, cluster: _priced(prices(card, cluster)),
    )
    frame = _decided(
        frame,
        ["account", "user_name"],
        {"team": pl.String, "team_source": pl.String},
        lambda account, user: team_of(order, None, account, user),  # a job has no team tag
    )
    frame = frame.with_columns(
        # as ``JobFacts.hours``: sacct's elapsed time, else end - start
        pl.when(pl.col("elapsed_s").is_not_null())
        .then(divided(pl.col("elapsed_s"), HOUR))
        .otherwise(divided(seconds_between("start_time", "end_time").clip(lower_bound=0.0), HOUR))
        .alias("hours"),
        pl.lit(None, pl.String).alias("method"),
        pl.lit(None, pl.String).alias("base_model"),
        pl.lit(0, pl.Int64).alias("runs"),
        pl.lit(None, pl.String).alias("first_run_id"),
    )
    return JobTable(frame.sort("position").select(COLUMNS).cast(SCHEMA))


def divided(column: pl.Expr, divisor: float) -> pl.Expr:
    """``column / divisor`` with each value rounded as Python's ``/`` rounds it (exactly):
    polars divides by a constant as a product with its reciprocal, one unit in the last
    place off for some values (150 of 28,571 second counts over 3,600), and a sum or a
    rounding of those then differs from the same figure in a finding's evidence."""

    def quotient(values: pl.Series) -> pl.Series:
        return pl.Series(values.name, values.to_numpy() / divisor, nan_to_null=True)

    return column.cast(pl.Float64).map_batches(quotient, return_dtype=pl.Float64)


def seconds_between(start: str, end: str) -> pl.Expr:
    """``(end - start).total_seconds()`` of two datetime columns, rounded as Python's."""
    return divided((pl.col(end) - pl.col(start)).dt.total_microseconds(), 1e6)


def _decided(
    frame: pl.DataFrame, keys: list[str], columns: dict[str, pl.DataType], decide
) -> pl.DataFrame:
    """``frame`` with ``columns``, decided by ``decide(*keys)`` (a tuple) in Python once per
    distinct value of ``keys``, and joined back: the shared functions decide, for a million
    jobs at the cost of their few distinct names."""
    distinct = frame.select(keys).unique()
    decided = [decide(*row) for row in distinct.iter_rows()]
    distinct = distinct.with_columns(
        pl.Series(name, [values[i] for values in decided], dtype=dtype)
        for i, (name, dtype) in enumerate(columns.items())
    )
    return frame.join(distinct, on=keys, how="left", nulls_equal=True)


def _card_of(allocated: str | None, host_model: str | None) -> tuple[str | None]:
    return (named_card(allocated, host_model),)


def _priced(price) -> tuple[float, str]:
    return price.usd, price.key
