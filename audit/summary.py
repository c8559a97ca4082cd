"""Scan summaries: the headline figures, the actions, waste per family, team and method.

The headline compares like with like (``headline``): the waste *in* the window's GPU spend
(findings about jobs and runs) over that spend; the capacity paid for outside every job
(idle hosts) as its own figure; storage apart (GB and $ per month, not GPU spend). Each
figure carries its formula, recomputable from the findings' JSON.
"""

from __future__ import annotations

from collections import defaultdict

from audit.config import Config
from audit.costs import Facts, shared_facts
from audit.facts.evaluations import shared_evaluation_runs
from audit.materiality import summed_lines
from audit.rule_api import Finding
from audit.rule_registry import all_rules, families
from audit.scans import ScanResult
from audit.text import counted

ACTIONS = 10  # the ranked actions a report leads with


def summarise(result: ScanResult, con, config: Config, shared: dict | None = None) -> dict:
    """Headline figures of a scan; ``shared`` carries facts computed once per scan/report.

    Findings whose cost is unknown are counted apart (with their run-hours), never as zero.
    """
    active = result.active
    labels = families()
    for f in active:  # a stored scan may hold a family whose plug-in is gone
        labels.setdefault(f.family, f.family)
    family_rows = []
    for prefix, label in sorted(labels.items()):
        items = [f for f in active if f.family == prefix]
        family_rows.append({"family": prefix, "label": label, **_waste(items)})
    facts = shared_facts(con, config, shared)
    spent = facts.spend(result.window)
    by_team: dict[str, dict] = defaultdict(_bucket)
    by_method: dict[str, dict] = defaultdict(_bucket)
    for bucket, keys in ((by_team, spent.team), (by_method, spent.method)):
        for key, gpu_hours, usd in zip(keys, spent.gpu_hours, spent.usd, strict=True):
            sums = bucket[key or "unknown"]
            sums["gpu_hours"] += gpu_hours or 0.0
            sums["usd"] += usd or 0.0
    for f in active:
        for bucket, key in ((by_team, f.team), (by_method, f.method)):
            bucket[key or "unknown"]["waste_gpu_hours"] += f.gpu_hours or 0.0
            bucket[key or "unknown"]["waste_usd"] += f.usd or 0.0
    evaluates = shared_evaluation_runs(con, config, facts, shared).is_evaluation_run
    evaluations = [i for i, run in enumerate(spent.run) if run is not None and evaluates(run)]
    duplicates = [f for f in active if f.rule == "EVL001"]
    statuses = {r.rule: r.status for r in result.results}
    unpriced = [i for i, gpu_hours in enumerate(spent.gpu_hours) if gpu_hours is None]
    gpu_hours, usd = spent.gpu_hours, spent.usd
    spend = {
        "runs": sum(spent.has_run),
        "jobs_without_run": len(spent) - sum(spent.has_run),
        "gpu_hours": round(sum(h or 0 for h in gpu_hours), 3),
        "usd": round(sum(d or 0 for d in usd), 2),
        "runs_without_cost": len(unpriced),
        "run_hours_without_cost": round(sum(spent.run_hours[i] or 0 for i in unpriced), 3),
        "gpu_hours_at_fallback_price": round(
            sum(
                h or 0
                for h, fallback in zip(gpu_hours, spent.fallback_price, strict=True)
                if fallback
            ),
            3,
        ),
        "note": "GPU jobs and runs outside Slurm started in the window",
    }
    listed = [f for f in active if f.material]
    return {
        "findings": len(active),
        "listed": len(listed),
        "immaterial": [line.as_json() for line in summed_lines(active)],
        "headline": headline(active, spend),
        "actions": actions(listed, facts),
        "suppressed": sum(1 for f in result.findings if f.suppressed),
        "by_severity": {
            s: sum(1 for f in active if f.severity.label == s)
            for s in ("critical", "high", "medium", "low", "info")
        },
        "waste": _waste(active),
        "spend": spend,
        "evaluation": {
            "runs": len(evaluations),
            "gpu_hours": round(sum(gpu_hours[i] or 0 for i in evaluations), 3),
            "usd": round(sum(usd[i] or 0 for i in evaluations), 2),
            "runs_without_cost": sum(1 for i in evaluations if gpu_hours[i] is None),
            "duplicate_gpu_hours": round(sum(f.gpu_hours or 0 for f in duplicates), 3),
            "duplicate_usd": round(sum(f.usd or 0 for f in duplicates), 2),
            "note": "spend of evaluation runs (of [attribution] eval_methods, tagged audit.kind=evaluation, or with lm-eval results); duplicates are EVL001 findings",
        },
        "families": family_rows,
        "by_team": {k: {n: round(x, 2) for n, x in v.items()} for k, v in sorted(by_team.items())},
        "by_method": {
            k: {n: round(x, 2) for n, x in v.items()} for k, v in sorted(by_method.items())
        },
        "rules": {
            "ok": sum(1 for s in statuses.values() if s == "ok"),
            "skipped": sum(1 for s in statuses.values() if s == "skipped"),
            "error": sum(1 for s in statuses.values() if s == "error"),
        },
    }


def scope_of(finding: Finding) -> str:
    """The headline figure a finding's waste belongs to (``Rule.waste_scope``)."""
    rule = all_rules().get(finding.rule)
    return getattr(rule, "waste_scope", "spend")


def headline(findings: list[Finding], spend: dict) -> dict:
    """The headline figures, each from one population, with its formula."""
    by_scope: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_scope[scope_of(f)].append(f)
    inside, capacity, storage = by_scope["spend"], by_scope["capacity"], by_scope["storage"]
    # sums of each finding's dollars as its JSON gives them (to the cent): a reader adding
    # up the findings gets the headline exactly
    wasted = round(sum(_cents(f.usd) for f in inside), 2)
    wasted_hours = round(sum(f.gpu_hours or 0 for f in inside), 3)
    spent = spend["usd"]
    share = round(100 * wasted / spent, 1) if spent else None
    unknown = [f for f in findings if f.gpu_hours is None]
    population = (
        f"{spend['jobs_without_run'] + spend['runs']} jobs and runs outside Slurm "
        "started in the window"
    )
    idle_hours = round(sum(f.gpu_hours or 0 for f in capacity), 3)
    idle_usd = round(sum(_cents(f.usd) for f in capacity), 2)
    gb = sum(f.bytes for f in storage) / 1e9
    monthly = round(sum(_cents(f.usd) for f in storage), 2)
    return {
        "spent": {
            "usd": spent,
            "gpu_hours": spend["gpu_hours"],
            "formula": f"Σ GPUs × hours × price over the {population} = ${spent:,.2f}",
        },
        "wasted": {
            "usd": wasted,
            "gpu_hours": wasted_hours,
            "findings": len(inside),
            "share_pct": share,
            "formula": (
                f"Σ waste of the {counted(len(inside), 'finding')} about those jobs and runs = "
                f"${wasted:,.2f}"
                + (f"; ${wasted:,.2f} / ${spent:,.2f} spent = {share} %" if spent else "")
            ),
        },
        "unallocated_capacity": {
            "usd": idle_usd,
            "gpu_hours": idle_hours,
            "findings": len(capacity),
            "formula": (
                f"Σ idle GPU-hours of {counted(len(capacity), 'idle-host finding')} (GPUs at idle with no "
                f"job) = {idle_hours:,.2f} GPU-h, ${idle_usd:,.2f}; paid for outside every "
                "job, so not in the spend above"
            ),
        },
        "storage": {
            "gb": round(gb, 1),
            "usd_per_month": monthly,
            "findings": len(storage),
            "formula": (
                f"Σ reclaimable bytes of {counted(len(storage), 'checkpoint finding')} = {gb:,.1f} GB, "
                f"${monthly:,.2f} per month; storage, not GPU spend"
            ),
        },
        "unknown_cost": {
            "findings": len(unknown),
            "run_hours": round(sum(f.run_hours or 0 for f in unknown), 3),
            "formula": "findings whose GPU count no source gives: counted apart, never as $0",
        },
    }


def _cents(usd: float | None) -> float:
    return round(usd, 2) if usd else 0.0


def owner_of(finding: Finding, facts: Facts) -> dict:
    """Who acts on a finding: its team, and the user of its run or job."""
    user = None
    subject = finding.subject
    if subject.get("job_id"):
        job_id = str(subject["job_id"])
        # a job's subject names its cluster: a lookup, not an index of every job by id
        # (3.3 s at a million jobs for the ten ranked actions)
        job = (
            facts.job(str(subject["cluster"]), job_id)
            if subject.get("cluster")
            else next(iter(facts.jobs_by_id(job_id)), None)
        )
        user = job.user_name if job else None
    if user is None and subject.get("run_id"):
        run = facts.run_by_id(str(subject["run_id"]))
        user = run.user_id if run else None
    return {"team": finding.team, "user": user}


def actions(findings: list[Finding], facts: Facts, count: int = ACTIONS) -> list[dict]:
    """What to do first: the listed findings by dollars, then GPU-hours, then run-hours
    wasted; among those without a waste figure, the more severe first, then the GPU-hours
    at risk (a queue wait's are a management cost: they rank no info finding above a
    high-severity one whose cost is unknown)."""
    ranked = sorted(
        findings,
        key=lambda f: (
            -(f.usd or 0.0),
            -(f.gpu_hours or 0.0),
            -(f.run_hours or 0.0),
            -int(f.severity),
            -(f.risk_gpu_hours or 0.0),
            f.rule,
            f.id,
        ),
    )
    return [
        {
            "id": f.id,
            "rule": f.rule,
            "severity": f.severity.label,
            "owner": owner_of(f, facts),
            "action": f.recommendation.splitlines()[0] if f.recommendation else "",
            "impact": f.impact_text,
            "finding": f.message,
        }
        for f in ranked[:count]
    ]


def _bucket() -> dict:
    return {"gpu_hours": 0.0, "usd": 0.0, "waste_gpu_hours": 0.0, "waste_usd": 0.0}


def _waste(findings) -> dict:
    """Known waste summed; findings with an unknown cost counted apart with their run-hours."""
    unknown = [f for f in findings if f.gpu_hours is None]
    return {
        "findings": len(findings),
        "gpu_hours": round(sum(f.gpu_hours or 0 for f in findings), 3),
        "usd": round(sum(f.usd or 0 for f in findings), 2),
        "bytes": int(sum(f.bytes for f in findings)),
        "unknown_cost": len(unknown),
        "unknown_cost_run_hours": round(sum(f.run_hours or 0 for f in unknown), 3),
    }
