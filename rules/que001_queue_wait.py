from __future__ import annotations

from audit.queue import RunningJobs, by_team_and_partition, sweeps_holding, waits
from audit.rule_api import Rule, RuleContext, Severity, Threshold, needing


class QueueWait(Rule):
    """A team's GPU jobs waited long in the queue (a management cost, not GPU waste).

    What it detects:
    Per team, the GPU jobs that started in the window and how long each waited: start −
    sacct `Eligible` (else − `Submit` when the export has no Eligible, which then includes
    dependencies and holds). An info finding per team whose GPUs × wait reaches
    `team_gpu_hours_waited`, or that had a job wait at least `long_wait_hours` while
    another team ran `sweep_jobs` or more jobs in the same partition (a sweep holding it).
    The figures are per partition in the evidence. No GPU-hours are claimed as waste:
    waiting costs people's time and delays results, it does not burn GPUs.

    Why it is waste:
    A day in the queue is a day of a team's work that does not happen, and it is caused
    by how the cluster is shared: a sweep that takes a partition for a day, limits that
    fit nobody. The cost is real but it is management cost, shown apart from waste.

    Known false positives:
    Jobs held on purpose (`--begin`, dependencies) when the export has no `Eligible`
    column: add `Eligible` to the sacct fields.

    Example:
    team `agents`: 12 jobs waited 31.5 h in partition `gpu` (252 GPU-h waited); job 4711
    waited 26 h while team `coder` ran 40 jobs (320 GPUs) there.

    How to fix:
    Cap concurrent jobs per team in a partition (QOS `MaxJobsPerAccount`), run sweeps as
    throttled job arrays (`--array=0-99%8`), and review fair-share weights.

    References:
    Slurm sacct `Submit`, `Eligible`, `Start` fields; the monitoring and governance advice for post-training teams
    (management cost: queueing for a day).
    """

    code = "QUE001"
    name = "queue-wait"
    severity = Severity.INFO
    family_label = "queue wait (management cost)"
    reads_shared = frozenset({"facts"})
    needs = needing("jobs")
    thresholds = {
        "team_gpu_hours_waited": Threshold(
            100.0,
            "a team's GPUs × wait in the window that makes a finding (an 8-GPU job waiting half a day)",
            0,
            unit="GPU-h",
        ),
        "long_wait_hours": Threshold(
            24.0,
            "a job waiting this long behind a sweep",
            0,
            unit="h",
        ),
        "sweep_jobs": Threshold(
            10, "another team's jobs running in the partition that make a sweep", 1
        ),
    }
    recommendation = (
        "Throttle sweeps (job arrays with %N, per-account job limits) and review fair-share."
    )

    def check(self, ctx: RuleContext):
        found = waits(ctx.facts, ctx.window)
        if not len(found):
            return
        running = RunningJobs(ctx.facts)
        rows = by_team_and_partition(found)
        threshold = ctx.thresholds["team_gpu_hours_waited"]
        long_waits = found.longest(ctx.thresholds["long_wait_hours"])
        for team, jobs, hours, waited, from_submit, first_start in found.by_team():
            blocked = []
            for wait in map(found.wait, long_waits.get(team, [])):
                sweeps = sweeps_holding(wait, running, int(ctx.thresholds["sweep_jobs"]))
                if sweeps:
                    blocked.append(
                        {
                            "job_id": wait.job.job_id,
                            "partition": wait.partition,
                            "wait_hours": round(wait.hours, 2),
                            "held_by": sweeps,
                        }
                    )
            if waited < threshold and not blocked:
                continue
            measured = (
                f"wait measured from Submit for {from_submit} of {jobs} jobs (no Eligible "
                "time recorded: the wait includes dependencies and holds)"
                if from_submit
                else "wait measured from Eligible"
            )
            partitions = [r for r in rows if r["team"] == team]
            message = (
                f"team {team!r}: {jobs} GPU jobs waited {hours:.1f} h in the queue "
                f"({waited:.1f} GPU-h waited, threshold {threshold:g})"
            )
            if blocked:
                first = blocked[0]
                sweep = first["held_by"][0]
                message += (
                    f"; job {first['job_id']} waited {first['wait_hours']:.1f} h while team "
                    f"{sweep['team']!r} ran {sweep['jobs']} jobs ({sweep['gpus']} GPUs) in "
                    f"partition {first['partition']!r}"
                )
            yield self.finding(
                subject={"team": team},
                message=message,
                evidence={
                    "by_partition": partitions,
                    "blocked_behind_sweeps": blocked,
                    "measured_from": measured,
                    "gpu_hours_waited": round(waited, 3),
                    "formula": (
                        f"Σ GPUs × (start − eligible) over {jobs} jobs = {waited:.2f} GPU-h "
                        "waited; management cost, not added to waste"
                    ),
                },
                risk_gpu_hours=waited,
                team=team,
                happened_at=first_start,
            )
