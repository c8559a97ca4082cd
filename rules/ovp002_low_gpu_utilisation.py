from __future__ import annotations

from audit.engine import Rule, RuleContext, Severity, Threshold

from ._common import job_subject, judged_jobs, team_of_job


class LowGpuUtilisation(Rule):
    """Every allocated GPU worked, but far below capacity for a long job.

    What it detects:
    GPU jobs at least `min_job_minutes` long whose GPUs were all in use (none idle: that
    case is OVP001) but whose mean utilisation over the job stayed at or below
    `max_mean_util_pct`.

    Why it is waste:
    The allocation was paid in full while most of its compute sat unused, typically
    behind a data-loading or CPU bottleneck. Waste = GPU-hours × the unused share
    (1 − mean utilisation).

    Known false positives:
    Memory-bound workloads (long-context inference, large-batch evaluation) and jobs
    dominated by checkpoint I/O. Jobs sharing a host with other jobs are skipped.

    Example:
    A 4-GPU SFT job ran 10 h at 18 % mean utilisation: 40 GPU-h × 82 % = 32.8 GPU-h.

    How to fix:
    Profile the input pipeline (more dataloader workers, pre-tokenised data, pinned
    memory), raise the batch size, or use fewer GPUs.

    References:
    Princeton Research Computing, Job Defense Shield: "low GPU utilization" alert
    (25 % mean, jobs over 30 minutes); jobstats.
    """

    code = "OVP002"
    name = "low-gpu-utilisation"
    severity = Severity.MEDIUM
    needs = {"jobs": "no Slurm jobs imported", "gpu_samples": "no GPU telemetry imported"}
    thresholds = {
        "max_mean_util_pct": Threshold(
            25.0, "flag jobs at or below this mean utilisation", 0, 100, "%"
        ),
        "idle_util_pct": Threshold(
            5.0, "a GPU at or below this is idle (OVP001's business)", 0, 100, "%"
        ),
        "min_job_minutes": Threshold(60.0, "shorter jobs are not judged", 0, unit="min"),
    }
    recommendation = "Find the bottleneck (input pipeline, batch size) or request fewer GPUs."

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        for job, use in judged_jobs(ctx, t["min_job_minutes"] / 60):
            if (
                len(use.busy(t["idle_util_pct"])) < len(use.per_gpu)
                or use.mean_util > t["max_mean_util_pct"]
            ):
                continue
            price, key = ctx.gpu_price(job["gpu_type"] or use.model)
            allocated = job["gpus"] * job["hours"]
            unused = 1 - use.mean_util / 100
            gpu_hours = allocated * unused
            yield self.finding(
                ctx,
                subject=job_subject(job),
                message=(
                    f"job {job['job_id']} averaged {use.mean_util:.1f} % GPU utilisation over {job['hours']:.1f} h "
                    f"on {job['gpus']} GPUs (threshold {t['max_mean_util_pct']:g} %)"
                ),
                evidence={
                    "per_gpu": [
                        {"host": g["host"], "gpu": g["gpu"], "mean_util_pct": round(g["util"], 1)}
                        for g in use.per_gpu
                    ],
                    "formula": (
                        f"{job['gpus']} GPUs × {job['hours']:.2f} h × (1 − {use.mean_util:.1f} %) = {gpu_hours:.2f} GPU-h "
                        f"× ${price:.2f}/GPU-h ({key}) = ${gpu_hours * price:,.2f}"
                    ),
                },
                gpu_hours=gpu_hours,
                usd=gpu_hours * price,
                team=team_of_job(job),
                happened_at=job["start_time"],
            )
