from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Threshold
from audit.rule_registry import effective_thresholds, get_rule

from ._usage import ABANDONED_UTIL, allocation_finding, cards_seen, judged, smaller_card
from .families import OverProvisioning

MIB_PER_GB = 1e9 / 2**20


class GpuTooLarge(OverProvisioning, Rule):
    """The job used a small part of the GPU's memory at low utilisation: a smaller card would do.

    What it detects:
    GPU jobs (and runs outside Slurm with GPU system metrics) at least `min_job_minutes`
    long whose peak GPU memory stayed small — below `max_memory_pct` of the card's capacity
    when the capacity is known (telemetry), else below `max_memory_gb` (sacct's
    `gres/gpumem` has no capacity) — while mean utilisation stayed at or below
    `max_mean_util_pct` (from sacct: the maximum any task reported, an upper bound).

    Why it is waste:
    An 80 GB H100 costs several times a 24 GB card; a job that needs neither its memory
    nor its compute pays for capacity it cannot use. A job whose GPUs were all busy at a
    low utilisation is OVP002's, which prices the cheapest card or share that would have
    served it; this rule names the memory of the other jobs (some GPU idle, which OVP001
    prices) as a hint, with the cheaper option when one fits, and claims nothing (no GPU's
    hours are claimed twice).

    Known false positives:
    Jobs that need the faster interconnect or the newer instruction set, and short
    memory peaks between samples.

    Example:
    An evaluation job peaked at 9 GB of 80 GB at 10 % utilisation for 3 h.

    How to fix:
    Submit to a partition with smaller GPUs or MIG slices.

    References:
    Princeton Research Computing, Job Defense Shield: "GPU model too powerful" alert
    (`gpu_util_threshold: 15` %, `gpu_mem_threshold: 10` GB, `min_run_time: 61` minutes).
    """

    code = "OVP003"
    name = "gpu-too-large"
    severity = Severity.INFO
    reads_shared = frozenset({"facts", "usage", "cards seen"})
    thresholds = {
        "max_memory_pct": Threshold.percent(
            25.0, "peak memory below this share of capacity (when known)"
        ),
        "max_memory_gb": Threshold(
            10.0, "peak memory below this when the capacity is unknown (JDS: 10 GB)", 0, unit="GB"
        ),
        "max_mean_util_pct": Threshold.percent(
            15.0, "mean utilisation at or below this (JDS: 15 %)"
        ),
        "min_job_minutes": Threshold(
            60.0, "shorter jobs are not judged (JDS: 61 min)", 0, unit="min"
        ),
        "idle_util_pct": ABANDONED_UTIL,
    }
    recommendation = "Use a smaller GPU type or a MIG slice for this workload."

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        cards_seen(ctx)  # the smaller cards any job here could have had (read once)
        low = effective_thresholds(get_rule("OVP002"), ctx.config)
        for alloc, use in judged(ctx, t["min_job_minutes"]):
            util = use.mean_util if use.mean_util is not None else use.util_ceiling
            if _low_utilisation(alloc, use, util, low):
                continue  # OVP002 prices the same smaller card
            peak, capacity = use.peak_mem_mib, use.mem_total_mib
            if peak is None:
                ctx.note(f"{alloc.label}: the {use.label} record no GPU memory figure")
                continue
            if util > t["max_mean_util_pct"] or util <= t["idle_util_pct"]:
                continue
            if capacity:
                share = peak / capacity * 100
                if share >= t["max_memory_pct"]:
                    continue
                memory = (
                    f"peaked at {peak / 1024:.1f} GiB of {capacity / 1024:.0f} GiB "
                    f"({share:.0f} %, threshold {t['max_memory_pct']:g} %)"
                )
            else:
                if peak / MIB_PER_GB >= t["max_memory_gb"]:
                    continue
                memory = (
                    f"peaked at {peak / MIB_PER_GB:.1f} GB of GPU memory "
                    f"(threshold {t['max_memory_gb']:g} GB; capacity unknown)"
                )
            kind = "mean" if use.mean_util is not None else "maximum"
            saving = smaller_card(ctx, alloc, use, util)
            formula, instead = "hint only: no cheaper card would have served it", ""
            if saving is not None:
                _worth, _usd, text, fit = saving
                formula = f"hint only, not claimed (OVP001 prices the idle GPUs): {text}"
                instead = f"; {fit.label} would have served it"
            yield allocation_finding(
                self,
                alloc,
                use,
                f"{alloc.label} {memory} at {util:.0f} % {kind} utilisation "
                f"(threshold {t['max_mean_util_pct']:g} %){instead}",
                formula,
                details={
                    "peak_memory_mib": round(peak, 1),
                    "capacity_mib": capacity,
                    "model": use.model or alloc.cost.gpu_type,
                },
            )


def _low_utilisation(alloc, use, util: float, low: dict) -> bool:
    """Whether OVP002 flags (and prices) this allocation: every GPU busy, low utilisation."""
    if util > low["max_mean_util_pct"]:
        return False
    if use.per_gpu is not None:
        return len(use.busy(low["idle_util_pct"])) == len(use.per_gpu)
    return use.util_ceiling > low["idle_util_pct"]
