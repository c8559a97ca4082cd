from __future__ import annotations

from audit.rule_api import Rule, RuleContext, Severity, Waste
from audit.usage import Unjudged

from ._usage import IDLE_UTIL, SHORT_JOB, allocation_finding, judged, priced
from .families import OverProvisioning


class IdleAllocatedGpus(OverProvisioning, Rule):
    """A job held more GPUs than it used: some allocated GPUs stayed idle all along.

    What it detects:
    GPU jobs (at least `min_job_minutes` long) where at least one allocated GPU worked
    (mean utilisation above `busy_util_pct`) and others did not. Needs per-GPU evidence:
    GPU telemetry (nvidia-smi, DCGM, Prometheus), the tracker's system metrics or a
    jobstats summary; sacct's one figure per job cannot tell an idle GPU among busy ones,
    so such jobs get a note, not a finding. Runs outside Slurm with GPU system metrics are
    judged against what they were given: their GPU list, the world size they reported or
    the parallelism they were configured with (`audit.costs`); a tracker's system metrics
    list every GPU of the machine, so a run known only by the GPUs seen working gets a
    note, never a finding (an idle GPU there may be nobody's, or another tenant's).

    Why it is waste:
    The idle GPUs were paid for and blocked other jobs. Waste = idle GPUs × job hours.

    Known false positives:
    Jobs that need the memory of several GPUs but compute on one, or whose work is
    bursty below the sampling interval. Jobs sharing a host with other jobs fall back to
    sacct or jobstats (telemetry cannot be told apart without GPU indices).

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
    reads_shared = frozenset({"facts", "usage"})
    thresholds = {
        "busy_util_pct": IDLE_UTIL,
        "min_job_minutes": SHORT_JOB,
    }
    recommendation = (
        "Request only the GPUs the job uses, or make the training script use all of them."
    )

    def check(self, ctx: RuleContext):
        t = ctx.thresholds
        unjudged = Unjudged()
        for alloc, use in judged(ctx, t["min_job_minutes"]):
            if alloc.kind == "run" and not alloc.cost.is_allocation and use.chosen_from:
                unjudged.add(
                    "only host-wide GPU samples (tracker system metrics list every GPU of the "
                    "machine) and no allocation recorded: an idle GPU there is not known to "
                    "be the run's",
                    alloc,
                    use,
                    f"{alloc.label}: only host-wide GPU samples and no recorded allocation "
                    "(no GPU list, world size or parallelism param): unused GPUs cannot be "
                    "told from another tenant's",
                )
                continue
            if alloc.gpus < 2:
                continue  # one GPU is either busy (fine) or idle (IDL002)
            if use.per_gpu is None:
                unjudged.add(
                    f"the {use.label} give one figure for all of their GPUs: an idle GPU "
                    "among busy ones needs per-GPU data",
                    alloc,
                    use,
                    f"{alloc.label}: {alloc.gpus} GPUs, but the {use.label} give one "
                    "figure for all of them: an idle GPU among busy ones needs per-GPU data",
                )
                continue
            busy = use.busy(t["busy_util_pct"])
            idle = [g for g in use.per_gpu if g not in busy]
            if not busy or not idle:
                continue  # all idle is IDL002's abandoned allocation; all busy is fine
            hours = alloc.hours
            gpu_hours = len(idle) * hours
            usd, money = priced(alloc, gpu_hours)
            yield allocation_finding(
                self,
                alloc,
                use,
                f"{alloc.label} used {len(busy)} of {alloc.gpus} allocated GPUs for {hours:.1f} h: "
                f"{len(idle)} GPUs averaged {max(g.util for g in idle):.1f} % or less "
                f"(idle threshold {t['busy_util_pct']:g} %)",
                f"{len(idle)} idle GPUs × {hours:.2f} h = {money}",
                Waste(gpu_hours, usd),
                # never fewer GPUs than it used: the busy ones are what it needs
                recommendation=(
                    f"Request {len(busy)} GPU{'s' if len(busy) > 1 else ''} (the {'ones' if len(busy) > 1 else 'one'} it used) "
                    f"instead of {alloc.gpus}, or make the training script use all {alloc.gpus}."
                ),
            )
        ctx.notes.extend(unjudged.notes())
