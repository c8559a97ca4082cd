"""The allocations the utilisation rules judge (shared by OVP001-003 and IDL002)."""

from __future__ import annotations

from audit.costs import money
from audit.rule_api import RuleContext, Skip
from audit.usage import Allocation, Usage


def judged(ctx: RuleContext, min_minutes: float) -> list[tuple[Allocation, Usage]]:
    """(allocation, usage) pairs of the window with usage evidence; the rest become notes.

    Raises Skip when nothing can be judged at all, naming what to import.
    """
    allocations = ctx.usage.allocations()
    if not allocations:
        raise Skip("no Slurm GPU jobs and no runs with GPU system metrics imported")
    if not ctx.usage.has_evidence():
        raise Skip(
            "no GPU usage evidence: no GPU telemetry (audit ingest gpu), no tracker system "
            "metrics, no sacct TRESUsageInMax gres/gpuutil and no jobstats summaries"
        )
    return ctx.usage.judged(ctx.window, min_minutes / 60, ctx.notes)


def priced(alloc: Allocation, gpu_hours: float) -> tuple[float, str]:
    """Dollars and the formula for ``gpu_hours`` of this allocation's GPUs."""
    return gpu_hours * alloc.cost.price, money(gpu_hours, alloc.cost.price, alloc.cost.price_key)


def describe(alloc: Allocation) -> str:
    name = f" ({alloc.name})" if alloc.kind == "job" and alloc.name else ""
    return f"{alloc.label}{name}"


def evidence(alloc: Allocation, use: Usage, **extra) -> dict:
    out = {**use.evidence(), "cost_basis": alloc.cost.basis, **extra}
    if alloc.user:
        out["user"] = alloc.user
    return out
