"""Queue wait: how long GPU jobs waited to start, and what held their partition meanwhile.

A job's wait is ``start - eligible`` (sacct ``Eligible``: submitted, dependencies met, not
held), else ``start - submit`` when the export has no ``Eligible`` (the wait then includes
any dependency or hold). Its *GPU-hours waited* are its GPUs × its wait: the capacity the
team asked for and could not use yet. Waiting is a management cost, not GPU waste: it is
reported apart and never added to waste. QUE001 and the weekly report's queue section
both read it from here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property

import numpy as np
import polars as pl

from audit.costs import Facts
from audit.facts.jobs import JobFacts, divided, seconds_between
from audit.windows import Window

_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(slots=True)
class Wait:
    job: JobFacts
    since: datetime  # eligible time, else submit time
    measured_from: str  # Eligible | Submit
    hours: float

    @property
    def gpu_hours(self) -> float:
        return self.job.gpus * self.hours

    @property
    def team(self) -> str:
        return self.job.team or "unknown"

    @property
    def partition(self) -> str:
        return self.job.partition or "unknown"


def or_unknown(column: str) -> pl.Expr:
    """The column's text, "unknown" where it is missing or empty (``job.team or "unknown"``)."""
    text = pl.col(column)
    return (
        pl.when(text.is_null() | (text == "")).then(pl.lit("unknown")).otherwise(text).alias(column)
    )


def in_order_sum(column: str) -> pl.Expr:
    """The column's sum added in row order, as Python's ``sum`` adds: polars' ``sum``
    adds in another order, and a float sum's last digits depend on the order."""
    return pl.col(column).cum_sum().last().fill_null(0.0)


class Waits:
    """GPU jobs that started in a window, with their wait (0 when started at once), as
    columns in the order of ``Facts.jobs``; a ``Wait`` (with its job's facts) is made for
    a wait a finding or a report names (``wait``)."""

    def __init__(self, facts: Facts, window: Window):
        self._facts = facts
        since = pl.coalesce("eligible_time", "submit_time")
        self.frame = (
            facts.jobs.started(window)
            .filter((pl.col("gpus") > 0) & pl.col("start_time").is_not_null())
            .filter(since.is_not_null())
            .select(
                "position",
                "job_id",
                "gpus",
                "start_time",
                team=or_unknown("team"),
                partition=or_unknown("partition"),
                since=since,
                measured_from=pl.when(pl.col("eligible_time").is_not_null())
                .then(pl.lit("Eligible"))
                .otherwise(pl.lit("Submit")),
            )
            .with_columns(
                hours=divided(seconds_between("since", "start_time").clip(lower_bound=0.0), 3600)
            )
            .with_columns(gpu_hours=pl.col("gpus").cast(pl.Float64) * pl.col("hours"))
            .collect()
        )

    def __len__(self) -> int:
        return self.frame.height

    def wait(self, index: int) -> Wait:
        """The ``index``-th wait, with its job's facts."""
        position, since, measured_from, hours = self.frame.select(
            "position", "since", "measured_from", "hours"
        ).row(index)
        return Wait(self._facts.jobs[position], since, measured_from, hours)

    def totals(self) -> dict:
        """Jobs, GPU-hours waited and waits measured from Submit, over every wait."""
        jobs, gpu_hours, from_submit = self.frame.select(
            pl.len(), in_order_sum("gpu_hours"), (pl.col("measured_from") == "Submit").sum()
        ).row(0)
        # no wait: 0, as Python's ``sum`` of nothing
        return {"jobs": jobs, "gpu_hours": gpu_hours if jobs else 0, "from_submit": from_submit}

    def by_team(self) -> list[tuple[str, int, float, float, int, datetime]]:
        """Per team, by name: (team, jobs, hours waited, GPU-hours waited, waits measured
        from Submit, first start)."""
        return (
            self.frame.group_by("team")
            .agg(
                pl.len(),
                in_order_sum("hours"),
                in_order_sum("gpu_hours"),
                (pl.col("measured_from") == "Submit").sum(),
                pl.col("start_time").min(),
            )
            .sort("team")
            .rows()
        )

    def longest(self, at_least_hours: float) -> dict[str, list[int]]:
        """Per team, the waits of at least ``at_least_hours``, as indices, longest first
        (equal waits in order)."""
        found = (
            self.frame.select("team", "hours")
            .with_row_index("index")
            .filter(pl.col("hours") >= at_least_hours)
            .sort("hours", descending=True, maintain_order=True)
        )
        out: dict[str, list[int]] = defaultdict(list)
        for index, team, _ in found.iter_rows():
            out[team].append(index)
        return dict(out)


def waits(facts: Facts, window: Window) -> Waits:
    """GPU jobs that started in the window, with their wait (0 when started at once)."""
    return Waits(facts, window)


def _microseconds(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


@dataclass(frozen=True)
class _Partition:
    """A partition's GPU jobs by start, as arrays: the finished ones (position in
    ``Facts.jobs``, start, end, team code), the longest of them, and the unfinished ones
    (position, start, team code). Times are microseconds since 1970."""

    positions: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    teams: np.ndarray
    longest: int
    open_positions: np.ndarray
    open_starts: np.ndarray
    open_teams: np.ndarray


class RunningJobs:
    """The GPU jobs of each partition by start, to find what ran during many waits.

    Scanning every job for every long wait is O(waits x jobs): 11 % of a scan at a million
    jobs. A job ran during a wait when it started before the waiting job did and ended
    after the wait began; a finished job that ended after ``since`` started after
    ``since`` minus the partition's longest job, so only the jobs started in that stretch
    are looked at (found by bisection), with the partition's unfinished jobs. The index is
    arrays made from ``Facts.jobs``' columns; a job's facts are made only when it held a
    partition during a wait.
    """

    def __init__(self, facts: Facts):
        self._facts = facts

    @cached_property
    def _team_codes(self) -> dict[str, int]:
        teams = self._facts.jobs.frame.select(or_unknown("team").unique())
        return {team: code for code, team in enumerate(sorted(teams["team"]))}

    @cached_property
    def _index(self) -> dict[str, _Partition]:
        """Per partition, its jobs. Built at the first wait asked about."""
        frame = (
            self._facts.jobs.frame.lazy()
            .filter((pl.col("gpus") > 0) & pl.col("start_time").is_not_null())
            .select(
                "position",
                partition=or_unknown("partition"),
                team=or_unknown("team").replace_strict(self._team_codes, return_dtype=pl.Int64),
                start=pl.col("start_time").dt.epoch("us"),
                end=pl.col("end_time").dt.epoch("us"),
            )
            .collect()
        )
        out = {}
        for (partition,), jobs in frame.partition_by(
            "partition", as_dict=True, maintain_order=True
        ).items():
            closed = jobs.filter(pl.col("end").is_not_null())
            unfinished = jobs.filter(pl.col("end").is_null())
            lengths = closed["end"] - closed["start"]
            out[partition] = _Partition(
                closed["position"].to_numpy(),
                closed["start"].to_numpy(),
                closed["end"].to_numpy(),
                closed["team"].to_numpy(),
                max(int(lengths.max() or 0), 0),
                unfinished["position"].to_numpy(),
                unfinished["start"].to_numpy(),
                unfinished["team"].to_numpy(),
            )
        return out

    def holders(self, wait: Wait) -> dict[str, list[JobFacts]]:
        """Other teams' GPU jobs running in the waiting job's partition while it waited,
        each team's in the order of ``Facts.jobs``."""
        part = self._index.get(wait.partition)
        if part is None:
            return {}
        since = _microseconds(wait.since)
        started = _microseconds(wait.job.start_time)
        team = self._team_codes.get(wait.team, -1)
        lo = int(np.searchsorted(part.starts, since - part.longest, side="right"))
        hi = int(np.searchsorted(part.starts, started, side="left"))
        # the waiting job itself started at its own start, so it is not a candidate
        during = (part.teams[lo:hi] != team) & (part.ends[lo:hi] > since)
        still = (part.open_starts < started) & (part.open_teams != team)
        positions = np.sort(
            np.concatenate([part.positions[lo:hi][during], part.open_positions[still]])
        )
        out: dict[str, list[JobFacts]] = defaultdict(list)
        for job in self._facts.jobs.take(positions.tolist()):
            out[job.team or "unknown"].append(job)
        return dict(out)


def by_team_and_partition(found: Waits) -> list[dict]:
    """Jobs, wait hours and GPU-hours waited per (team, partition), most waited first."""
    groups = found.frame.group_by("team", "partition", maintain_order=True).agg(
        pl.len(),
        in_order_sum("hours"),
        pl.col("hours").max().alias("longest"),
        # the first of the longest waits, as Python's ``max``
        pl.col("job_id").get(pl.col("hours").arg_max()),
        in_order_sum("gpu_hours"),
        (pl.col("measured_from") == "Submit").sum(),
    )
    rows = [
        {
            "team": team,
            "partition": partition,
            "jobs": jobs,
            "wait_hours": round(hours, 3),
            "mean_wait_hours": round(hours / jobs, 3),
            "longest_wait_hours": round(longest, 3),
            "longest_job": longest_job,
            "gpu_hours_waited": round(gpu_hours, 3),
            "measured_from_submit": from_submit,
        }
        for team, partition, jobs, hours, longest, longest_job, gpu_hours, from_submit in (
            groups.iter_rows()
        )
    ]
    return sorted(rows, key=lambda r: (-r["gpu_hours_waited"], r["team"], r["partition"]))


def sweeps_holding(wait: Wait, running: RunningJobs, min_jobs: int) -> list[dict]:
    """Other teams that ran at least ``min_jobs`` jobs in the partition during the wait."""
    return [
        {
            "team": team,
            "jobs": len(jobs),
            "gpus": sum(j.gpus for j in jobs),
            "examples": [j.job_id for j in jobs[:5]],
        }
        for team, jobs in sorted(running.holders(wait).items())
        if len(jobs) >= min_jobs
    ]
