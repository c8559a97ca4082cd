from __future__ import annotations

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
        for job in ctx.facts.jobs_in(ctx.window):
            if (
                job.gpus <= 0
                or job.state != "COMPLETED"
                or not job.timelimit_s
                or not job.elapsed_s
                or job.elapsed_s < t["min_job_minutes"] * 60
            ):
                continue
            ratio = job.timelimit_s / job.elapsed_s
            if ratio < t["ratio"]:
                continue
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
