"""Scan summaries: waste per family, cost and waste per team and training method."""

from __future__ import annotations

from collections import defaultdict

from audit.config import Config
from audit.costs import shared_facts
from audit.rule_registry import families
from audit.scans import ScanResult


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
    items = facts.spend(result.window)
    by_team: dict[str, dict] = defaultdict(_bucket)
    by_method: dict[str, dict] = defaultdict(_bucket)
    for item in items:
        for bucket, key in ((by_team, item["team"]), (by_method, item["method"])):
            bucket[key or "unknown"]["gpu_hours"] += item["gpu_hours"] or 0.0
            bucket[key or "unknown"]["usd"] += item["usd"] or 0.0
    for f in active:
        for bucket, key in ((by_team, f.team), (by_method, f.method)):
            bucket[key or "unknown"]["waste_gpu_hours"] += f.gpu_hours or 0.0
            bucket[key or "unknown"]["waste_usd"] += f.usd or 0.0
    eval_methods = set(config.values["attribution"]["eval_methods"])
    evaluations = [i for i in items if i["method"] in eval_methods]
    duplicates = [f for f in active if f.rule == "EVL001"]
    statuses = {r.rule: r.status for r in result.results}
    unpriced = [i for i in items if i["gpu_hours"] is None]
    return {
        "findings": len(active),
        "suppressed": sum(1 for f in result.findings if f.suppressed),
        "by_severity": {
            s: sum(1 for f in active if f.severity.label == s)
            for s in ("critical", "high", "medium", "low", "info")
        },
        "waste": _waste(active),
        "spend": {
            "runs": sum(1 for i in items if i["has_run"]),
            "jobs_without_run": sum(1 for i in items if not i["has_run"]),
            "gpu_hours": round(sum(i["gpu_hours"] or 0 for i in items), 3),
            "usd": round(sum(i["usd"] or 0 for i in items), 2),
            "runs_without_cost": len(unpriced),
            "run_hours_without_cost": round(sum(i["run_hours"] or 0 for i in unpriced), 3),
            "note": "GPU jobs and runs outside Slurm; idle hosts outside any job are waste on top of this",
        },
        "evaluation": {
            "runs": len(evaluations),
            "gpu_hours": round(sum(i["gpu_hours"] or 0 for i in evaluations), 3),
            "usd": round(sum(i["usd"] or 0 for i in evaluations), 2),
            "runs_without_cost": sum(1 for i in evaluations if i["gpu_hours"] is None),
            "duplicate_gpu_hours": round(sum(f.gpu_hours or 0 for f in duplicates), 3),
            "duplicate_usd": round(sum(f.usd or 0 for f in duplicates), 2),
            "note": "spend of evaluation runs ([attribution] eval_methods); duplicates are EVL001 findings",
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
