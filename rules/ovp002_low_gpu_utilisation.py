from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Threshold, Waste
from audit.usage import Unjudged

from ._usage import IDLE_UTIL, SHORT_JOB, allocation_finding, cards_seen, judged, smaller_card
from .families import OverProvisioning


class LowGpuUtilisation(OverProvisioning, Rule):
    """Every allocated GPU worked, but far below capacity for a long job.

    What it detects:
    GPU jobs (and runs outside Slurm with GPU system metrics) at least `min_job_minutes`
    long whose mean utilisation over their life stayed at or below `max_mean_util_pct`,
    with no GPU idle (that case is OVP001). From per-GPU evidence (telemetry, tracker
    system metrics, jobstats) the mean is measured; from sacct only the largest value any
    task reported is known, which is an upper bound of the mean: a job whose maximum is
    at or below the threshold is flagged, one above it cannot be judged (a note).

    Why it is waste:
    The allocation was paid in full while most of its compute sat unused, typically
    behind a data-loading or CPU bottleneck. The saving is priced as what it is: the
    difference to the cheapest card, or share of the same card (MIG, MPS, time-slicing),
    that would have served each GPU by its memory peak (with 20 % headroom) and its
    utilisation scaled to that card's throughput (at most 80 %):
    Waste = GPUs × hours × (price − the cheaper option's price); the figure in GPU-hours is
    that amount in the job's own card's hours. From a sacct maximum the utilisation is an
    upper bound, so the saving is a lower bound. When nothing cheaper would have served
    it, the finding is a hint without a figure.

    Known false positives:
    Memory-bound workloads (long-context inference, large-batch evaluation) and jobs
    dominated by checkpoint I/O.

    Example:
    A 4-GPU SFT job ran 10 h at 18 % mean utilisation: 40 GPU-h × 82 % = 32.8 GPU-h.

    How to fix:
    Profile the input pipeline (more dataloader workers, pre-tokenised data, pinned
    memory), raise the batch size, or use fewer GPUs.

    References:
    Princeton Research Computing, Job Defense Shield: "low GPU efficiency" alert
    (`eff_thres_pct: 25`, `min_run_time: 30` minutes); jobstats.
    """

    code = "OVP002"
    name = "low-gpu-utilisation"
    severity = Severity.MEDIUM
    reads_shared = frozenset({"facts", "usage", "cards seen"})
    thresholds = {
        "max_mean_util_pct": Threshold.percent(
            25.0, "flag jobs at or below this mean utilisation (JDS: 25 %)"
        ),
        "idle_util_pct": IDLE_UTIL,
        "min_job_minutes": SHORT_JOB,
    }
    recommendation = "Find the bottleneck (input pipeline, batch size) or request fewer GPUs."

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        cards_seen(ctx)  # the smaller cards any job here could have had (read once)
        limit, idle = t["max_mean_util_pct"], t["idle_util_pct"]
        unjudged = Unjudged()
        for alloc, use in judged(ctx, t["min_job_minutes"]):
            hours = alloc.hours
            if use.per_gpu is not None:
                if len(use.busy(idle)) < len(use.per_gpu) or use.mean_util > limit:
                    continue
                util, how = use.mean_util, f"averaged {use.mean_util:.1f} %"
            else:
                if use.util_ceiling <= idle:
                    continue  # never above idle: an abandoned allocation (IDL002)
                if use.util_ceiling > limit:
                    unjudged.add(
                        f"the {use.label} show a peak above {limit:g} %; whether the mean was "
                        f"≤ {limit:g} % needs time-averaged data (telemetry or jobstats)",
                        alloc,
                        use,
                        f"{alloc.label}: the {use.label} show up to {use.util_ceiling:g} %; "
                        f"whether the mean was ≤ {limit:g} % needs time-averaged data "
                        "(telemetry or jobstats)",
                    )
                    continue
                util, how = use.util_ceiling, f"never exceeded {use.util_ceiling:.1f} %"
            saving = smaller_card(ctx, alloc, use, util)
            if saving is None:
                gpu_hours, usd, severity = 0.0, 0.0, Severity.INFO
                formula = (
                    "no cheaper card or share of this card would have held its memory peak "
                    "at a utilisation under 80 %: find the bottleneck; no waste is claimed"
                    if use.peak_mem_mib is not None
                    else "no GPU memory figure: the cheaper card cannot be told; no waste claimed"
                )
                instead = ""
            else:
                gpu_hours, usd, formula, fit = saving
                severity = self.severity
                instead = f"; {fit.label} would have served it"
                if use.per_gpu is None:
                    formula += (
                        "; from the maximum utilisation (an upper bound of the mean): the "
                        "saving is a lower bound"
                    )
            yield allocation_finding(
                self,
                alloc,
                use,
                f"{alloc.label} {how} GPU utilisation over {hours:.1f} h on "
                f"{alloc.gpus} GPU{'s' if alloc.gpus != 1 else ''} "
                f"(threshold {limit:g} %){instead}",
                formula,
                Waste(gpu_hours, usd),
                severity=severity,
            )
        ctx.notes.extend(unjudged.notes())
