from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Waste

from ._usage import ABANDONED_UTIL, SHORT_JOB, allocation_finding, describe, judged, priced
from .families import IdleCapacity


class IdleAllocation(IdleCapacity, Rule):
    """A GPU allocation stayed at ~0 % for its whole life (an abandoned interactive job).

    What it detects:
    GPU jobs (and runs outside Slurm with GPU system metrics) at least `min_job_minutes`
    long whose GPUs all stayed at or below `max_util_pct` from start to end: every GPU's
    mean from telemetry, tracker system metrics or jobstats, or sacct's maximum over all
    the job's tasks (a maximum of 0 % proves no task ever used its GPUs).

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
    Princeton Research Computing, Job Defense Shield: "GPU-hours at 0 % utilization"
    (`min_run_time: 30` minutes in its example) and "cancel 0 % GPU jobs" alerts.
    """

    code = "IDL002"
    name = "idle-allocation"
    severity = Severity.HIGH
    reads_shared = frozenset({"facts", "usage"})
    thresholds = {
        "max_util_pct": ABANDONED_UTIL,
        "min_job_minutes": SHORT_JOB,
    }
    recommendation = "Cancel idle sessions; give interactive partitions short time limits."

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        for alloc, use in judged(ctx, t["min_job_minutes"]):
            if use.util_ceiling > t["max_util_pct"]:
                continue
            hours = alloc.hours
            gpu_hours = alloc.gpus * hours
            usd, money = priced(alloc, gpu_hours)
            if use.per_gpu is not None:
                level = f"at {use.mean_util:.1f} % mean utilisation"
            else:
                memory = (
                    f" and {use.peak_mem_mib:,.0f} MiB of GPU memory"
                    if use.peak_mem_mib is not None
                    else ""
                )
                level = (
                    f"with no task above {use.util_ceiling:g} % utilisation{memory} "
                    f"({use.source} maximum)"
                )
            yield allocation_finding(
                self,
                alloc,
                use,
                f"{describe(alloc)} held {alloc.gpus} GPUs for {hours:.1f} h {level} "
                f"(threshold ≤ {t['max_util_pct']:g} %)",
                f"{alloc.gpus} GPUs × {hours:.2f} h = {money}",
                Waste(gpu_hours, usd),
            )
