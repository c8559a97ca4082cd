from __future__ import annotations

from audit.engine import Rule, RuleContext, Severity, Threshold

from ._common import job_subject, judged_jobs, team_of_job


class IdleAllocation(Rule):
    """A GPU allocation stayed at ~0 % for its whole life (an abandoned interactive job).

    What it detects:
    GPU jobs at least `min_job_minutes` long whose GPUs all stayed at or below
    `max_util_pct` mean utilisation from start to end.

    Why it is waste:
    Every allocated GPU-hour was paid for and kept from others, for nothing.
    Waste = GPUs × job hours.

    Known false positives:
    CPU-only phases of a GPU job (data preparation) long enough to fill the whole job,
    and jobs whose GPUs are used by a container invisible to the telemetry.

    Example:
    Interactive job 4700199 (`jupyter`) held 2 H100s for 6 h at 0 %: 12 GPU-h.

    How to fix:
    Give interactive sessions short time limits, and cancel sessions when done;
    consider an idle-job reaper.

    References:
    Princeton Research Computing, Job Defense Shield: "zero utilization" and
    "abandoned interactive session" alerts.
    """

    code = "IDL002"
    name = "idle-allocation"
    severity = Severity.HIGH
    needs = {"jobs": "no Slurm jobs imported", "gpu_samples": "no GPU telemetry imported"}
    thresholds = {
        "max_util_pct": Threshold(1.0, "all GPUs at or below this mean utilisation", 0, 100, "%"),
        "min_job_minutes": Threshold(
            30.0, "shorter jobs are not judged (JDS uses 30 min)", 0, unit="min"
        ),
    }
    recommendation = "Cancel idle sessions; give interactive partitions short time limits."

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        for job, use in judged_jobs(ctx, t["min_job_minutes"] / 60):
            if any(g["util"] > t["max_util_pct"] for g in use.per_gpu):
                continue
            price, key = ctx.gpu_price(job["gpu_type"] or use.model)
            gpu_hours = job["gpus"] * job["hours"]
            yield self.finding(
                ctx,
                subject=job_subject(job),
                message=(
                    f"job {job['job_id']} ({job['name']}) held {job['gpus']} GPUs for {job['hours']:.1f} h at "
                    f"{use.mean_util:.1f} % mean utilisation (threshold ≤ {t['max_util_pct']:g} %)"
                ),
                evidence={
                    "per_gpu": [
                        {"host": g["host"], "gpu": g["gpu"], "mean_util_pct": round(g["util"], 2)}
                        for g in use.per_gpu
                    ],
                    "user": job["user_name"],
                    "samples": use.samples,
                    "formula": f"{job['gpus']} GPUs × {job['hours']:.2f} h = {gpu_hours:.2f} GPU-h × ${price:.2f}/GPU-h ({key}) = ${gpu_hours * price:,.2f}",
                },
                gpu_hours=gpu_hours,
                usd=gpu_hours * price,
                team=team_of_job(job),
                happened_at=job["start_time"],
            )
