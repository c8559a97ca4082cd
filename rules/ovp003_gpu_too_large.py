from __future__ import annotations

from audit.engine import Rule, RuleContext, Severity, Threshold

from ._common import job_subject, judged_jobs, team_of_job


class GpuTooLarge(Rule):
    """The job used a small part of the GPU's memory at low utilisation: a smaller card would do.

    What it detects:
    GPU jobs at least `min_job_minutes` long whose peak GPU memory stayed below
    `max_memory_pct` of the card's capacity while mean utilisation stayed below
    `max_mean_util_pct`.

    Why it is waste:
    An 80 GB H100 costs several times a 24 GB card; a job that needs neither its memory
    nor its compute pays for capacity it cannot use. This is a hint (severity info): the
    saving depends on which smaller GPU the cluster offers, so no waste figure is claimed.

    Known false positives:
    Jobs that need the faster interconnect or the newer instruction set, and short
    memory peaks between samples.

    Example:
    An evaluation job peaked at 9 GB of 80 GB at 20 % utilisation for 3 h.

    How to fix:
    Submit to a partition with smaller GPUs or MIG slices.

    References:
    Princeton Research Computing, Job Defense Shield: "GPU model too powerful" alert.
    """

    code = "OVP003"
    name = "gpu-too-large"
    severity = Severity.INFO
    needs = {"jobs": "no Slurm jobs imported", "gpu_samples": "no GPU telemetry imported"}
    thresholds = {
        "max_memory_pct": Threshold(25.0, "peak memory below this share of capacity", 0, 100, "%"),
        "max_mean_util_pct": Threshold(50.0, "mean utilisation below this", 0, 100, "%"),
        "min_job_minutes": Threshold(60.0, "shorter jobs are not judged", 0, unit="min"),
    }
    recommendation = "Use a smaller GPU type or a MIG slice for this workload."

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        for job, use in judged_jobs(ctx, t["min_job_minutes"] / 60):
            capacity = max((g["mem_total"] or 0) for g in use.per_gpu)
            peak = max((g["mem"] or 0) for g in use.per_gpu)
            if (
                not capacity
                or peak / capacity * 100 >= t["max_memory_pct"]
                or use.mean_util >= t["max_mean_util_pct"]
            ):
                continue
            if not use.busy(5.0):
                continue  # idle allocations are IDL002's
            yield self.finding(
                ctx,
                subject=job_subject(job),
                message=(
                    f"job {job['job_id']} peaked at {peak / 1024:.1f} GiB of {capacity / 1024:.0f} GiB "
                    f"({peak / capacity * 100:.0f} %, threshold {t['max_memory_pct']:g} %) at {use.mean_util:.0f} % "
                    f"mean utilisation (threshold {t['max_mean_util_pct']:g} %)"
                ),
                evidence={
                    "peak_memory_mib": peak,
                    "capacity_mib": capacity,
                    "mean_util_pct": round(use.mean_util, 1),
                    "model": use.model,
                    "formula": "hint only: no waste figure is claimed",
                },
                team=team_of_job(job),
                happened_at=job["start_time"],
            )
