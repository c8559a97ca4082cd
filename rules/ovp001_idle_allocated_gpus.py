from __future__ import annotations

from audit.engine import Rule, RuleContext, Severity, Threshold

from ._common import job_subject, judged_jobs, team_of_job


class IdleAllocatedGpus(Rule):
    """A job held more GPUs than it used: some allocated GPUs stayed idle all along.

    What it detects:
    GPU jobs (at least `min_job_minutes` long) where at least one allocated GPU worked
    (mean utilisation above `busy_util_pct`) and others did not, judged from GPU telemetry
    (nvidia-smi, DCGM or MLflow system metrics) attached to the job.

    Why it is waste:
    The idle GPUs were paid for and blocked other jobs. Waste = idle GPUs × job hours.

    Known false positives:
    Jobs that need the memory of several GPUs but compute on one, or whose work is
    bursty below the sampling interval. Jobs sharing a host with other jobs are skipped
    (telemetry cannot be told apart without GPU indices).

    Example:
    `opd-llama-from-qwen72b` allocated 8 H100s for 5 h; GPU 0 averaged 93 % and GPUs 1-7
    stayed at 0 %: 7 × 5.0 h = 35 GPU-h idle.

    How to fix:
    Request the GPUs the code uses (`--gres=gpu:1`), or make the script use all of them
    (torchrun --nproc_per_node, device_map, data parallelism).

    References:
    Princeton Research Computing, Job Defense Shield: "zero utilization GPUs" alert;
    jobstats per-GPU utilisation.
    """

    code = "OVP001"
    name = "idle-allocated-gpus"
    severity = Severity.HIGH
    needs = {"jobs": "no Slurm jobs imported", "gpu_samples": "no GPU telemetry imported"}
    thresholds = {
        "busy_util_pct": Threshold(
            5.0, "a GPU whose mean utilisation is above this is in use", 0, 100, "%"
        ),
        "min_job_minutes": Threshold(
            30.0, "shorter jobs are not judged (JDS uses 30 min)", 0, unit="min"
        ),
    }
    recommendation = (
        "Request only the GPUs the job uses, or make the training script use all of them."
    )

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        for job, use in judged_jobs(ctx, t["min_job_minutes"] / 60):
            busy = use.busy(t["busy_util_pct"])
            idle = [g for g in use.per_gpu if g not in busy]
            if not busy or not idle:
                continue  # all idle is IDL002's abandoned allocation; all busy is fine
            price, key = ctx.gpu_price(job["gpu_type"] or use.model)
            hours = job["hours"]
            gpu_hours = len(idle) * hours
            yield self.finding(
                ctx,
                subject=job_subject(job),
                message=(
                    f"job {job['job_id']} used {len(busy)} of {job['gpus']} allocated GPUs for {hours:.1f} h: {len(idle)} GPUs "
                    f"averaged {max(g['util'] for g in idle):.1f} % or less (idle threshold {t['busy_util_pct']:g} %)"
                ),
                evidence={
                    "per_gpu": [
                        {"host": g["host"], "gpu": g["gpu"], "mean_util_pct": round(g["util"], 1)}
                        for g in use.per_gpu
                    ],
                    "samples": use.samples,
                    "formula": f"{len(idle)} idle GPUs × {hours:.2f} h = {gpu_hours:.2f} GPU-h × ${price:.2f}/GPU-h ({key}) = ${gpu_hours * price:,.2f}",
                },
                gpu_hours=gpu_hours,
                usd=gpu_hours * price,
                team=team_of_job(job),
                happened_at=job["start_time"],
            )
