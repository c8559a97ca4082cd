"""The allocations the utilisation rules judge (shared by OVP001-003 and IDL002)."""

from __future__ import annotations

from audit.facts.cost_basis import money
from audit.facts.prices import card_of, cheapest_fit
from audit.rule_api import Finding, Rule, RuleContext, Skip, Threshold, Waste
from audit.usage import Allocation, Usage

# Thresholds several rules share, each one setting per rule ([rules.CODE]) with one meaning.
# The idle line: what OVP001 calls not in use, IDL001 an idle tail, IDL003 an idle host,
# and OVP002 leaves to OVP001 and IDL002
IDLE_UTIL = Threshold.percent(5.0, "a GPU at or under this mean utilisation is idle")
# An abandoned allocation: IDL002's, which OVP003 leaves to it
ABANDONED_UTIL = Threshold.percent(
    1.0, "every GPU at or under this utilisation from start to end: an abandoned allocation"
)
SHORT_JOB = Threshold(30.0, "shorter jobs are not judged (JDS: 30 min)", 0, unit="min")


def judged(ctx: RuleContext, min_minutes: float) -> list[tuple[Allocation, Usage]]:
    """(allocation, usage) pairs of the window with usage evidence; the rest become notes.

    Raises Skip when nothing can be judged at all, naming what to import.
    """
    if not ctx.usage.has_allocations():
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


def allocation_finding(
    rule: Rule,
    alloc: Allocation,
    use: Usage,
    message: str,
    formula: str,
    cost: Waste | None = None,
    details: dict | None = None,
    **fields,
) -> Finding:
    """A finding about an allocation judged by its usage: the allocation as its subject and
    owner, its usage (and ``details``) with ``formula`` as evidence, at its start."""
    fields.setdefault("happened_at", alloc.start)
    found = evidence(alloc, use, **(details or {}), formula=formula)
    return rule.finding(alloc.subject, message, found, cost, owner=alloc, **fields)


def cards_seen(ctx: RuleContext) -> frozenset[str]:
    """The catalogue cards the warehouse has seen (jobs' GPU types, telemetry's models):
    the smaller cards a job could have had on these clusters."""

    def load() -> frozenset[str]:
        names = [
            name
            for (name,) in ctx.con.execute(
                "SELECT DISTINCT gpu_type FROM jobs WHERE gpu_type IS NOT NULL "
                "UNION SELECT DISTINCT model FROM gpu_samples WHERE model IS NOT NULL"
            ).fetchall()
        ]
        return frozenset(card.key for card in map(card_of, names) if card is not None)

    return ctx.once(("cards seen",), load)


def smaller_card(ctx: RuleContext, alloc: Allocation, use: Usage, util: float):
    """(GPU-hours' worth, dollars, formula, fit) saved had each of the allocation's GPUs
    been the cheapest card or card share that would have served it (``cheapest_fit``);
    None when nothing cheaper fits or the memory peak is unknown."""
    if use.peak_mem_mib is None:
        return None
    model = use.model or alloc.cost.gpu_type
    current = card_of(model)
    price = alloc.cost.price
    fit = cheapest_fit(
        ctx.prices,
        current,
        price,
        use.peak_mem_mib,
        util,
        use.mem_total_mib or None,
        cards_seen(ctx),
    )
    if fit is None or price <= 0:
        return None
    hours = alloc.hours
    usd = alloc.gpus * hours * (price - fit.usd)
    worth = usd / price  # the current card's GPU-hours that bought nothing
    formula = (
        f"{alloc.gpus} GPU{'s' if alloc.gpus != 1 else ''} × {hours:.2f} h × (${price:.2f} − "
        f"${fit.usd:.3f} for {fit.label}) "
        f"/GPU-h = ${usd:,.2f} ({worth:.2f} GPU-h of the {current.key if current else model}; "
        f"{fit.why})"
    )
    return worth, usd, formula, fit
