"""Queue wait: how long GPU jobs waited to start, and what held their partition meanwhile.

A job's wait is ``start - eligible`` (sacct ``Eligible``: submitted, dependencies met, not
held), else ``start - submit`` when the export has no ``Eligible`` (the wait then includes
any dependency or hold). Its *GPU-hours waited* are its GPUs × its wait: the capacity the
team asked for and could not use yet. Waiting is a management cost, not GPU waste: it is
reported apart and never added to waste. QUE001 and the weekly report's queue section
both read it from here.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property

from audit.costs import Facts, JobFacts
from audit.windows import Window


@dataclass(slots=True)  # a million of them at a million jobs: no frozen __setattr__s
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


def waits(facts: Facts, window: Window) -> list[Wait]:
    """GPU jobs that started in the window, with their wait (0 when started at once)."""
    out = []
    for job in facts.jobs_in(window):
        if job.gpus <= 0 or job.start_time is None:
            continue
        eligible = job.eligible_time
        since, source = (eligible, "Eligible") if eligible else (job.submit_time, "Submit")
        if since is None:
            continue
        hours = max((job.start_time - since).total_seconds(), 0.0) / 3600
        out.append(Wait(job, since, source, hours))
    return out


class RunningJobs:
    """The GPU jobs of each partition by start, to find what ran during many waits.

    Scanning every job for every long wait is O(waits x jobs): 11 % of a scan at a million
    jobs. A job ran during a wait when it started before the waiting job did and ended
    after the wait began; a finished job that ended after ``since`` started after
    ``since`` minus the partition's longest job, so only the jobs started in that stretch
    are looked at (found by bisection), with the partition's unfinished jobs.
    """

    def __init__(self, facts: Facts):
        self._facts = facts

    @cached_property
    def _index(self) -> dict[str, tuple[list, list[datetime], timedelta, list]]:
        """Per partition: finished jobs as (position in ``Facts.jobs``, job), their starts,
        the longest of them, and the unfinished jobs. Built at the first wait asked about."""
        closed: dict[str, list[tuple[int, JobFacts]]] = defaultdict(list)
        unfinished: dict[str, list[tuple[int, JobFacts]]] = defaultdict(list)
        longest: dict[str, timedelta] = defaultdict(timedelta)
        for position, job in enumerate(self._facts.jobs):  # ordered by start (Facts)
            if job.gpus <= 0 or job.start_time is None:
                continue
            partition = job.partition or "unknown"
            if job.end_time is None:
                unfinished[partition].append((position, job))
                continue
            closed[partition].append((position, job))
            longest[partition] = max(longest[partition], job.end_time - job.start_time)
        return {
            partition: (
                closed[partition],
                [job.start_time for _, job in closed[partition]],
                longest[partition],
                unfinished[partition],
            )
            for partition in closed.keys() | unfinished.keys()
        }

    def holders(self, wait: Wait) -> dict[str, list[JobFacts]]:
        """Other teams' GPU jobs running in the waiting job's partition while it waited,
        each team's in the order of ``Facts.jobs``."""
        closed, starts, longest, unfinished = self._index.get(
            wait.partition, ([], [], timedelta(0), [])
        )
        try:
            lo = bisect_right(starts, wait.since - longest)
        except OverflowError:  # a wait from year 1, or a job of millennia: look at all
            lo = 0
        hi = bisect_left(starts, wait.job.start_time)
        candidates = closed[lo:hi] + [
            (position, job) for position, job in unfinished if job.start_time < wait.job.start_time
        ]
        out: dict[str, list[JobFacts]] = defaultdict(list)
        for _, job in sorted(candidates, key=lambda item: item[0]):
            # the waiting job itself started at its own start, so it is not a candidate
            if (job.team or "unknown") == wait.team or (
                job.end_time is not None and job.end_time <= wait.since
            ):
                continue
            out[job.team or "unknown"].append(job)
        return dict(out)


def by_team_and_partition(found: list[Wait]) -> list[dict]:
    """Jobs, wait hours and GPU-hours waited per (team, partition), most waited first."""
    groups: dict[tuple[str, str], list[Wait]] = defaultdict(list)
    for wait in found:
        groups[(wait.team, wait.partition)].append(wait)
    rows = []
    for (team, partition), items in groups.items():
        longest = max(items, key=lambda w: w.hours)
        rows.append(
            {
                "team": team,
                "partition": partition,
                "jobs": len(items),
                "wait_hours": round(sum(w.hours for w in items), 3),
                "mean_wait_hours": round(sum(w.hours for w in items) / len(items), 3),
                "longest_wait_hours": round(longest.hours, 3),
                "longest_job": longest.job.job_id,
                "gpu_hours_waited": round(sum(w.gpu_hours for w in items), 3),
                "measured_from_submit": sum(1 for w in items if w.measured_from == "Submit"),
            }
        )
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
