from __future__ import annotations

from datetime import timedelta

from audit.facts.cost_basis import hours_between
from audit.rule_api import Rule, RuleContext, Severity, Threshold, Waste, needing
from audit.usage import gpu_usage

from ._usage import IDLE_UTIL
from .families import IdleCapacity


class IdleTail(IdleCapacity, Rule):
    """A job kept its GPUs, idle, after its training run had ended.

    What it detects:
    Jobs linked to a tracked run that ended at least `min_tail_minutes` before the job,
    with the job's GPUs at or below `max_util_pct` mean utilisation in between. Needs
    time-resolved evidence (GPU telemetry or the run's system metrics): a per-job maximum
    from sacct cannot separate the tail from the training before it.

    Why it is waste:
    The allocation is paid for and blocks the queue while doing nothing (a `sleep`, a
    hung process, a notebook left open). Waste = GPUs × tail duration.

    Known false positives:
    Evaluation or export launched by the same job after training without its own MLflow
    run (then the GPUs would not be idle), and clock skew between hosts and the tracking
    server (minutes, below the default threshold).

    Example:
    `rl-qwen-grpo`'s run ended at 12:00; job 4700108 held 8 H100s at 0 % until 14:01:
    8 × 2.0 h = 16 GPU-h.

    How to fix:
    End the job when training ends (`scancel $SLURM_JOB_ID` in an exit trap; no trailing
    `sleep`), and set `--time` close to the run time.

    References:
    Princeton Research Computing, Job Defense Shield: "zero GPU utilization" alerts.
    """

    code = "IDL001"
    name = "idle-tail"
    severity = Severity.HIGH
    reads_shared = frozenset({"facts", "long tails"})
    needs = needing(
        "jobs",
        run_jobs="no run is linked to a Slurm job",
        gpu_samples="no GPU telemetry imported (sacct's per-job figures cannot show a tail)",
    )
    thresholds = {
        "min_tail_minutes": Threshold(30.0, "shorter tails are not flagged", 5, unit="min"),
        "max_util_pct": IDLE_UTIL,
    }
    recommendation = "End the job when the run ends (scancel in an exit trap, no trailing sleep)."

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        min_tail = timedelta(minutes=t["min_tail_minutes"])

        def long_tails():
            # once for a report's weeks: each week then tests only these runs' windows
            return [
                run
                for run in ctx.facts.runs
                if run.job_id is not None
                and run.end_time is not None
                and run.job_end is not None
                and run.job_end - run.end_time >= min_tail
            ]

        tails = [
            run
            for run in ctx.once(("long tails", min_tail), long_tails)
            if ctx.window.overlaps(run.end_time, run.job_end)
        ]
        usage = gpu_usage(
            ctx.con,
            [
                {
                    "key": r.run_id,
                    "cluster": r.cluster,
                    "job_id": r.job_id,
                    "gpus": ctx.facts.job(r.cluster, r.job_id).gpus,
                    "hosts": ctx.facts.job(r.cluster, r.job_id).hosts,
                    "start": r.end_time,
                    "end": r.job_end,
                }
                for r in tails
            ],
        )
        for run in tails:
            use = usage[run.run_id]
            if use.status != "ok":
                ctx.note(f"job {run.job_id}, in the tail after run {run.name!r}: {use.why}")
                continue
            if use.mean_util > t["max_util_pct"]:
                continue
            hours = hours_between(run.end_time, run.job_end)
            gpus = ctx.facts.job(run.cluster, run.job_id).gpus
            gpu_hours = gpus * hours
            yield self.finding(
                subject={
                    "cluster": run.cluster,
                    "job_id": run.job_id,
                    "run_id": run.run_id,
                    "run_name": run.name,
                },
                message=(
                    f"job {run.job_id} held {gpus} GPUs at {use.mean_util:.1f} % for {hours * 60:.0f} min "
                    f"after run {run.name!r} ended (threshold {t['min_tail_minutes']:g} min at ≤ {t['max_util_pct']:g} %)"
                ),
                evidence={
                    "run_ended": run.end_time,
                    "job_ended": run.job_end,
                    "mean_util_pct_in_tail": round(use.mean_util, 2),
                    "usage_source": use.label,
                    "samples": use.samples,
                    "resolution": use.resolution,
                    "formula": f"{gpus} GPUs × {hours:.2f} h = {run.cost.formula(gpu_hours)}",
                },
                cost=Waste(gpu_hours, gpu_hours * run.cost.price),
                owner=run,
                happened_at=run.end_time,
            )
