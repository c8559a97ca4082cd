from __future__ import annotations

import polars as pl

from audit.rule_api import Rule, RuleContext, Severity, Threshold, needing

from ._usage import SHORT_JOB
from .families import OverProvisioning


class TimeLimitOverrequest(OverProvisioning, Rule):
    """A completed job asked for a time limit many times longer than it ran.

    What it detects:
    COMPLETED GPU jobs at least `min_job_minutes` long whose time limit was at least
    `ratio` times their elapsed time.

    Why it is waste:
    The scheduler plans around the limit: an inflated limit keeps the job out of backfill
    windows and delays everyone's queue, so reserved GPUs idle while jobs wait. No
    GPU-hours are claimed (the cost is queue time), hence severity low.

    Known false positives:
    Jobs whose run time varies a lot between runs (early stopping), and sites that
    charge nothing for limits.

    Example:
    `rl-llama-grpo` requested 72 h and completed in 7 h (10×).

    How to fix:
    Set `--time` to the expected run time plus a margin (e.g. 1.5× the longest recent run).

    References:
    Princeton Research Computing, Job Defense Shield: "excessive run time limits" alert;
    Slurm backfill scheduling documentation.
    """

    code = "OVP004"
    name = "time-limit-overrequest"
    severity = Severity.LOW
    reads_shared = frozenset({"facts"})
    needs = needing("jobs")
    thresholds = {
        "ratio": Threshold(4.0, "flag when limit ≥ ratio × elapsed", 1, unit="×"),
        "min_job_minutes": SHORT_JOB,
    }
    recommendation = (
        "Request a time limit near the expected run time (about 1.5× the longest recent run)."
    )

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        # the jobs' facts are made for those flagged only (a few % of a million jobs)
        limit, elapsed = pl.col("timelimit_s"), pl.col("elapsed_s")
        flagged = (
            ctx.facts.jobs.started(ctx.window)
            .filter(
                (pl.col("gpus") > 0)
                & (pl.col("state") == "COMPLETED")
                & (limit > 0)
                & (elapsed > 0)
                & (elapsed >= t["min_job_minutes"] * 60)
            )
            .filter(limit / elapsed >= t["ratio"])
            .select("position")
            .collect()
        )
        for job in ctx.facts.jobs.take(flagged["position"]):
            ratio = job.timelimit_s / job.elapsed_s
            yield self.finding(
                subject=job.subject(),
                message=(
                    f"job {job.job_id} asked for {job.timelimit_s / 3600:.0f} h and ran "
                    f"{job.elapsed_s / 3600:.1f} h ({ratio:.1f}× the elapsed time, threshold {t['ratio']:g}×)"
                ),
                evidence={
                    "timelimit_s": job.timelimit_s,
                    "elapsed_s": job.elapsed_s,
                    "formula": f"{job.timelimit_s} s / {job.elapsed_s} s = {ratio:.2f}×; no GPU-hours claimed",
                },
                team=job.team,
                method=job.method,
                happened_at=job.start_time,
            )
